#!/usr/bin/env python3
"""Cubed plans on depot's executor against Cubed's own local executors, in the same run (issue 41).

  python bench/python/bench_cubed.py [--workers 2] [--repeat 1]
      [--workloads matmul,reduce] [--executors threads,processes,depot,depot-files]
      [--n 4000] [--chunk 1000] [--allowed-mem 1GB] [--store-memory 4GiB]
      [--work-dir /var/tmp] [--timeout 600] [--json]

The workloads, their arrays from seeded generators (Python's ``random`` seeded with 0, which
``cubed.random`` draws its root seed from):
- matmul: the example of Cubed #284 (cubed's examples/matmul-random.py) scaled to this
  machine: two --n x --n random float64 arrays in --chunk x --chunk chunks, each cast to
  float32, multiplied (``xp.matmul``); the product (--n x --n float32) comes back to the
  run's process;
- reduce: elementwise then reduce: ``xp.mean(xp.sin(a) * 2 + xp.cos(a) ** 2, axis=0)`` of
  one such array.

The executors, each with --workers processes or threads and Cubed's ``allowed_mem``
(--allowed-mem):
- threads: Cubed's ThreadsExecutor (``max_workers``), its intermediate arrays in Zarr
  files in a fresh directory under --work-dir (Cubed's ``work_dir``), compressed as Cubed
  compresses by default;
- processes: Cubed's ProcessesExecutor, the same (it starts its process pool, "spawn", in
  every compute: that is part of what it costs);
- depot: ``depot.cubed.Executor(workers=N, store_memory=--store-memory)`` and the spec it
  makes: a private depotd with N Python workers, the arrays in ``depot.zarr.Store``
  (uncompressed);
- depot-files (not run unless named): depot's executor with the arrays in files under
  --work-dir, as the local executors keep them: what the store adds over the executor.

Each run is a fresh process (this script with --child; bench/python/_measured.py), run
twice: timed, and sampled for its memory (the sampling takes CPU time from what it samples;
--sampled-times times the sampled run, as this benchmark did before). It builds
its executor, computes a small plan on it (so that workers have imported Cubed and Zarr),
says it is ready, and then computes the workload twice: "first" and "again" (the same plan
built anew). Measured: wall time of each, from building the plan to the values in the run's
process; peak memory while both run, sampled every 20 ms: the private memory of the run's
process tree plus the pages of depot's memfds (_memory.py). Files in --work-dir are on disk,
and the page cache they fill is not counted: the local executors' figures leave out what
their intermediates take, depot's count its store. Idle memory is the same sum at "ready".
Also: the peak of the processes' private memory alone over its idle level (what the tasks
and the run's process took beside the store's pages), and Cubed's projected memory per
task for the plan (the most over its operations) times the workers: the most the tasks
admitted at once may take by Cubed's projection.

Every run's values are checked against the threaded executor's (count, sum and a sum
weighted by position, within 1e-6 relative: float32 sums in different orders). Runs
alternate executors within each repetition. Reported: medians over --repeat; time ratios
to the fastest other executor (the issue's goal for depot: 0.5 or less, against the
fastest of Cubed's local executors), and peak memory to the lowest other.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import _measured  # beside this script

MiB = 1 << 20
EXECUTORS = ("threads", "processes", "depot")
OPTIONAL_EXECUTORS = ("depot-files",)


# The workloads: each builds, from a spec, the array one compute returns.


def _random(spec: Any, args) -> Any:
    import cubed.random

    return cubed.random.random((args.n, args.n), chunks=(args.chunk, args.chunk), spec=spec)


def _matmul(spec: Any, args) -> Any:
    import cubed.array_api as xp

    a, b = _random(spec, args), _random(spec, args)
    return xp.matmul(xp.astype(a, xp.float32), xp.astype(b, xp.float32))


def _reduce(spec: Any, args) -> Any:
    import cubed.array_api as xp

    a = _random(spec, args)
    return xp.mean(xp.sin(a) * 2 + xp.cos(a) ** 2, axis=0)


WORKLOADS: Dict[str, Callable[[Any, Any], Any]] = {"matmul": _matmul, "reduce": _reduce}


def _digest(value: Any) -> List[float]:
    import numpy as np

    flat = np.asarray(value, dtype=np.float64).ravel()
    return [float(flat.size), float(flat.sum()), float((flat * np.arange(flat.size) / flat.size).sum())]


def _projected(array: Any) -> int:
    """The most memory Cubed projects for one task of the array's plan."""
    from cubed.core.plan import arrays_to_plan

    dag = arrays_to_plan(array)._finalize(optimize_graph=True).dag
    return max(
        (d["primitive_op"].projected_mem for _, d in dag.nodes(data=True) if "primitive_op" in d),
        default=0,
    )


