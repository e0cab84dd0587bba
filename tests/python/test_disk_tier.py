"""The disk tier (depotd --spill-dir) from Python: objects beyond host memory spill to disk and
come back byte-exact, to host memory and to a (simulated) GPU."""

import numpy as np
import pytest

import depot
from dlpack_util import host_view

MiB = 1 << 20


@pytest.fixture
def spilling(tmp_path):
    with depot.start_daemon(
        memory="64MiB",
        segment_size="16MiB",
        args=["--spill-dir", str(tmp_path / "spill"), "--spill-file-size", "8MiB"],
        simulate_gpus="1:64MiB",
    ) as d:
        yield d


def array(i, size):
    return np.random.default_rng(i).integers(0, 255, size=size, dtype=np.uint8)


def test_four_times_the_arena_comes_back_byte_exact(spilling):
    with spilling.client() as c:
        sizes = [(i, (1 + i % 5) * MiB + 64 * (i % 3)) for i in range(90)]
        assert sum(s for _, s in sizes) >= 4 * 64 * MiB
        refs = [c.put(array(i, s), name=f"spill/{i}") for i, s in sizes]
        disk = c.status().disk
        assert disk.enabled and disk.spills > 0 and disk.objects > 0
        assert any(o.on_disk for o in c.list())
        for (i, s), ref in zip(sizes, refs):
            got = c.get(ref)
            assert got.shape == (s,) and not got.flags.writeable
            assert np.array_equal(got, array(i, s)), i
            del got
        status = c.status()
        assert status.disk.restores > 0
        assert status.disk.drops == 0 and status.evictions == 0


def test_small_objects_spill_and_come_back_many_to_a_disk_write_and_read(spilling):
    with spilling.client() as c:
        sizes = [(i, 64 * 1024 - 8 * (i % 7)) for i in range(3000)]  # three times the arena
        refs = [c.put(array(i, s)) for i, s in sizes]
        # The oldest, in gets of 100 (read in runs), then one by one (through read windows).
        for start in range(0, 1000, 100):
            got = c.get_many(refs[start:start + 100])
            for (i, s), g in zip(sizes[start:start + 100], got):
                assert np.array_equal(g, array(i, s)), i
            del got
        for (i, s), ref in zip(sizes[1000:2000], refs[1000:2000]):
            assert np.array_equal(c.get(ref), array(i, s)), i
        disk = c.status().disk
        assert disk.restores > 1000 and disk.restore_failures == 0, disk
        if disk.direct_io:
            assert disk.writes * 8 < disk.spills, disk
            assert disk.reads * 4 < disk.restores, disk
        else:
            assert disk.writes == disk.spills and disk.reads == disk.restores, disk


def test_a_spilled_object_restores_onto_a_gpu(spilling):
    with spilling.client() as c:
        first = c.put(array(1, 8 * MiB), name="spill/gpu")
        for i in range(10):
            c.put(array(100 + i, 8 * MiB))
        assert next(o for o in c.list() if o.name == "spill/gpu").on_disk
        on_gpu = c.get(first, device=0)
        assert on_gpu.shape == (8 * MiB,)
        # A simulated GPU's device pointer is a host address: read the copy through it.
        back = host_view(on_gpu.ptr, on_gpu.nbytes, np.uint8, (8 * MiB,))
        assert np.array_equal(back, array(1, 8 * MiB))
        assert c.status().disk.restores >= 1


def test_spill_false_evicts_for_good_instead(spilling):
    with spilling.client() as c:
        cache = c.put(array(7, 4 * MiB), name="spill/cache", spill=False)
        kept = c.put(array(8, 4 * MiB), name="spill/kept")
        for i in range(20):
            c.put(array(200 + i, 4 * MiB))
        with pytest.raises(depot.ObjectNotFound):
            c.get(cache, timeout=0)
        assert np.array_equal(c.get(kept), array(8, 4 * MiB))
        assert c.status().evictions == 1
