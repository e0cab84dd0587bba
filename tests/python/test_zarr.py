"""depot.zarr.Store: Zarr's own store tests (zarr.testing.store.StoreTests) on a real
daemon, then what depot adds: reads that view the store, keys pinned against eviction,
replacing a key a reader still views, other processes, and bad input."""

import gc
import multiprocessing
import pickle

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
from zarr.core.buffer import cpu, default_buffer_prototype  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

import depot  # noqa: E402
import depot.zarr  # noqa: E402
from conftest import address_of, in_store, wait_for  # noqa: E402


class TestZarrsStoreBehaviour(StoreTests[depot.zarr.Store, cpu.Buffer]):
    store_cls = depot.zarr.Store
    buffer_cls = cpu.Buffer

    @pytest.fixture
    def store_kwargs(self, daemon):
        return {"prefix": "tests/zarr", "socket": daemon.socket}

    async def set(self, store, key, value):
        with depot.Client(store.socket) as c:
            c.put(value.to_bytes(), name=f"{store.prefix}/{key}", pin=True)

    async def get(self, store, key):
        # The key's object, or the value its pointer names (the layout of depot/zarr.py).
        with depot.Client(store.socket) as c:
            found = c.get_buffer(f"{store.prefix}/{key}", timeout=0)
            if found.metadata == b"depot-zarr/1 pointer":
                found = c.get_buffer(bytes(found).decode(), timeout=0)
            return cpu.Buffer.from_bytes(bytes(found))

    def test_store_repr(self, store):
        assert repr(store) == f"depot.zarr.Store('tests/zarr', socket={store.socket!r})"

    def test_store_supports_writes(self, store):
        assert store.supports_writes

    def test_store_supports_listing(self, store):
        assert store.supports_listing


@pytest.fixture
def store(daemon):
    return depot.zarr.Store("arrays", socket=daemon.socket)


def test_an_array_written_through_zarr_reads_back_and_each_chunk_is_a_pinned_object(
    store, client
):
    values = np.arange(100 * 60, dtype=np.float64).reshape(100, 60)
    z = zarr.create_array(store, name="a", shape=values.shape, chunks=(25, 30),
                          dtype=values.dtype, compressors=None)
    z[:] = values
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], values)
    objects = {o.name: o for o in client.list()}
    chunks = [n for n in objects if n.startswith("arrays/a/c/")]  # pointers
    values = [n for n in objects if n.startswith("#arrays/a/c/")]
    assert len(chunks) == 8 and len(values) == 8 and "arrays/a/zarr.json" in objects
    assert all(o.pinned for o in objects.values())


def test_a_chunk_is_read_from_the_store_with_no_copy(store, client):
    payload = np.arange(1 << 16, dtype=np.uint8)
    store.set_sync("c/0", cpu.Buffer.from_bytes(payload.tobytes()))
    whole = store.get_sync("c/0", prototype=default_buffer_prototype())
    part = store.get_sync("c/0", prototype=default_buffer_prototype(),
                          byte_range=zarr.abc.store.RangeByteRequest(100, 4196))
    whole_array, part_array = whole.as_numpy_array(), part.as_numpy_array()
    assert in_store(address_of(whole_array), whole_array.nbytes)
    assert address_of(part_array) == address_of(whole_array) + 100
    assert not whole_array.flags.writeable
    np.testing.assert_array_equal(part_array, payload[100:4196])


def test_documents_are_read_as_copies_so_a_reader_never_holds_up_their_next_version(store):
    store.set_sync("g/zarr.json", cpu.Buffer.from_bytes(b'{"zarr_format": 3}'))
    document = store.get_sync("g/zarr.json")
    assert not in_store(address_of(document.as_numpy_array()), len(document))
    store.set_sync("g/zarr.json", cpu.Buffer.from_bytes(b'{"zarr_format": 3, "v": 2}'))
    assert store.get_sync("g/zarr.json").to_bytes() == b'{"zarr_format": 3, "v": 2}'
    assert document.to_bytes() == b'{"zarr_format": 3}'


