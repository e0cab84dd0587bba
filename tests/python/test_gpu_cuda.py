"""GPU objects on real CUDA GPUs, with CuPy and PyTorch: `pytest -m gpu tests/python`.

Each test skips, saying why, unless its library is importable and sees a CUDA device, and
the daemon (started without simulated GPUs) serves that device."""

import gc
import importlib

import numpy as np
import pytest

import depot
from conftest import wait_for

pytestmark = pytest.mark.gpu


def _library(name):
    try:
        module = importlib.import_module(name)
    except Exception as e:  # ImportError, or a broken CUDA install
        return None, f"{name} is not importable ({type(e).__name__}: {e})"
    try:
        if name == "cupy":
            count = module.cuda.runtime.getDeviceCount()
        else:
            count = module.cuda.device_count() if module.cuda.is_available() else 0
    except Exception as e:
        return None, f"{name} sees no CUDA device ({type(e).__name__}: {e})"
    if count == 0:
        return None, f"{name} sees no CUDA device"
    return module, None


@pytest.fixture(scope="module")
def cp():
    module, why = _library("cupy")
    if module is None:
        pytest.skip(why)
    return module


@pytest.fixture(scope="module")
def torch():
    module, why = _library("torch")
    if module is None:
        pytest.skip(why)
    return module


@pytest.fixture(scope="module")
def cuda_daemon():
    found = [_library(name) for name in ("cupy", "torch")]
    if all(module is None for module, _ in found):
        pytest.skip("no GPU library with a CUDA device: " + "; ".join(why for _, why in found))
    # Real GPUs: no simulate_gpus. A small pool, so tests leave most of the card alone.
    with depot.start_daemon(
        memory="1GiB", segment_size="256MiB", args=["--gpu-memory", "2GiB",
                                                    "--gpu-chunk-size", "64MiB"]
    ) as d:
        with d.client() as c:
            gpus = c.gpus()
            status = c.status()
        if not gpus or any(g.simulated for g in gpus):
            pytest.skip(f"the daemon serves no CUDA GPU: {status.gpu_backend}")
        yield d


@pytest.fixture
def client(cuda_daemon):
    with cuda_daemon.client() as c:
        yield c


def gpu_held(client, device=0):
    return client.status().gpus[device].held_bytes


def test_cupy_round_trip(client, cp):
    x = cp.arange(1000, dtype=cp.float32).reshape(10, 100) * 3
    ref = client.put(x)
    a = client.get(ref, device=0)
    assert isinstance(a, depot.DeviceArray) and not a.simulated
    assert a.shape == (10, 100) and a.dtype == np.float32 and a.device == 0
    y = cp.from_dlpack(a)
    assert y.data.ptr == a.ptr  # no copy: the store's memory
    assert bool((y == x).all())
    z = cp.asarray(a)  # __cuda_array_interface__
    assert z.data.ptr == a.ptr and bool((z == x).all())
    host = client.get(ref)
    assert isinstance(host, np.ndarray) and np.array_equal(host, cp.asnumpy(x))
    del a, y, z
    gc.collect()
    assert wait_for(lambda: gpu_held(client) == 0)


def test_torch_round_trip(client, torch):
    t = torch.arange(4096, dtype=torch.int64, device="cuda:0").reshape(64, 64)
    ref = client.put(t)
    a = client.get(ref, device=0)
    u = torch.from_dlpack(a)
    assert u.device.type == "cuda" and u.device.index == 0
    assert u.data_ptr() == a.ptr  # no copy
    assert u.dtype == torch.int64 and tuple(u.shape) == (64, 64)
    assert torch.equal(u, t)
    host = client.get(ref)
    assert np.array_equal(host, t.cpu().numpy())
    del a, u
    gc.collect()
    assert wait_for(lambda: gpu_held(client) == 0)


def test_torch_put_waits_for_the_producers_stream(client, torch):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.full((1 << 20,), 7.0, device="cuda:0")
        t.mul_(3)  # queued on the side stream; put must see its result
        ref = client.put(t)
    torch.cuda.synchronize()
    assert torch.equal(torch.from_dlpack(client.get(ref, device=0)), t)


def test_torch_bfloat16(client, torch):
    t = torch.linspace(-4, 4, 1000, device="cuda:0").to(torch.bfloat16)
    a = client.get(client.put(t), device=0)
    assert a.typestr == "dlpack:4:16:1"
    u = torch.from_dlpack(a)
    assert u.dtype == torch.bfloat16 and torch.equal(u, t)


