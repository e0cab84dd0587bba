"""Round trips of each kind of value, and the API around them."""

import pickle
from fractions import Fraction

import numpy as np
import pytest

import depot


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return (self.x, self.y) == (other.x, other.y)


ARRAYS = {
    "float64 2-d": np.arange(12.0).reshape(3, 4),
    "int8": np.arange(-5, 5, dtype=np.int8),
    "bool": np.array([True, False, True]),
    "complex": np.array([1 + 2j, 3 - 4j]),
    "big-endian": np.arange(4, dtype=">i4"),
    "datetime64": np.array(["2024-01-01", "2025-06-30"], dtype="M8[ns]"),
    "unicode": np.array(["ab", "cde"]),
    "bytes": np.array([b"x", b"yz"]),
    "0-d": np.array(3.25),
    "empty": np.zeros((0, 5)),
    "3-d": np.arange(60, dtype=np.uint16).reshape(3, 4, 5),
    "fortran": np.asfortranarray(np.arange(20.0).reshape(4, 5)),
    "strided": np.arange(100).reshape(10, 10)[::2, 1::3],
    "structured": np.array([(1, 2.0), (3, 4.0)], dtype=[("a", "i4"), ("b", "f8")]),
    "object": np.array([1, "a", None], dtype=object),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_numpy_array_round_trips_read_only(client, name):
    array = ARRAYS[name]
    got = client.get(client.put(array))
    assert isinstance(got, np.ndarray)
    assert got.dtype == array.dtype and got.shape == array.shape
    if array.dtype == object:  # pickled in-band: a private copy, like any Python object
        assert list(got) == list(array)
        return
    assert np.array_equal(got, array)
    assert not got.flags.writeable
    with pytest.raises(ValueError):
        got[...] = 0


def test_datetimes_inside_pickled_values_are_out_of_band(client):
    values = {
        "times": np.arange(100_000).astype("M8[ns]"),
        "spans": np.arange(100_000).astype("m8[ms]"),
        "big-endian": np.arange(100_000).astype(">M8[s]"),
        "strided": np.arange(200_000).astype("M8[D]")[::2],
        "2-d": np.arange(100_000).astype("M8[us]").reshape(100, 1000).T,
        "0-d": np.array(5, dtype="m8[h]"),
    }
    ref = client.put(values)  # a dict: pickled
    got = client.get(ref)
    for name, array in values.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert np.array_equal(got[name], array), name
        assert not got[name].flags.writeable, name
    # numpy would pickle their elements in the stream, read back as copies: they are not.
    stream = int(client.get_buffer(ref).metadata.split()[2])
    assert stream < 4096, stream


def test_fortran_array_comes_back_fortran_ordered(client):
    got = client.get(client.put(ARRAYS["fortran"]))
    assert got.flags.f_contiguous and not got.flags.c_contiguous


@pytest.mark.parametrize(
    "value", [b"hello", bytearray(b"\x00\x01\x02"), memoryview(b"view"), b"", b"x" * 100_000]
)
def test_bytes_like_values_come_back_as_read_only_memoryview(client, value):
    got = client.get(client.put(value))
    assert isinstance(got, memoryview)
    assert got.readonly
    assert got.tobytes() == bytes(value)


def test_non_contiguous_memoryview_is_stored_as_its_bytes(client):
    view = memoryview(b"abcdefgh")[::2]
    assert client.get(client.put(view)).tobytes() == b"aceg"


@pytest.mark.parametrize(
    "value",
    [
        42,
        "text ✓",
        None,
        3.5,
        [1, [2, 3], {"k": (4, 5)}],
        {"a": 1, "b": [None, True]},
        Fraction(1, 3),
        Point(1, 2),
        {1, 2, 3},
        b"x" * 10,
    ],
    ids=repr,
)
def test_picklable_values_round_trip(client, value):
    got = client.get(client.put([value]))  # wrapped in a list: always the pickle kind
    assert got == [value]


def test_arrays_nested_in_containers_round_trip(client):
    value = {"a": np.arange(10), "rest": [np.ones((3, 3)), "label", {"deep": np.zeros(4, "f4")}]}
    got = client.get(client.put(value))
    assert np.array_equal(got["a"], value["a"])
    assert np.array_equal(got["rest"][0], value["rest"][0])
    assert got["rest"][1] == "label"
    assert got["rest"][2]["deep"].dtype == np.float32
    assert not got["a"].flags.writeable


def test_large_pickled_object_round_trips(client):
    value = {"big": np.random.default_rng(0).random(1_000_000), "small": list(range(1000))}
    got = client.get(client.put(value))
    assert np.array_equal(got["big"], value["big"]) and got["small"] == value["small"]


def test_object_metadata_names_its_kind(client):
    array = client.get_buffer(client.put(np.zeros((2, 3), dtype="<f4")))
    assert array.metadata == b"depot-py/1 ndarray <f4 C 2,3"
    assert client.get_buffer(client.put(b"raw")).metadata == b"depot-py/1 bytes"
    assert client.get_buffer(client.put({"a": 1})).metadata.startswith(b"depot-py/1 pickle ")


def test_named_objects_are_found_by_name(client):
    ref = client.put(np.arange(5), name="series/5")
    assert ref == depot.ObjectRef.from_name("series/5")
    assert ref.name == "series/5"
    assert np.array_equal(client.get("series/5"), np.arange(5))
    assert "series/5" in client


def test_put_many_and_get_many_keep_order(client):
    values = [np.arange(i) for i in range(1, 6)] + [b"bytes", {"x": 1}]
    refs = client.put_many(values)
    got = client.get_many(refs)
    assert all(np.array_equal(a, b) for a, b in zip(got[:5], values[:5]))
    assert got[5].tobytes() == b"bytes" and got[6] == {"x": 1}
    named = client.put_many([1, 2], names=["one", "two"])
    assert client.get_many(["two", named[0]]) == [2, 1]


def test_put_many_batches_every_kind_of_value_in_order(client):
    # More small values than one batch write holds, between large, strided and pickled ones.
    small = [np.full(i % 50 + 1, i, dtype=np.int32) for i in range(600)]
    large = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: created in place
    strided = np.arange(100, dtype=np.int64)[::3]
    values = small[:300] + [large, strided, {"nested": small[1]}] + small[300:] + [b"tail"]
    refs = client.put_many(values)
    got = client.get_many(refs)
    for i, (want, have) in enumerate(zip(values, got)):
        if isinstance(want, np.ndarray):
            assert np.array_equal(want, have), i
    assert np.array_equal(got[302]["nested"], small[1])
    assert got[-1].tobytes() == b"tail"


def test_put_many_stores_the_rest_and_raises_the_first_failure(client):
    client.put(b"taken", name="put-many/taken")
    client.put(b"also taken", name="put-many/taken-too")
    big = np.arange(1 << 16)  # 512 KiB: put on its own, between the batched ones
    names = ["put-many/a", "put-many/taken", "put-many/big", "put-many/taken-too", "put-many/c"]
    with pytest.raises(depot.ObjectExists) as e:
        client.put_many([b"a", b"b", big, b"d", b"c"], names=names)
    assert e.value.refs == [depot.ObjectRef.from_name(n) for n in names]
    assert sorted(e.value.failed) == [1, 3] and e.value.failed[1] is e.value
    assert isinstance(e.value.failed[3], depot.ObjectExists)
    assert client.get("put-many/a").tobytes() == b"a"
    assert np.array_equal(client.get("put-many/big"), big)
    assert client.get("put-many/c").tobytes() == b"c"
    assert client.get("put-many/taken").tobytes() == b"taken"
    assert client.get("put-many/taken-too").tobytes() == b"also taken"


def test_put_many_without_names_tells_which_random_ids_were_stored(client):
    too_big = np.zeros(300 << 20, dtype=np.uint8)  # more than the 256 MiB arena holds
    with pytest.raises(depot.InvalidArgument, match="larger than the host arena's capacity") as e:
        client.put_many([b"kept", too_big, b"kept too"])
    assert list(e.value.failed) == [1]
    stored = [r for i, r in enumerate(e.value.refs) if i not in e.value.failed]
    assert [client.get(r).tobytes() for r in stored] == [b"kept", b"kept too"]


def test_put_many_of_an_unpicklable_value_stores_nothing(client):
    with pytest.raises(depot.InvalidArgument):
        client.put_many([b"first", lambda: None], names=["put-many/first", "put-many/lambda"])
    assert "put-many/first" not in client


def test_object_ref_is_hashable_picklable_and_printable(client):
    ref = client.put(1, name="answer")
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref and hash(copy) == hash(ref) and copy.name == "answer"
    assert {ref: "v"}[depot.ObjectRef.from_name("answer")] == "v"
    assert depot.ObjectRef.from_hex(ref.hex) == ref
    assert ref.hex in repr(ref) and len(ref.hex) == 32
    assert client.put(2) != client.put(2)  # random ids


def test_create_and_seal_write_in_place(client):
    buf = client.create(8, name="filled")
    assert isinstance(buf, memoryview) and not buf.readonly
    buf[:] = b"12345678"
    with pytest.raises(depot.ObjectNotFound):
        client.get("filled", timeout=0)  # not visible before seal
    ref = client.seal(buf)
    assert ref == depot.ObjectRef.from_name("filled")
    assert client.get("filled", timeout=0).tobytes() == b"12345678"


def test_create_array_fills_an_array_in_place(client):
    array = client.create_array((4, 2), np.int32)
    array[:] = np.arange(8).reshape(4, 2)
    ref = client.seal(array)
    got = client.get(ref)
    assert got.dtype == np.int32 and np.array_equal(got, np.arange(8).reshape(4, 2))


def test_abort_drops_an_object_being_created(client):
    buf = client.create(16, name="dropped")
    client.abort(buf)
    with pytest.raises(depot.ObjectNotFound):
        client.get("dropped", timeout=0)


def test_delete_contains_and_list(client):
    ref = client.put(np.arange(3), name="listed")
    names = {info.name for info in client.list()}
    assert "listed" in names
    info = next(i for i in client.list() if i.name == "listed")
    assert info.id == ref.id and info.sealed and info.data_size == 24
    client.delete(ref)
    assert not client.contains(ref)
    with pytest.raises(depot.ObjectNotFound):
        client.delete(ref)


def test_status_and_clients_describe_the_daemon(client, daemon):
    status = client.status()
    assert status.pid == daemon.pid
    assert status.capacity_bytes == 256 << 20
    assert status.socket_path == daemon.socket
    assert any(c.session_id for c in client.clients())
    client.put_many([b"a", b"b"])
    status = client.status()
    assert status.objects_on_host == status.objects_sealed == 2
    assert status.spills == status.spilled_bytes == 0
    assert status.replicas_made == status.replicas_dropped == 0
    # Arena memory is page-locked only for CUDA GPUs (by a worker, soon after it is mapped).
    if any(not g.simulated for g in status.gpus):
        assert status.arena_page_locked_bytes <= status.mapped_bytes
    else:
        assert status.arena_page_locked_bytes == 0


def test_client_defaults_to_depot_socket(daemon, monkeypatch):
    monkeypatch.setenv("DEPOT_SOCKET", daemon.socket)
    with depot.Client() as c:
        assert c.socket == daemon.socket
        assert c.get(c.put(b"x")).tobytes() == b"x"


def test_values_outlive_their_client(daemon):
    with daemon.client() as c:
        array = c.get(c.put(np.arange(100_000)))
    assert array.sum() == np.arange(100_000).sum()


def test_one_client_serves_many_threads(client):
    import threading

    errors = []

    def work(k):
        try:
            for i in range(200):
                value = np.full(1000 + i, k, dtype=np.int32)
                got = client.get(client.put(value))
                assert got.shape == value.shape and got[0] == k
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
