"""Functions of Dask tasks and their GPU forms for simulated GPUs (test_dask_graphs.py): a
simulated GPU's memory is host memory, so a GPU form reads its DeviceArray inputs there and
returns its result as an array said to be on CUDA device 0 (dlpack_util.FakeCudaArray), which
the worker stores in the task's GPU pool. Workers import this module by name (the tests put
its directory on their PYTHONPATH)."""

import time

import numpy as np

from dlpack_util import FakeCudaArray, host_view

SLOW = 0.03  # seconds the slow form of each pair takes


def _host(x):
    """A DeviceArray on a simulated GPU as numpy over its memory; what a GPU form made in the
    same task (fused with it) as its array; a host array as it is."""
    if isinstance(x, FakeCudaArray):
        return x.array
    if type(x).__name__ == "DeviceArray":
        assert x.simulated and x.device == 0
        return host_view(x.ptr, x.nbytes, x.dtype, x.shape)
    return np.asarray(x)


def double_slowly(block):
    time.sleep(SLOW)
    return block * 2


def double_on_gpu(block):
    return FakeCudaArray(_host(block) * 2)


def inc(block):
    return block + 1


def inc_on_gpu_slowly(block):
    time.sleep(SLOW)
    return FakeCudaArray(_host(block) + 1)


def scale(block):
    return block * 0.5


def scale_on_gpu(block):
    return FakeCudaArray(_host(block) * 0.5)


def block_sum(block):
    return block.sum(axis=-1, keepdims=True)


def block_sum_on_gpu(block):
    return _host(block).sum(axis=-1, keepdims=True)  # a small result: in host memory