# A run's executor and spec.


@contextlib.contextmanager
def _started(executor: str, args) -> Iterator[Any]:
    import cubed

    if executor in ("threads", "processes"):
        from cubed.runtime.executors.local import ProcessesExecutor, ThreadsExecutor

        kind = ThreadsExecutor if executor == "threads" else ProcessesExecutor
        with tempfile.TemporaryDirectory(dir=args.work_dir) as work_dir:
            yield cubed.Spec(work_dir=work_dir, allowed_mem=args.allowed_mem,
                             executor=kind(max_workers=args.workers))
        return
    import depot.cubed

    with depot.cubed.Executor(workers=args.workers, store_memory=args.store_memory) as ex:
        if executor == "depot":
            yield ex.spec(allowed_mem=args.allowed_mem)
            return
        with tempfile.TemporaryDirectory(dir=args.work_dir) as work_dir:
            yield cubed.Spec(work_dir=work_dir, allowed_mem=args.allowed_mem, executor=ex)


def _child(kind: str, executor: str, args, say: Callable[..., None]) -> None:
    import gc
    import random

    import cubed.array_api as xp

    with _started(executor, args) as spec:
        # Workers import Cubed, Zarr and numpy here, not in the timed part.
        xp.sum(xp.ones((4, 4), chunks=(2, 2), spec=spec) + 1).compute()
        _measured.go(say)
        times, digests = [], []
        for _ in range(2):
            random.seed(0)
            start = time.perf_counter()
            array = WORKLOADS[kind](spec, args)
            value = array.compute()
            times.append(time.perf_counter() - start)
            digests.append(_digest(value))
            del value
            gc.collect()
        say("done")
        why = _differs(digests[1], digests[0])
        if why:
            raise RuntimeError(f"the first compute's values differ from the second's: {why}")
        say("result", seconds=times[0], warm_seconds=times[1], digest=digests[0],
            projected=_projected(array))


# The benchmark's side.


def _differs(digest: List[float], reference: List[float]) -> Optional[str]:
    return _measured.differs(digest, reference, rel_tol=1e-6)


def _runs(kind: str, args, executors: List[str]) -> Dict[str, List[Dict[str, Any]]]:
    reference = None
    runs: Dict[str, List[Dict[str, Any]]] = {e: [] for e in executors}
    for _ in range(args.repeat):
        for executor in executors:
            measure = _measured.run_child if args.sampled_times else _measured.run_apart
            run = measure(__file__, f"{kind}:{executor}", sys.argv[1:], args.timeout)
            if "digest" in run:
                reference = reference or run["digest"]
                why = _differs(run["digest"], reference)
                if why:
                    run["error"] = why
            if "error" in run:
                print(f"  {kind} on {executor} FAILED: {run['error']}", flush=True)
            runs[executor].append(run)
    return runs


def _ratio(a: float, b: Optional[float]) -> str:
    return f"{a / b:.2f}" if b else "-"


