"""GPU objects on a daemon with simulated GPUs (their memory is host memory, so ctypes can
read what a real GPU's would hide): put of DLPack and CUDA array interface producers,
get(..., device=k) as depot.DeviceArray, its DLPack capsules and their lifetime, errors.
Real GPUs: test_gpu_cuda.py."""

import gc
import subprocess
import sys

import numpy as np
import pytest

import depot
from conftest import wait_for
from dlpack_util import (
    FLAG_READ_ONLY,
    KDL_CUDA,
    Consumed,
    FakeCudaArray,
    FakeInterfaceArray,
    host_view,
)


@pytest.fixture
def gpu_daemon():
    with depot.start_daemon(memory="256MiB", segment_size="64MiB", simulate_gpus="2:64MiB") as d:
        yield d


@pytest.fixture
def gpu_client(gpu_daemon):
    with gpu_daemon.client() as c:
        yield c


def gpu_held(client, device):
    return client.status().gpus[device].held_bytes


def test_simulated_gpus_are_listed(gpu_client):
    gpus = gpu_client.gpus()
    assert [g.ordinal for g in gpus] == [0, 1]
    assert all(g.simulated for g in gpus)


def test_put_of_a_dlpack_producer_round_trips_to_host(gpu_client):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    producer = FakeCudaArray(x)
    ref = gpu_client.put(producer, name="on-gpu")
    # Versioned capsule, asked for on the legacy default stream, released once after the copy.
    assert producer.streams == [1] and producer.versioned_exports == 1
    assert producer.deleted == 1
    info = [o for o in gpu_client.list() if o.name == "on-gpu"][0]
    assert info.gpus == [0] and not info.on_host
    host = gpu_client.get(ref)
    assert isinstance(host, np.ndarray) and not host.flags.writeable
    assert host.dtype == x.dtype and host.shape == x.shape
    assert np.array_equal(host, x)


def test_put_of_an_unversioned_producer(gpu_client):
    x = np.arange(100, dtype=np.int16)
    producer = FakeCudaArray(x, versioned=False)
    ref = gpu_client.put(producer)
    assert producer.versioned_exports == 0 and producer.deleted == 1
    assert np.array_equal(gpu_client.get(ref), x)


def test_put_on_the_producers_device(gpu_client):
    x = np.arange(10, dtype=np.uint8)
    ref = gpu_client.put(FakeCudaArray(x, device_id=1))
    info = [o for o in gpu_client.list() if o.id == ref.id][0]
    assert info.gpus == [1]
    a = gpu_client.get(ref, device=1)
    assert a.device == 1 and np.array_equal(host_view(a.ptr, a.nbytes, np.uint8, (10,)), x)


def test_get_on_another_device_reads_the_daemons_replica(gpu_client):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    ref = gpu_client.put(FakeCudaArray(x))
    a = gpu_client.get(ref, device=1)
    assert isinstance(a, depot.DeviceArray)
    assert a.device == 1 and a.simulated
    assert a.shape == (4, 6) and a.dtype == np.float32 and a.typestr == "<f4"
    assert a.nbytes == x.nbytes and a.ndim == 2 and a.size == 24 and len(a) == 4
    assert a.ref == ref
    assert a.__dlpack_device__() == (KDL_CUDA, 1)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (4, 6) and cai["typestr"] == "<f4"
    assert cai["data"] == (a.ptr, True) and cai["strides"] is None and cai["stream"] is None
    assert np.array_equal(host_view(cai["data"][0], a.nbytes, np.float32, (4, 6)), x)
    info = [o for o in gpu_client.list() if o.id == ref.id][0]
    assert info.gpus == [0, 1]


def test_versioned_capsule_is_read_only_and_holds_the_object(gpu_client):
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    ref = gpu_client.put(FakeCudaArray(x))
    assert wait_for(lambda: gpu_held(gpu_client, 1) == 0)
    a = gpu_client.get(ref, device=1)
    assert gpu_held(gpu_client, 1) > 0
    consumed = Consumed(a.__dlpack__(stream=1, max_version=(1, 0)))
    assert consumed.versioned
    assert (consumed.managed.version.major, consumed.managed.version.minor) == (1, 0)
    assert consumed.managed.flags & FLAG_READ_ONLY
    assert consumed.shape == (3, 4) and consumed.strides is None
    assert consumed.dtype == (0, 64, 1)
    t = consumed.tensor
    assert (t.device.device_type, t.device.device_id) == (KDL_CUDA, 1)
    assert t.data == a.ptr and t.byte_offset == 0
    assert np.array_equal(host_view(t.data, x.nbytes, np.int64, consumed.shape), x)
    # The consumer's tensor holds the object after the DeviceArray is gone...
    del a
    gc.collect()
    assert gpu_held(gpu_client, 1) > 0
    # ...until the consumer calls the deleter.
    consumed.release()
    assert wait_for(lambda: gpu_held(gpu_client, 1) == 0)


