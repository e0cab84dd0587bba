#!/usr/bin/env python3
"""The #7449 product through a GPU larger than its pool, on depot's scheduler (issue 40).

    python bench/python/bench_gpu_product.py [--n 16384] [--chunk 4096] [--pool 1GiB]
        [--workers 2] [--repeat 2] [--simulate]

``(a * a.T).sum()`` of ``a``, an --n x --n float64 array in --chunk x --chunk chunks
generated inside the graph (seed 0), computed in this process's turn by each of:
- cpu: depot's scheduler on a private daemon whose --workers workers offer no GPU (NumPy);
- cupy (with CuPy only): Dask's threaded scheduler in this process, on chunks that CuPy
  generates on the GPU: the whole product on the GPU in one process, CuPy's memory pool
  unbounded (its values are CuPy's random numbers, not NumPy's: not compared);
- depot-auto: depot's scheduler on a private daemon whose GPU 0 pool may take --pool
  (``depotd --gpu-memory``, or a simulated GPU of that size), with --workers workers, the
  first also offering GPU 0: per task, the daemon's cost model chooses the CPU or the GPU
  form (CuPy's, through NumPy's dispatch) from what it measured and the copies of the
  inputs;
- depot-gpu: the same graph with ``depot.dask.offload``: every task with a GPU form runs it
  on the GPU, the array paged through the pool.

Reported per run: wall time (graph built and computed, the value in this process; first
and again, medians over --repeat of "again"), the value's agreement with cpu's, how many
tasks ran on the GPU and on the CPU (``Client.tasks()``), and the GPU pool's peak use,
sampled every 20 ms, against --pool. --simulate serves a simulated GPU (host memory; no
CuPy form runs there, so every task of depot-auto runs on the CPU): for trying the script
on a machine without one. Each run that fails says why and the others go on; the exit
status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional

MiB = 1 << 20


def _product(a: Any) -> Any:
    return (a * a.T).sum()


def _numpy_graph(args) -> Any:
    import dask.array as da

    a = da.random.RandomState(0).random_sample((args.n, args.n), chunks=args.chunk)
    return _product(a)


def _cupy_graph(args) -> Any:
    import cupy
    import dask.array as da

    a = da.random.RandomState(0, RandomState=cupy.random.RandomState).random_sample(
        (args.n, args.n), chunks=args.chunk
    )
    return _product(a)


class _PoolPeak:
    """Samples GPU 0's pool use (status().gpus[0].used_bytes) every 20 ms while open."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            gpus = self.client.status().gpus
            if gpus:
                self.peak = max(self.peak, gpus[0].used_bytes)
            self._stop.wait(0.02)

    def __enter__(self) -> "_PoolPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _where_tasks_ran(client: Any) -> Dict[str, int]:
    """Finished tasks the daemon still lists, by where they ran: {"gpu": n, "cpu": m}."""
    counts = {"gpu": 0, "cpu": 0}
    for t in client.tasks():
        if t.state == "done":
            counts["gpu" if t.device >= 0 else "cpu"] += 1
    return counts


@contextlib.contextmanager
def _depot(args, gpu: bool) -> Iterator[Any]:
    import depot
    import depot.dask

    daemon_args: List[str] = []
    simulated: Optional[str] = None
    if gpu and args.simulate:
        simulated = f"1:{args.pool}"
    elif gpu:
        daemon_args = ["--gpu-memory", f"0:{args.pool}"]
    elif not args.simulate:
        daemon_args = ["--no-gpus"]
    with depot.start_daemon(
        args.store_memory, prefault=False, workers=args.workers,
        worker_gpus=[0] if gpu else [], simulate_gpus=simulated, args=daemon_args,
    ) as daemon, depot.dask.Scheduler(socket=daemon.socket) as scheduler:
        yield scheduler


def _timed(build: Callable[[], Any], compute: Callable[[Any], Any], repeat: int) -> Dict[str, Any]:
    firsts, agains, value = [], [], None
    for _ in range(max(1, repeat)):
        for kind in ("first", "again"):
            start = time.perf_counter()
            value = float(compute(build()))
            (firsts if kind == "first" else agains).append(time.perf_counter() - start)
    return {"first": firsts[0], "again": statistics.median(agains), "value": value}


def _run(name: str, args) -> Dict[str, Any]:
    import dask

    if name == "cupy":
        return _timed(lambda: _cupy_graph(args),
                      lambda x: dask.compute(x, scheduler="threads")[0].item(), args.repeat)
    import depot.dask

    gpu = name != "cpu"
    with _depot(args, gpu) as scheduler:
        client = scheduler.client

        def build() -> Any:
            x = _numpy_graph(args)
            return depot.dask.offload(x) if name == "depot-gpu" else x

        with _PoolPeak(client) as peak:
            out = _timed(build, lambda x: dask.compute(x, scheduler=scheduler.get)[0],
                         args.repeat)
        out["ran"] = _where_tasks_ran(client)
        out["pool_peak"] = peak.peak
        return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=16384, help="the array's side")
    parser.add_argument("--chunk", type=int, default=4096, help="its chunks' side")
    parser.add_argument("--pool", default="1GiB", help="GPU 0's pool in depotd")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--store-memory", default="8GiB", help="depotd's --memory")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--runs", default="cpu,cupy,depot-auto,depot-gpu")
    parser.add_argument("--simulate", action="store_true", help="a simulated GPU, no CuPy")
    args = parser.parse_args(argv)

    import importlib.util

    total = args.n * args.n * 8
    print(f"(a * a.T).sum(): {args.n}x{args.n} float64 = {total / MiB:.0f} MiB in "
          f"{args.chunk}x{args.chunk} chunks ({args.chunk ** 2 * 8 / MiB:.0f} MiB); GPU pool "
          f"{args.pool}{' (simulated)' if args.simulate else ''}; {args.workers} workers")
    results: Dict[str, Dict[str, Any]] = {}
    failed = False
    for name in args.runs.split(","):
        if name == "cupy" and (args.simulate or importlib.util.find_spec("cupy") is None):
            print(f"{name:11} skipped: {'simulated GPU' if args.simulate else 'no CuPy'}")
            continue
        try:
            results[name] = _run(name, args)
        except Exception:
            failed = True
            print(f"{name:11} FAILED:\n{traceback.format_exc()}")
            continue
        r = results[name]
        line = f"{name:11} first {r['first']:7.2f} s  again {r['again']:7.2f} s"
        if "cpu" in results and name != "cupy" and name != "cpu":
            line += f"  /cpu {r['again'] / results['cpu']['again']:5.2f}"
            same = abs(r["value"] - results["cpu"]["value"]) <= 1e-9 * abs(results["cpu"]["value"])
            line += "  value = cpu's" if same else f"  VALUE DIFFERS: {r['value']!r}"
            failed |= not same
        if "ran" in r:
            line += (f"  tasks on GPU {r['ran']['gpu']}, CPU {r['ran']['cpu']}"
                     f"  pool peak {r['pool_peak'] / MiB:.0f} MiB")
        if "cupy" in results and name.startswith("depot"):
            line += f"  /cupy {r['again'] / results['cupy']['again']:5.2f}"
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