def test_cupy_to_torch(client, cp, torch):
    x = cp.arange(256, dtype=cp.int32)
    u = torch.from_dlpack(client.get(client.put(x), device=0))
    assert torch.equal(u.cpu(), torch.arange(256, dtype=torch.int32))


def test_host_numpy_to_gpu(client, cp):
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    a = client.get(client.put(x), device=0)
    assert np.array_equal(cp.asnumpy(cp.from_dlpack(a)), x)
    f = np.asfortranarray(x)
    b = client.get(client.put(f), device=0)
    assert np.array_equal(cp.asnumpy(cp.asarray(b)), x)


def test_host_numpy_to_torch(client, torch):
    x = np.arange(1000, dtype=np.float64)
    u = torch.from_dlpack(client.get(client.put(x), device=0))
    assert u.is_cuda and np.array_equal(u.cpu().numpy(), x)


def test_non_contiguous_is_refused(client, torch):
    t = torch.arange(12, device="cuda:0").reshape(3, 4).T
    with pytest.raises(depot.InvalidArgument, match="contiguous"):
        client.put(t)
    assert np.array_equal(client.get(client.put(t.contiguous())), t.cpu().numpy())


def test_every_visible_gpu(client, torch):
    for k in range(len(client.gpus())):
        t = torch.full((1000,), k, dtype=torch.int32, device=f"cuda:{k}")
        ref = client.put(t)
        u = torch.from_dlpack(client.get(ref, device=k))
        assert u.device.index == k and torch.equal(u, t)
        # And a replica on GPU 0, made by the daemon.
        assert torch.equal(torch.from_dlpack(client.get(ref, device=0)).cpu(), t.cpu())


def test_dask_array_tasks_run_on_the_gpu_through_cupy_and_page_through_a_small_pool(cp):
    # depot.dask's CPU-or-GPU choice on a real GPU (issue 40, item 4): array tasks calling
    # only NumPy's functions have a GPU form where CuPy is installed (NumPy's dispatch);
    # offload pins it. 64 blocks of 4 MiB (256 MiB) through a 64 MiB pool: the daemon
    # copies each block in, the task computes with CuPy, the results spill back to host
    # memory as the pool fills. Results equal NumPy's.
    dask = pytest.importorskip("dask")
    da = pytest.importorskip("dask.array")
    import depot.dask

    x = da.random.default_rng(3).random((64, 524288), chunks=(1, 524288))
    y = depot.dask.offload(da.sin(x) * 2)
    total = y.sum(axis=1)
    with depot.start_daemon(
        memory="2GiB", workers=2, worker_gpus=[0], stop_with_parent=True,
        args=["--gpu-memory", "64MiB", "--gpu-chunk-size", "16MiB"],
    ) as d, depot.dask.Scheduler(socket=d.socket, fuse=False) as s:
        got = dask.compute(y, total, scheduler=s.get, optimize_graph=False)
        want = dask.compute(y, total, scheduler="sync", optimize_graph=False)
        np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-12)
        np.testing.assert_allclose(np.asarray(got[1]), want[1], rtol=1e-9)
        del got
        offloaded = [t for t in s.client.tasks() if t.function == "depot.dask.run_offloadable"]
        assert offloaded and all(t.device == 0 for t in offloaded), [
            (t.label, t.device, t.variant_reason) for t in offloaded[:5]]
        assert s.client.gpus()[0].limit_bytes * 4 <= x.nbytes
        assert wait_for(lambda: s.client.list() == [], timeout=60)


def test_a_cuda_tensor_received_through_depot_multiprocessing_is_written_as_its_own(torch):
    # Issue 38: received GPU tensors are writable and private, as CPU ones are (a copy on
    # the receiver's GPU at receipt): the sender's tensor and the store's object unchanged.
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("DEPOT_SOCKET", "DEPOT_MP_GROUP", "DEPOT_MP_THRESHOLD"):
        env.pop(name, None)
    with depot.start_daemon(memory="512MiB", args=["--gpu-memory", "1GiB"]) as d:
        env["DEPOT_SOCKET"] = d.socket
        done = subprocess.run(
            [sys.executable, os.path.join(here, "mp_scenarios.py"), "torch_cuda_write", "spawn"],
            env=env, capture_output=True, text=True, timeout=240,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        import json

        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["exitcode"] == 0
        assert out["total"] == float(1 << 20)
        assert out["sender"] == 0.0 and out["third"] == 0.0
        assert out["again"] == 2.0 * (1 << 20)
        assert out["device"].startswith("cuda")
        with d.client() as c:
            assert wait_for(lambda: c.status().objects_sealed == 0, timeout=20)