def test_unversioned_capsule_for_old_consumers(gpu_client):
    x = np.arange(5, dtype=np.float64)
    a = gpu_client.get(gpu_client.put(FakeCudaArray(x)), device=0)
    consumed = Consumed(a.__dlpack__())
    assert not consumed.versioned
    assert consumed.shape == (5,) and consumed.dtype == (2, 64, 1)
    assert consumed.tensor.data == a.ptr
    del a
    gc.collect()
    assert gpu_held(gpu_client, 0) > 0
    consumed.release()
    assert wait_for(lambda: gpu_held(gpu_client, 0) == 0)


def test_unconsumed_capsule_releases_on_collection(gpu_client):
    a = gpu_client.get(gpu_client.put(FakeCudaArray(np.arange(8, dtype=np.int32))), device=0)
    capsules = [a.__dlpack__(max_version=(1, 0)), a.__dlpack__()]
    del a
    gc.collect()
    assert gpu_held(gpu_client, 0) > 0
    del capsules
    gc.collect()
    assert wait_for(lambda: gpu_held(gpu_client, 0) == 0)


def test_get_on_device_of_a_host_numpy_put(gpu_client):
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    ref = gpu_client.put(x)
    a = gpu_client.get(ref, device=0)
    assert a.shape == (5, 6) and a.dtype == np.float32 and a.strides is None
    assert np.array_equal(host_view(a.ptr, a.nbytes, np.float32, (5, 6)), x)
    # Fortran order: byte strides in the interface, element strides in DLPack.
    f = np.asfortranarray(x)
    b = gpu_client.get(gpu_client.put(f), device=0)
    assert b.strides == (4, 20) and b.__cuda_array_interface__["strides"] == (4, 20)
    consumed = Consumed(b.__dlpack__(max_version=(1, 0)))
    assert consumed.strides == (1, 5) and consumed.shape == (5, 6)
    flat = host_view(b.ptr, b.nbytes, np.float32, (30,))
    assert np.array_equal(np.lib.stride_tricks.as_strided(flat, (5, 6), (4, 20)), x)
    consumed.release()


def test_get_on_device_of_bytes_is_uint8(gpu_client):
    a = gpu_client.get(gpu_client.put(b"hello"), device=0)
    assert a.shape == (5,) and a.typestr == "|u1"
    assert bytes(host_view(a.ptr, 5, np.uint8, (5,))) == b"hello"


def test_prefetch_copies_ahead_so_the_get_copies_nothing(gpu_client):
    x = np.arange(1000, dtype=np.int64)
    ref = gpu_client.put(x)
    gpu_client.prefetch([ref], device=1)
    made = gpu_client.status().replicas_made
    a = gpu_client.get(ref, device=1)
    assert gpu_client.status().replicas_made == made  # the copy was there already
    assert np.array_equal(host_view(a.ptr, a.nbytes, np.int64, (1000,)), x)
    with pytest.raises(depot.ObjectNotFound, match="does not exist"):
        gpu_client.prefetch([depot.ObjectRef.from_name("never-put"), ref], device=0)
    with pytest.raises(depot.InvalidArgument):
        gpu_client.prefetch([ref], device=7)


def test_locate_says_where_each_object_is(gpu_client):
    x = np.arange(1000, dtype=np.int64)
    ref = gpu_client.put(x)
    missing = depot.ObjectRef.from_name("never-put")
    placed, absent = gpu_client.locate([ref, missing])
    assert placed.found and placed.on_host and placed.gpus == []
    (info,) = [o for o in gpu_client.list() if o.id == ref.id]
    assert (placed.data_size, placed.metadata_size) == (info.data_size, info.metadata_size)
    assert not absent.found and not absent.on_host
    gpu_client.prefetch([ref], device=1)
    (placed,) = gpu_client.locate([ref])
    assert placed.on_host and placed.gpus == [1]
    assert repr(placed).startswith("ObjectPlacement(id=")
    assert placed.to_dict()["gpus"] == [1]
    assert isinstance(placed, depot.ObjectPlacement)


def test_get_many_on_device(gpu_client):
    xs = [np.full(4, i, dtype=np.int32) for i in range(3)]
    refs = gpu_client.put_many([FakeCudaArray(x) for x in xs])
    arrays = gpu_client.get_many(refs, device=1)
    assert [a.device for a in arrays] == [1, 1, 1]
    for a, x in zip(arrays, xs):
        assert np.array_equal(host_view(a.ptr, a.nbytes, np.int32, (4,)), x)


