"""Values returned by get view the store's memory: no copy in this or any other process."""

import gc
import multiprocessing

import numpy as np
import pytest

import depot
from children import read_shared_array
from conftest import address_of, in_store, memory_kib


def test_array_views_a_mapping_of_an_arena_segment(client):
    array = client.get(client.put(np.arange(1_000_000)))
    assert in_store(address_of(array), array.nbytes)
    buffer = client.get_buffer(client.put(np.arange(10)))
    assert in_store(buffer.address, buffer.size)


def test_getting_twice_returns_the_same_memory(client):
    ref = client.put(np.ones(1000))
    assert address_of(client.get(ref)) == address_of(client.get(ref))


def test_bytes_come_back_in_the_store(client):
    view = client.get(client.put(b"z" * 1_000_000))
    address = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    assert in_store(address, len(view))


def test_arrays_nested_in_pickled_objects_view_the_store(client):
    value = {"a": np.arange(100_000), "b": [np.ones((100, 100))]}
    got = client.get(client.put(value))
    for array in (got["a"], got["b"][0]):
        assert in_store(address_of(array), array.nbytes)
        assert address_of(array) % 64 == 0


def _available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def test_large_array_is_not_copied_on_get():
    """1 GiB when the machine has room for it three times over; else 256 MiB (noted)."""
    size = 1 << 30 if _available_bytes() > 6 << 30 else 256 << 20
    if size != 1 << 30:
        print(f"not enough memory for 1 GiB: testing with {size >> 20} MiB")
    with depot.start_daemon(memory=size + (64 << 20), segment_size=size + (64 << 20)) as d:
        with d.client() as client:
            ref = client.put(np.ones(size // 8))
            gc.collect()  # the source array is gone: only the store's copy remains
            anon_before = memory_kib("RssAnon")
            array = client.get(ref)
            assert array.nbytes == size
            assert float(array[:: 4096 // 8].sum()) == size // 4096  # reads every page
            assert in_store(address_of(array), size)
            growth = (memory_kib("RssAnon") - anon_before) * 1024
            assert growth < 32 << 20, f"private memory grew by {growth >> 20} MiB on get"


def test_spawned_process_reads_the_array_without_copying(client):
    array = np.arange(4_000_000, dtype=np.int64)  # 32 MiB
    ref = client.put(array)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result = pool.apply(read_shared_array, (client.socket, ref))
    assert result["sum"] == int(array.sum())
    assert result["in_store"]
    assert result["anon_growth_kib"] * 1024 < 8 << 20, result
    assert np.array_equal(client.get(result["reply"]), array[:10] * 2)