def test_a_chunk_replaced_while_a_reader_views_it_keeps_the_readers_value(store, client):
    store.set_sync("c/0", cpu.Buffer.from_bytes(b"old!"))
    held = store.get_sync("c/0")
    store.set_sync("c/0", cpu.Buffer.from_bytes(b"new!"))  # no wait for the reader
    assert store.get_sync("c/0").to_bytes() == b"new!"
    assert held.to_bytes() == b"old!"  # the reader's view is intact
    del held
    gc.collect()
    store.set_sync("c/0", cpu.Buffer.from_bytes(b"new again"))
    # The old values went once nobody viewed them: a pointer and one value are left.
    assert wait_for(lambda: len(client.list()) == 2, timeout=10), client.list()


def test_partial_writes_into_uncompressed_chunks_keep_every_element(store):
    # Zarr reads the old chunk (a view of the store) and keeps it while it writes the new one.
    z = zarr.create_array(store, name="p", shape=(100,), chunks=(10,), dtype="f8",
                          compressors=None)
    z[:] = 1.0
    z[0:5] = 2.0
    z[95:] = 3.0
    expected = np.ones(100)
    expected[0:5], expected[95:] = 2.0, 3.0
    np.testing.assert_array_equal(zarr.open_array(store, path="p", mode="r")[:], expected)


def test_a_document_a_raw_reader_holds_is_replaced_once_it_lets_go_or_says_why(daemon):
    store = depot.zarr.Store("r", socket=daemon.socket, replace_timeout=0.05)
    store.set_sync("g/zarr.json", cpu.Buffer.from_bytes(b'{"v": 1}'))
    with depot.Client(daemon.socket) as raw:
        held = raw.get_buffer("r/g/zarr.json")  # not through the store: a view, held
        with pytest.raises(depot.ObjectExists, match="a reader still holds its old value"):
            store.set_sync("g/zarr.json", cpu.Buffer.from_bytes(b'{"v": 2}'))
        assert bytes(held) == b'{"v": 1}'
        del held
        gc.collect()
        patient = depot.zarr.Store("r", socket=daemon.socket, replace_timeout=30)
        patient.set_sync("g/zarr.json", cpu.Buffer.from_bytes(b'{"v": 2}'))
        assert patient.get_sync("g/zarr.json").to_bytes() == b'{"v": 2}'


def test_a_damaged_pointer_is_a_clear_error(store, client):
    ref = depot.ObjectRef.from_name("arrays/c/9")
    writable = client._native.create(ref.id, 2, b"depot-zarr/1 pointer", "arrays/c/9", True)
    memoryview(writable)[:] = b"\xff\xfe"
    client._native.seal(ref.id)
    with pytest.raises(ValueError, match="the pointer of key 'c/9' names no object"):
        store.get_sync("c/9")
    store.delete_sync("c/9")  # deleting it still works
    assert store.get_sync("c/9") is None


def test_set_if_not_exists_keeps_the_first_value(store):
    store.set_sync("k", cpu.Buffer.from_bytes(b"first"))
    zarr.core.sync.sync(store.set_if_not_exists("k", cpu.Buffer.from_bytes(b"second")))
    assert store.get_sync("k").to_bytes() == b"first"


def test_keys_are_never_evicted_a_full_store_says_so(store, client):
    block = cpu.Buffer.from_bytes(bytes(16 << 20))
    stored = 0
    with pytest.raises(depot.StoreFull):
        for i in range(64):  # 1 GiB into a 256 MiB store
            store.set_sync(f"c/{i}", block)
            stored += 1
    assert 8 <= stored < 16
    assert all(client.contains(f"arrays/c/{i}") for i in range(stored))