def test_cuda_array_interface_producer(gpu_client):
    x = np.arange(16, dtype=np.uint16).reshape(4, 4)
    ref = gpu_client.put(FakeInterfaceArray(x), device=1)
    info = [o for o in gpu_client.list() if o.id == ref.id][0]
    assert info.gpus == [1]
    assert np.array_equal(gpu_client.get(ref), x)
    with pytest.raises(depot.InvalidArgument, match="contiguous"):
        gpu_client.put(FakeInterfaceArray(x, strides=(2, 8)))


def test_type_numpy_has_not(gpu_client):
    # bfloat16 (kDLBfloat): stored as is; host get gives raw 2-byte elements.
    raw = np.arange(6, dtype=np.uint16)
    ref = gpu_client.put(FakeCudaArray(raw, dtype=(4, 16, 1)))
    host = gpu_client.get(ref)
    assert host.dtype == np.dtype("V2") and host.shape == (6,)
    assert host.tobytes() == raw.tobytes()
    a = gpu_client.get(ref, device=0)
    assert a.typestr == "dlpack:4:16:1"
    assert a.__cuda_array_interface__["typestr"] == "|V2"
    consumed = Consumed(a.__dlpack__(max_version=(1, 0)))
    assert consumed.dtype == (4, 16, 1)
    consumed.release()


def test_device_array_outlives_its_client(gpu_daemon):
    x = np.arange(10, dtype=np.int32)
    with gpu_daemon.client() as c:
        a = c.get(c.put(FakeCudaArray(x)), device=0)
    assert np.array_equal(host_view(a.ptr, a.nbytes, np.int32, (10,)), x)


def test_dlpack_export_refusals(gpu_client):
    a = gpu_client.get(gpu_client.put(FakeCudaArray(np.arange(4))), device=0)
    with pytest.raises(BufferError, match="copy"):
        a.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        a.__dlpack__(dl_device=(1, 0))
    a.__dlpack__(dl_device=(KDL_CUDA, 0), copy=False)  # fine
    dates = gpu_client.get(gpu_client.put(np.arange(3).astype("M8[s]")), device=0)
    with pytest.raises(BufferError, match="DLPack"):
        dates.__dlpack__()
    assert dates.__cuda_array_interface__["typestr"] == "<M8[s]"


def test_errors(gpu_client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ref = gpu_client.put(x)
    with pytest.raises(depot.InvalidArgument, match="GPU 5"):
        gpu_client.get(ref, device=5)
    with pytest.raises(depot.InvalidArgument):
        gpu_client.get(ref, device=-1)
    with pytest.raises(depot.InvalidArgument, match="GPU 7"):
        gpu_client.put(FakeCudaArray(x, device_id=7))
    # Non-contiguous (a transpose): the message says what to do; the capsule was released.
    producer = FakeCudaArray(x, strides=(1, 4))
    with pytest.raises(depot.InvalidArgument, match=r"contiguous\(\)"):
        gpu_client.put(producer)
    assert producer.deleted == 1
    with pytest.raises(depot.InvalidArgument, match="own GPU"):
        gpu_client.put(FakeCudaArray(x), device=1)
    with pytest.raises(depot.InvalidArgument, match="device="):
        gpu_client.put(x, device=0)
    with pytest.raises(depot.GpuNotSupported, match="device type 10"):
        gpu_client.put(FakeCudaArray(x, device_type=10))  # ROCm
    with pytest.raises(depot.ObjectNotFound):
        gpu_client.get("missing", device=0, timeout=0)
    with pytest.raises(depot.Timeout):
        gpu_client.get("missing", device=0, timeout=0.05)
    # A real device pointer on simulated GPUs is refused, not dereferenced.
    with pytest.raises(depot.InvalidArgument, match="simulated"):
        gpu_client.put(FakeInterfaceArray.__new__(_Unmapped))


class _Unmapped(FakeInterfaceArray):
    """Claims memory at an address no mapping covers."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (16,), "typestr": "<f4", "data": (0x10, False), "version": 3,
                "strides": None, "stream": None}


def test_daemon_without_gpus():
    # --no-gpus: also on a host whose GPUs the daemon would otherwise serve.
    with depot.start_daemon("64MiB", args=["--no-gpus"]) as daemon, \
            depot.Client(daemon.socket) as client:
        ref = client.put(np.arange(3))
        with pytest.raises(depot.InvalidArgument, match="GPU"):
            client.get(ref, device=0)
        with pytest.raises(depot.InvalidArgument, match="GPU"):
            client.put(FakeCudaArray(np.arange(3)))


def test_import_needs_no_gpu_library():
    code = (
        "import sys\n"
        "sys.modules['cupy'] = None; sys.modules['torch'] = None\n"
        "import depot\n"
        "assert depot.DeviceArray and 'numpy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
