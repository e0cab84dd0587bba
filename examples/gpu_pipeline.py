#!/usr/bin/env python3
"""A GPU pipeline whose stages stay on one device: each chain (make -> scale -> total) makes
its data on a GPU, and its later stages run on the GPU that holds it, so nothing crosses
between GPUs or to host memory but the small results; the chains spread over the GPUs.

    python examples/gpu_pipeline.py [--chains 8] [--mib 16] [--simulate]

With CuPy and CUDA GPUs, the stages are CuPy kernels on the real GPUs (a worker process per
GPU). Without them, or with --simulate, the daemon serves two simulated GPUs, backed by host
memory, and numpy stands in for CuPy: placement, the store and its counters work the same.
"""

import argparse
import ctypes

import numpy as np

import depot


def cupy_or_none():
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # not installed, or no usable GPU
        return None


class OnSimulatedGpu:
    """A numpy array handed to depot as a GPU array (__cuda_array_interface__): a simulated
    GPU's memory is host memory, so a task's result is stored in its GPU's pool."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)

    @property
    def __cuda_array_interface__(self):
        a = self.array
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                "version": 3, "strides": None}


def host_view(device_array):
    """A simulated GPU's DeviceArray read as numpy (its pointer is a host address)."""
    raw = (ctypes.c_char * device_array.nbytes).from_address(device_array.ptr)
    return np.frombuffer(raw, dtype=device_array.dtype).reshape(device_array.shape)


# The stages. Each runs on a GPU (depot.task_device()) and gets its inputs as DeviceArrays
# there; `simulated` says whether to use numpy (simulated GPUs) or CuPy.


def make(seed, n, simulated):
    if simulated:
        return OnSimulatedGpu(np.arange(n, dtype=np.float64) + seed)
    import cupy

    with cupy.cuda.Device(depot.task_device()):
        return cupy.arange(n, dtype=cupy.float64) + seed


def scale(x, factor, simulated):
    if simulated:
        return OnSimulatedGpu(host_view(x) * factor)
    import cupy

    with cupy.cuda.Device(depot.task_device()):
        return cupy.asarray(x) * factor


def total(x, simulated):
    device = depot.task_device()
    if simulated:
        return float(host_view(x).sum()), device
    import cupy

    with cupy.cuda.Device(device):
        return float(cupy.asarray(x).sum()), device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--mib", type=int, default=16, help="each chain's array, in MiB")
    parser.add_argument("--simulate", action="store_true", help="simulated GPUs even with CuPy")
    args = parser.parse_args()

    cupy = None if args.simulate else cupy_or_none()
    simulated = cupy is None
    gpus = 2 if simulated else cupy.cuda.runtime.getDeviceCount()
    n = args.mib * (1 << 20) // 8
    on_gpu = {"GPU": 1, "CPU": 0}
    with depot.start_daemon(
        memory="1GiB",
        simulate_gpus=f"{gpus}:{max(256, 4 * args.chains * args.mib)}MiB" if simulated else None,
        workers=gpus,
        worker_gpus=range(gpus),
    ) as daemon, daemon.client() as c:
        results = []
        for chain in range(args.chains):
            data = c.submit(make, chain, n, simulated, resources=on_gpu)
            # Hard affinity: on the GPU holding the input (the cost model would mostly choose
            # it anyway; this makes the example's claim a guarantee).
            scaled = c.submit(scale, data, 2.0, simulated, resources=on_gpu, affinity="hard")
            results.append(c.submit(total, scaled, simulated, resources=on_gpu, affinity="hard"))
        sums = c.get_many(results, timeout=300)
        status = c.status()
        tasks = c.tasks()

    devices = {t.device for t in tasks if t.function == "depot.call"}
    for chain, (value, device) in enumerate(sums):
        expected = 2.0 * (n * (n - 1) / 2 + chain * n)
        assert abs(value - expected) <= 1e-9 * expected, (chain, value, expected)
    print(f"{args.chains} chains of {args.mib} MiB on {len(devices)} "
          f"{'simulated ' if simulated else ''}GPUs: every sum right; "
          f"{status.scheduler.moved_bytes} bytes moved, {status.replicas_made} replicas made")


if __name__ == "__main__":
    main()