def test_stores_with_different_prefixes_share_a_daemon_apart(daemon):
    one = depot.zarr.Store("one", socket=daemon.socket)
    two = depot.zarr.Store("one-two", socket=daemon.socket)
    zarr.create_array(one, name="x", shape=(4,), dtype="i4")[:] = 1
    zarr.create_array(two, name="x", shape=(4,), dtype="i4")[:] = 2
    assert one != two
    zarr.core.sync.sync(one.clear())
    assert zarr.core.sync.sync(one.is_empty(""))
    np.testing.assert_array_equal(zarr.open_array(two, path="x", mode="r")[:], [2, 2, 2, 2])


def _read_in_child(store, path, queue):
    queue.put(zarr.open_array(store, path=path, mode="r")[:].sum())


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_another_process_reads_the_array_through_a_pickled_store(store, method):
    z = zarr.create_array(store, name="shared", shape=(1000,), chunks=(100,), dtype="f8")
    z[:] = np.ones(1000)
    assert pickle.loads(pickle.dumps(store)) == store
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(store, "shared", queue))
    child.start()
    assert queue.get(timeout=60) == 1000.0
    child.join(60)
    assert child.exitcode == 0


def test_a_store_left_cleared_leaves_the_daemon_empty(store, client):
    zarr.create_array(store, name="a", shape=(100,), chunks=(10,), dtype="u1")[:] = 7
    zarr.core.sync.sync(store.clear())
    gc.collect()
    assert client.status().objects_sealed == 0 and not client.list()


@pytest.mark.parametrize(
    "prefix, message",
    [
        ("", "none empty"),
        ("a//b", "none empty"),
        ("a/../b", r"'\.\.'"),
        ("/a", "none empty"),
        ("a b", "the character ' '"),
        ("a\x00", r"the character '\\x00'"),
        ("x" * 3000, "longer than"),
    ],
)
def test_a_bad_prefix_is_refused_naming_what_is_wrong(prefix, message):
    with pytest.raises(ValueError, match=message):
        depot.zarr.Store(prefix)


def test_bad_arguments_are_clear_errors(store):
    with pytest.raises(TypeError, match="prefix must be a str"):
        depot.zarr.Store(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replace_timeout"):
        depot.zarr.Store("p", replace_timeout=-1)
    with pytest.raises(ValueError, match="longer than depot's limit"):
        store.set_sync("k" * 5000, cpu.Buffer.from_bytes(b"x"))
    with pytest.raises(TypeError, match="must be a zarr Buffer"):
        store.set_sync("k", b"x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="read-only"):
        store.with_read_only(True).set_sync("k", cpu.Buffer.from_bytes(b"x"))


def test_a_store_whose_daemon_is_gone_says_so(tmp_path):
    store = depot.zarr.Store("p", socket=tmp_path / "no-daemon.sock")
    with pytest.raises(depot.ConnectionError, match="no depot daemon is listening"):
        store.get_sync("zarr.json")


def test_xarray_writes_and_reads_a_dataset_through_the_store(daemon):
    xr = pytest.importorskip("xarray")
    store = depot.zarr.Store("datasets/weather", socket=daemon.socket)
    ds = xr.Dataset(
        {"temperature": (("time", "x"), np.arange(24.0).reshape(6, 4))},
        coords={"time": np.arange(6), "x": [10, 20, 30, 40]},
        attrs={"source": "test"},
    )
    ds.to_zarr(store, zarr_format=3, consolidated=False)
    back = xr.open_zarr(depot.zarr.Store("datasets/weather", socket=daemon.socket),
                        consolidated=False)
    xr.testing.assert_identical(back.load(), ds)


def test_clearing_more_keys_than_a_request_may_name_deletes_them_all():
    # A daemon whose requests name at most 1,000 ids: the store deletes in batches.
    with depot.start_daemon(memory="64MiB", args=["--max-batch", "1000"]) as daemon:
        store = depot.zarr.Store("many", socket=daemon.socket)
        with depot.Client(daemon.socket) as client:
            client.put_many([b"k"] * 2500, names=[f"many/c/{i}" for i in range(2500)], pin=True)
            zarr.core.sync.sync(store.clear())
            assert not client.list()
