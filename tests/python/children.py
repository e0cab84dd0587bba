"""Code run in other processes by the tests (imported by multiprocessing spawn children)."""

import numpy as np

import depot
from conftest import address_of, in_store, memory_kib


def read_shared_array(socket, ref):
    """In a spawned child: gets the array, and reports where it lies and what it cost."""
    anon_before = memory_kib("RssAnon")
    with depot.Client(socket) as client:
        array = client.get(ref)
        total = int(array.sum(dtype=np.int64))  # touches every byte
        return {
            "sum": total,
            "in_store": in_store(address_of(array), array.nbytes),
            "anon_growth_kib": memory_kib("RssAnon") - anon_before,
            "reply": client.put(array[:10] * 2),
        }


# Workers for test_tasks.py: run in spawned processes.


def scale(array, factor):
    return array * factor


def fail_with(message):
    raise ValueError(message)


def split(n):
    return list(range(n)), n


def wait_for_go(socket, tag):
    """Says it started (an object named started/<tag>/<pid>), then waits for "go"."""
    import os

    with depot.Client(socket) as client:
        client.put(b"", name=f"started/{tag}/{os.getpid()}")
        client.get(depot.ObjectRef.from_name("go"), timeout=60)
    return tag


def run_worker(socket, cpus=1):
    with depot.Worker(socket, cpus=cpus, name="test worker") as worker:
        worker.register("scale", scale)
        worker.register("fail_with", fail_with)
        worker.register("split", split)
        worker.register("wait_for_go", wait_for_go)
        worker.run()


def describe_on_cpu(x):
    """A CPU variant whose time grows with its input: 1 ns a byte."""
    import time

    time.sleep(x.nbytes / 1e9)
    return ("cpu", type(x).__name__, int(x.nbytes))


def describe_on_gpu(x):
    """A GPU variant that costs a launch, 2 ms, whatever its input."""
    import time

    time.sleep(0.002)
    return ("gpu", type(x).__name__, int(x.device), int(x.nbytes))


def run_variant_worker(socket):
    """A worker with one CPU slot and GPU 0, and a function with a variant for each."""
    with depot.Worker(socket, cpus=1, gpus=[0], name="variant worker") as worker:
        worker.register("describe", cpu=describe_on_cpu, gpu=describe_on_gpu)
        worker.register("kinds", lambda *values: [type(v).__name__ for v in values])
        worker.run()