def _report(kind: str, runs: Dict[str, List[Dict[str, Any]]], workers: int) -> None:
    med = {}
    for executor, rs in runs.items():
        if rs and not any("error" in r for r in rs):
            med[executor] = {
                key: statistics.median(r[key] for r in rs)
                for key in ("seconds", "warm_seconds", "peak_memory", "idle_memory", "projected",
                            "peak_private", "idle_private")
            }
    print(f"\n{kind}:")
    print(f"  {'executor':12}{'first s':>9}{'/fastest':>10}{'again s':>9}{'/fastest':>10}"
          f"{'peak MiB':>10}{'/lowest':>9}{'idle MiB':>10}{'peak-idle':>11}{'private':>9}"
          f"{'projected':>11}")
    for executor, rs in runs.items():
        if executor not in med:
            print(f"  {executor:12}FAILED: {next(r['error'] for r in rs if 'error' in r)}")
            continue
        m = med[executor]
        others = [v for e, v in med.items() if e != executor]
        fastest = min((o["seconds"] for o in others), default=None)
        fastest_again = min((o["warm_seconds"] for o in others), default=None)
        lowest = min((o["peak_memory"] for o in others), default=None)
        print(f"  {executor:12}{m['seconds']:9.2f}{_ratio(m['seconds'], fastest):>10}"
              f"{m['warm_seconds']:9.2f}{_ratio(m['warm_seconds'], fastest_again):>10}"
              f"{m['peak_memory'] / MiB:10.0f}{_ratio(m['peak_memory'], lowest):>9}"
              f"{m['idle_memory'] / MiB:10.0f}"
              f"{(m['peak_memory'] - m['idle_memory']) / MiB:11.0f}"
              f"{(m['peak_private'] - m['idle_private']) / MiB:9.0f}"
              f"{m['projected'] * workers / MiB:11.0f}")
    print(f"  private: the peak of the processes' private memory (the store's pages left out) "
          f"over its idle level, MiB; projected: Cubed's projected memory of a task (the most "
          f"over the plan's operations) x {workers} workers, MiB")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--executors", default=",".join(EXECUTORS))
    parser.add_argument("--n", type=int, default=4000, help="the arrays' side")
    parser.add_argument("--chunk", type=int, default=1000, help="the chunks' side")
    parser.add_argument("--allowed-mem", default="1GB", help="Cubed's allowed_mem")
    parser.add_argument("--store-memory", default="4GiB", help="depot's store")
    parser.add_argument("--work-dir", default="/var/tmp", help="where files go")
    parser.add_argument("--timeout", type=float, default=600, help="seconds, per run")
    parser.add_argument(
        "--sampled-times", action="store_true",
        help="time the run whose memory is sampled (one run, not two: the sampling's CPU "
        "time then slows the run)",
    )
    parser.add_argument("--json", action="store_true", help="print every run's figures as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # WORKLOAD:EXECUTOR, one run
    args = parser.parse_args()
    _measured.check_choices(parser, args, {"workloads": tuple(WORKLOADS),
                                           "executors": EXECUTORS + OPTIONAL_EXECUTORS})
    return args


def main() -> None:
    args = _arguments()
    if args.child:
        kind, executor = args.child.split(":")
        _measured.child_main(lambda say: _child(kind, executor, args, say))
        return
    executors = args.executors.split(",")
    executors.sort(key=lambda e: e != "threads")  # the reference first
    n, chunk = args.n, args.chunk
    print(f"{args.workers} workers; arrays {n}x{n} float64 = {n * n * 8 / MiB:.0f} MiB in chunks "
          f"of {chunk}x{chunk} = {chunk * chunk * 8 / MiB:.1f} MiB; allowed_mem "
          f"{args.allowed_mem}; load average {open('/proc/loadavg').read().split()[0]}",
          flush=True)
    figures = {}
    for kind in args.workloads.split(","):
        figures[kind] = _runs(kind, args, executors)
        _report(kind, figures[kind], args.workers)
    _measured.finish(args, figures)


if __name__ == "__main__":
    main()
