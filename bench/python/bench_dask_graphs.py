#!/usr/bin/env python3
"""Dask graphs on depot's own scheduler against Dask's schedulers, in the same run (issues 39, 40).

  python bench/python/bench_dask_graphs.py [--workers 2] [--repeat 1]
      [--workloads product,rechunk,elementwise,chain,tree,groupby,set_index,delayed]
      [--schedulers threads,processes,local,local-depot,depot,depot-unfused]
      [--n 6000] [--chunk 1000] [--rows 1000000] [--partitions 16] [--delayed 10000]
      [--store-memory 50%] [--bound half] [--timeout 600] [--json]

Each workload runs on each scheduler with --workers workers:
- threads: Dask's threaded scheduler, a pool of --workers threads in one process;
- processes: Dask's processes scheduler, a pool of --workers processes (Dask's "spawn"
  context and worker initializer), made before the run and passed as ``pool=``;
- local: a distributed ``LocalCluster`` of --workers single-threaded worker processes (each
  under its nanny, dashboard on), the client as the scheduler;
- local-depot: the same, every worker attached to a depotd of --store-memory (started with
  ``--no-prefault``, as DepotNannyPlugin starts them) through ``depot.dask.DepotPlugin``
  (default threshold and keep) and ``DepotNannyPlugin``;
- depot: ``depot.dask.Scheduler(workers=N, memory=--store-memory)``: a private depotd with N
  Python worker processes, its ``get`` as the scheduler;
- depot-unfused: the same with ``fuse=False``: only Dask's own fusion;
- depot-spill-bound (not run unless named): a private depotd of --store-memory with a spill
  directory (a temporary one in /var/tmp) and --workers workers, shared: the graph attaches to
  it as another client would, with a bound of its own, --bound (as depot-bound's), on what it
  keeps in memory; when nothing of it runs and a task does not fit, its oldest outputs go to
  disk;
- depot-nothing-fused (not run unless named): the same, computed with
  ``optimize_graph=False``: no fusion at all, every operation a task of its own whose
  output is stored;
- depot-gpu (not run unless named): depot with a simulated GPU of --gpu-pool (its memory is
  host memory, counted in the peak), given to the first worker;
- depot-bound (not run unless named): ``depot.dask.Scheduler(workers=N, memory=--bound)``,
  the graph's bound and its store's size; ``--bound half`` (the default) is half of the
  peak memory LocalCluster's run of the same workload reached just before it (so "local"
  must come before it in --schedulers), the issue's test of a graph run inside half of plain
  Dask's memory.

The workloads, all generated from seed 0 inside the graph:
- product: the problem of dask/dask#7449, ``(a * a.T).sum()`` of ``a``, an --n x --n array of
  float64 in chunks of --chunk x --chunk: chunk (j, i) of a must meet chunk (i, j);
- rechunk: ``a`` in chunks of (--chunk, n) rechunked to (n, --chunk) (method "tasks"), summed:
  every output chunk takes a piece of every input chunk;
- elementwise: ten elementwise operations in a row on ``a`` (+, *, sqrt, log, -, abs, sin,
  **, exp, /), summed; Dask fuses them into one task per chunk;
- chain: the same ten operations after rechunk's change of chunks (rows to columns), summed:
  Dask fuses them into each column's merge but stores the rechunk's pieces (slices of the
  row chunks, n / chunk of them per merge); depot also fuses those into the merges;
- tree: ``a`` in chunks of (--chunk / 4, --chunk), ``var(axis=0, split_every=2)``: a tree
  reduction of the chunks' moments, two at a time;
- groupby: a dataframe of --rows rows of 4 random float64 columns in --partitions
  partitions and a key ``k`` of 1,000 values, ``groupby("k").agg(mean, sum, max)`` with
  ``split_out=1`` (a tree reduction of partial aggregates);
- set_index: the same frame, ``set_index("a", shuffle_method="tasks").sum()``: every output
  partition takes a piece of every input partition (the same graph on every scheduler, so
  not distributed's default "p2p"; bench_dask.py measures that);
- delayed: ``dask.compute(*[delayed(operator.add)(i, 1) for i in range(--delayed)])``, tiny
  tasks (a built-in function, so that no scheduler pays to pickle one by value);
- paging (not run unless named): --paging-blocks rows of --paging-block bytes made in host
  memory, each scaled by a function with a GPU form (``depot.dask.register_gpu``; for
  simulated GPUs, one that reads the block where the GPU keeps it) pinned to the GPU
  (``depot.dask.offload``), then summed: on depot-gpu, an array larger than the GPU's pool
  paged through it; computed with Dask's graph optimisation off (else a block would be made
  inside the task that scales it). On the other schedulers, the same graph on CPUs.

The default sizes are scaled down so that the default run (35 runs) takes under 10 minutes
on a 2-core machine: a 275 MiB array in 7.6 MiB chunks, 31 MiB of dataframe, 10,000 delayed
tasks. The issue's figures need a larger machine: 8 workers, 128 MiB chunks (--chunk 4096),
as large an array as memory allows (--n: a multiple of 4096), 100,000 delayed tasks.

Each run is a fresh process (this script with --child), started by the benchmark, which
samples it from outside. Each is run twice: timed, and sampled for its memory (the sampling
reads every process's smaps_rollup, 1.4-3.9 ms of CPU per Python process, and would slow
the run it samples, runs of many processes most); --sampled-times times the sampled run
alone, as this benchmark did before. The run imports numpy, pandas, dask.array and dask.dataframe, starts
its scheduler's workers, runs a warm-up graph (2 x --workers tasks, each importing those
modules), then says it is ready; the benchmark measures idle memory and tells it to go. Measured:
- wall time, first and again: building the collection (the graph; for set_index also the
  nested compute of its divisions, on the same scheduler) and ``dask.compute`` of it, to
  the values in the run's process; then the same once more, in the same process with the
  same workers (the values of the first dropped). The first pays what a scheduler pays
  once per process beyond the warm-up's imports (a store's first pages, modules the
  tasks' functions import); again is what a session computing graph after graph pays.
  Starting the workers and the warm-up are not inside either, for any scheduler;
  ``local/`` is LocalCluster's time again over this scheduler's;
- peak memory, sampled every 20 ms while the timed part runs (both computes): the private memory
  (Pss - Pss_Shmem) of the run's process and every process under it (pool processes and
  multiprocessing's resource tracker, LocalCluster's workers, depotd and its workers) plus
  every page allocated in the depot memfds any of them holds, mapped or not, each file once
  (bench/python/_memory.py, the same count as bench_dask.py's). What users pay: one
  interpreter for threads, --workers + 1 for the others (LocalCluster's scheduler and
  nannies live in the run's process);
- idle memory: the same sum once the workers are ready, before the timed part;
- objects left: with depot, the objects sealed in the store once the values are dropped
  (waiting up to 30 s for deletions to land): 0 if the run left nothing behind.

Runs alternate schedulers within each repetition (threads, processes, ..., threads, ...),
so drift hits all of them. Every run's values are checked against the threaded
scheduler's (a threaded run is added, unreported, when --schedulers has none): their count,
sum and sum weighted by position must agree within 1e-9 (relative); a run that differs, or
fails, is shown as FAILED and the benchmark exits with status 1.

Per workload, with medians over --repeat: wall time, and its ratio to the fastest other
scheduler's (below 1: faster than all the others) and LocalCluster's over it (the
issue's goal for depot: 3 or more); peak memory, and its ratio to the lowest other's
(goal for depot: 1 or less); idle memory; objects left (the most over the runs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import _measured  # beside this script

MiB = 1 << 20
SCHEDULERS = ("threads", "processes", "local", "local-depot", "depot", "depot-unfused")
OPTIONAL_SCHEDULERS = ("depot-bound", "depot-spill-bound", "depot-gpu", "depot-nothing-fused")


# The workloads: each returns the collections that one dask.compute runs.


def _array(args, chunks) -> Any:
    import dask.array as da

    return da.random.RandomState(0).random_sample((args.n, args.n), chunks=chunks)


def _product(args) -> tuple:
    a = _array(args, args.chunk)
    return ((a * a.T).sum(),)


def _rechunk(args) -> tuple:
    a = _array(args, (args.chunk, args.n))
    return (a.rechunk((args.n, args.chunk), method="tasks").sum(),)


def _elementwise(args) -> tuple:
    import numpy as np

    a = _array(args, args.chunk)
    a = np.sqrt((a + 1) * 2)
    a = np.abs(np.log(a) - 0.25)
    a = np.exp(np.sin(a) ** 2) / 3
    return (a.sum(),)


def _chain(args) -> tuple:
    import numpy as np

    a = _array(args, (args.chunk, args.n)).rechunk((args.n, args.chunk), method="tasks")
    a = np.sqrt((a + 1) * 2)
    a = np.abs(np.log(a) - 0.25)
    a = np.exp(np.sin(a) ** 2) / 3
    return (a.sum(),)


def _tree(args) -> tuple:
    a = _array(args, (max(1, args.chunk // 4), args.chunk))
    return (a.var(axis=0, split_every=2),)


def _frame(args) -> Any:
    import dask.array as da
    import dask.dataframe as dd

    rows = da.random.RandomState(0).random_sample(
        (args.rows, 4), chunks=(-(-args.rows // args.partitions), 4)
    )
    df = dd.from_dask_array(rows, columns=["a", "b", "c", "d"])
    return df.assign(k=(df["b"] * 1000).astype("int64"))


def _groupby(args) -> tuple:
    by_key = _frame(args).groupby("k")
    return (by_key.agg({"a": "mean", "c": "sum", "d": "max"}, split_out=1),)


def _set_index(args) -> tuple:
    return (_frame(args).set_index("a", shuffle_method="tasks").sum(),)


def _delayed(args) -> tuple:
    import operator

    from dask import delayed

    return tuple(delayed(operator.add)(i, 1) for i in range(args.delayed))


# The paging workload's function and its GPU form for simulated GPUs, whose memory is host
# memory: the form reads its input there and returns its result as an array said to be on
# the GPU (__cuda_array_interface__), which the worker stores in the GPU's pool. (With CuPy
# and a real GPU, NumPy's functions are their own GPU forms.)


class _OnSimulatedGpu:
    def __init__(self, array: Any) -> None:
        self.array = array  # kept alive until stored
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "strides": None,
            "data": (array.ctypes.data, False), "version": 3, "stream": None,
        }


def _host(block: Any) -> Any:
    """A block as numpy: a simulated GPU's DeviceArray over its memory, or as it is."""
    import ctypes

    import numpy as np

    if isinstance(block, _OnSimulatedGpu):
        return block.array
    if type(block).__name__ == "DeviceArray":
        raw = (ctypes.c_char * block.nbytes).from_address(block.ptr)
        return np.frombuffer(raw, dtype=block.dtype).reshape(block.shape)
    return block


def _scale(block: Any) -> Any:
    return block * 0.5 + 1


def _scale_on_gpu(block: Any) -> Any:
    return _OnSimulatedGpu(_host(block) * 0.5 + 1)


def _block_sum(block: Any) -> Any:
    return _host(block).sum(axis=-1, keepdims=True)


def _paging(args) -> tuple:
    import dask.array as da

    import depot.dask

    depot.dask.register_gpu(_scale, _scale_on_gpu)
    depot.dask.register_gpu(_block_sum, _block_sum)
    side = args.paging_block // 8
    x = da.random.RandomState(0).random_sample((args.paging_blocks, side), chunks=(1, side))
    scaled = depot.dask.offload(x.map_blocks(_scale))
    return (scaled.map_blocks(_block_sum, chunks=(1, 1)),)


WORKLOADS: Dict[str, Callable[[Any], tuple]] = {
    "product": _product,
    "rechunk": _rechunk,
    "elementwise": _elementwise,
    "chain": _chain,
    "tree": _tree,
    "groupby": _groupby,
    "set_index": _set_index,
    "delayed": _delayed,
}
OPTIONAL_WORKLOADS = {"paging": _paging}
# Computed with Dask's graph optimisation off, so that each block is made apart from the
# task that pages it through the GPU (fused, a task would make its block where it runs).
UNOPTIMIZED = {"paging"}


def _digest(values: tuple) -> List[float]:
    """What a run's values are checked by: their count, sum, and sum weighted by position
    (frames in the order of their index)."""
    import numpy as np

    flat = []
    for value in values:
        if hasattr(value, "sort_index"):
            value = value.sort_index()
        flat.append(np.ravel(np.asarray(value, dtype=np.float64)))
    v = np.concatenate(flat)
    return [float(v.size), float(v.sum()), float((v * np.arange(v.size)).sum())]


# The schedulers, as a run starts them.


class _Started:
    """A scheduler with its workers started: the dask.config settings that make
    dask.compute use it, and depot's client where a depotd keeps results (else None)."""

    def __init__(self, config: Dict[str, Any], store: Any = None) -> None:
        self.config = config
        self.store = store


@contextlib.contextmanager
def _threads(args) -> Iterator[_Started]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(args.workers) as pool:
        yield _Started({"scheduler": "threads", "pool": pool})


@contextlib.contextmanager
def _processes(args) -> Iterator[_Started]:
    """The pool dask.multiprocessing.get would make, made ahead so that its start is not
    timed."""
    from concurrent.futures import ProcessPoolExecutor

    import dask.multiprocessing as dm

    if os.environ.get("PYTHONHASHSEED") in (None, "0"):
        os.environ["PYTHONHASHSEED"] = "6640"  # as Dask sets it for its own pools
    with ProcessPoolExecutor(
        args.workers, mp_context=dm.get_context(), initializer=dm.initialize_worker_process
    ) as pool:
        # One task each, submitted apart: the pool starts a process for each (Dask's own
        # warm-up below would hand them over in one batch, to one process).
        pids = set(pool.map(_warm, range(args.workers)))
        if len(pids) != args.workers:
            raise RuntimeError(f"{len(pids)} of the {args.workers} pool processes started")
        yield _Started({"scheduler": "processes", "pool": pool})


@contextlib.contextmanager
def _local(args, with_depot: bool = False) -> Iterator[_Started]:
    import logging

    from distributed import LocalCluster

    with contextlib.ExitStack() as stack:
        store = None
        if with_depot:  # first, so that it stops after the workers
            import depot

            daemon = stack.enter_context(depot.start_daemon(args.store_memory, prefault=False))
            store = daemon.client()
            stack.callback(store.close)
        cluster = stack.enter_context(LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True,
            dashboard_address=":0", silence_logs=logging.CRITICAL,
        ))
        client = stack.enter_context(cluster.get_client())
        if store is not None:
            import depot.dask

            client.register_plugin(depot.dask.DepotNannyPlugin())
            client.register_plugin(depot.dask.DepotPlugin(socket=store.socket))
        yield _Started({"scheduler": client}, store)


@contextlib.contextmanager
def _depot(args, fuse: bool = True, memory: Optional[str] = None) -> Iterator[_Started]:
    import depot.dask

    with depot.dask.Scheduler(
        workers=args.workers, memory=memory or args.store_memory, fuse=fuse
    ) as scheduler:
        yield _Started({"scheduler": scheduler.get}, scheduler.client)


@contextlib.contextmanager
def _depot_spill_bound(args) -> Iterator[_Started]:
    """depot-spill-bound: a daemon with a spill directory, and the graph's bound on it."""
    import tempfile

    import depot.dask

    with tempfile.TemporaryDirectory(dir="/var/tmp") as spill, depot.dask.Scheduler(
        workers=args.workers, memory=args.store_memory, spill_dir=os.path.join(spill, "spill")
    ) as daemon, depot.dask.Scheduler(socket=daemon.client.socket, memory=args.bound) as bounded:
        yield _Started({"scheduler": bounded.get}, daemon.client)


@contextlib.contextmanager
def _depot_gpu(args) -> Iterator[_Started]:
    """depot with a simulated GPU of --gpu-pool, the first worker's."""
    import depot.dask

    with depot.dask.Scheduler(
        workers=args.workers, memory=args.store_memory, gpus=1,
        simulate_gpus=f"1:{args.gpu_pool}",
    ) as scheduler:
        yield _Started({"scheduler": scheduler.get}, scheduler.client)


def _started(scheduler: str, args) -> contextlib.AbstractContextManager:
    if scheduler == "depot-gpu":
        return _depot_gpu(args)
    if scheduler == "local-depot":
        return _local(args, with_depot=True)
    if scheduler in ("depot-unfused", "depot-nothing-fused"):
        return _depot(args, fuse=False)
    if scheduler == "depot-bound":
        return _depot(args, memory=args.bound)
    if scheduler == "depot-spill-bound":
        return _depot_spill_bound(args)
    return {"threads": _threads, "processes": _processes, "local": _local,
            "depot": _depot}[scheduler](args)


# One run, in a process of its own (--child).


def _warm(_: int) -> int:
    """A warm-up task: what the workloads import, and long enough that every worker gets
    one. Returns the pid of the process it ran in."""
    import dask.array  # noqa: F401
    import dask.dataframe  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    time.sleep(0.2)
    return os.getpid()


def _objects_left(store) -> int:
    """The objects sealed in the store, once deletions under way have landed (30 s)."""
    deadline = time.monotonic() + 30
    while store.status().objects_sealed and time.monotonic() < deadline:
        time.sleep(0.05)
    return store.status().objects_sealed


def _child(kind: str, scheduler: str, args, say: Callable[..., None]) -> None:
    import gc

    import dask

    # The modules the workloads use, imported here (where the graphs are built) before the
    # scheduler starts, as a script imports them at its top; then in every worker: the
    # threaded scheduler's warm-up imports them in this process, and the others' would not,
    # leaving their first import (0.3 to 0.6 s) in the timed run. depot's workers are forked
    # with those this process has imported already loaded (start_daemon's preloads).
    _warm(0)
    with _started(scheduler, args) as started, dask.config.set(started.config):
        dask.compute(*[dask.delayed(_warm)(i) for i in range(2 * args.workers)])
        _measured.go(say)
        workload = {**WORKLOADS, **OPTIONAL_WORKLOADS}[kind]
        optimize = kind not in UNOPTIMIZED and scheduler != "depot-nothing-fused"
        start = time.perf_counter()
        values = dask.compute(*workload(args), optimize_graph=optimize)
        seconds = time.perf_counter() - start
        first = _digest(values)
        del values
        gc.collect()
        start = time.perf_counter()
        values = dask.compute(*workload(args), optimize_graph=optimize)
        warm = time.perf_counter() - start
        say("done")
        digest = _digest(values)
        why = _differs(first, digest)
        if why:
            raise RuntimeError(f"the first compute's values differ from the second's: {why}")
        del values
        gc.collect()
        left = None if started.store is None else _objects_left(started.store)
        disk = None if started.store is None else started.store.status().disk
        spills = disk.spills if disk is not None and disk.enabled else None
        say("result", seconds=seconds, warm_seconds=warm, digest=digest, objects_left=left,
            disk_spills=spills)


# The benchmark's side of a run.


def _run(kind: str, scheduler: str, args, extra: Optional[List[str]] = None) -> Dict[str, Any]:
    """One run of a workload on a scheduler, in a fresh process (_measured.run_child): its
    figures, or {"error": why}. ``extra``: arguments for the run beyond the benchmark's own."""
    run = _measured.run_child if args.sampled_times else _measured.run_apart
    return run(__file__, f"{kind}:{scheduler}", sys.argv[1:] + (extra or []), args.timeout)


def _differs(digest: List[float], reference: List[float]) -> Optional[str]:
    return _measured.differs(digest, reference, rel_tol=1e-9)


def _runs(kind: str, args, schedulers: List[str]) -> Dict[str, List[Dict[str, Any]]]:
    """--repeat runs of the workload on each scheduler, alternating, each checked against
    the threaded scheduler's values."""
    reference = None
    if "threads" not in schedulers:
        reference = _run(kind, "threads", args).get("digest")
    runs: Dict[str, List[Dict[str, Any]]] = {s: [] for s in schedulers}
    for _ in range(args.repeat):
        for scheduler in schedulers:
            extra = None
            if scheduler in ("depot-bound", "depot-spill-bound") and args.bound == "half":
                local = runs.get("local", [])
                if not local or "peak_memory" not in local[-1]:
                    runs[scheduler].append({"error": "--bound half needs a run of local before"})
                    continue
                extra = ["--bound", str(local[-1]["peak_memory"] // 2)]
            run = _run(kind, scheduler, args, extra)
            if extra:
                run["bound"] = int(extra[1])
            if "digest" in run:
                reference = reference or run["digest"]
                why = _differs(run["digest"], reference)
                if why:
                    run["error"] = why
            if "error" in run:
                print(f"  {kind} on {scheduler} FAILED: {run['error']}", flush=True)
            runs[scheduler].append(run)
    return runs


# The report.


def _medians(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, float]]:
    """Each scheduler's median figures, over its runs that did not fail (none if one did)."""
    med = {}
    for scheduler, rs in runs.items():
        if rs and not any("error" in r for r in rs):
            med[scheduler] = {
                key: statistics.median(r[key] for r in rs)
                for key in ("seconds", "warm_seconds", "peak_memory", "idle_memory")
            }
    return med


def _ratio(a: float, b: Optional[float]) -> str:
    return f"{a / b:.2f}" if b else "-"


def _report(kind: str, runs: Dict[str, List[Dict[str, Any]]]) -> None:
    med = _medians(runs)
    print(f"\n{kind}:")
    print(f"  {'scheduler':12}{'first s':>9}{'/fastest':>10}{'again s':>9}{'/fastest':>10}"
          f"{'local/':>8}{'peak MiB':>10}{'/lowest':>9}{'idle MiB':>10}{'objects left':>14}")
    local = med.get("local", {}).get("warm_seconds")
    for scheduler, rs in runs.items():
        if scheduler not in med:
            print(f"  {scheduler:12}FAILED: {next(r['error'] for r in rs if 'error' in r)}")
            continue
        m = med[scheduler]
        others = [v for s, v in med.items() if s != scheduler]
        fastest = min((o["seconds"] for o in others), default=None)
        fastest_again = min((o["warm_seconds"] for o in others), default=None)
        lowest = min((o["peak_memory"] for o in others), default=None)
        left = [r["objects_left"] for r in rs if r["objects_left"] is not None]
        print(f"  {scheduler:12}{m['seconds']:9.2f}{_ratio(m['seconds'], fastest):>10}"
              f"{m['warm_seconds']:9.2f}{_ratio(m['warm_seconds'], fastest_again):>10}"
              f"{_ratio(local, m['warm_seconds']) if local else '-':>8}"
              f"{m['peak_memory'] / MiB:10.0f}{_ratio(m['peak_memory'], lowest):>9}"
              f"{m['idle_memory'] / MiB:10.0f}{max(left) if left else '-':>14}")
    for scheduler, rs in runs.items():
        spills = [r["disk_spills"] for r in rs if r.get("disk_spills") is not None]
        if spills:
            print(f"  {scheduler}: {statistics.median(spills):.0f} objects spilled to disk a run")
    bounds = [r["bound"] for s in ("depot-bound", "depot-spill-bound")
              for r in runs.get(s, []) if "bound" in r]
    if bounds:
        print(f"  depot-bound: memory= {statistics.median(bounds) / MiB:.0f} MiB (half of "
              f"LocalCluster's peak in the same repetition)")


def _sizes(args) -> str:
    n, chunk = args.n, args.chunk
    return (
        f"{args.workers} workers; array {n}x{n} float64 = {n * n * 8 / MiB:.0f} MiB in "
        f"chunks of {chunk}x{chunk} = {chunk * chunk * 8 / MiB:.1f} MiB; dataframe "
        f"{args.rows} rows x 4 float64 = {args.rows * 32 / MiB:.0f} MiB in "
        f"{args.partitions} partitions; {args.delayed} delayed tasks; load average "
        f"{open('/proc/loadavg').read().split()[0]}"
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--n", type=int, default=6000, help="the arrays' side")
    parser.add_argument("--chunk", type=int, default=1000, help="the arrays' chunks' side")
    parser.add_argument("--rows", type=int, default=1_000_000, help="the dataframe's rows")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--delayed", type=int, default=10_000, help="delayed tasks")
    parser.add_argument("--store-memory", default="50%", help="depotd's --memory")
    parser.add_argument("--bound", default="half",
                        help="depot-bound's and depot-spill-bound's memory=: a size, or half "
                        "of LocalCluster's peak")
    parser.add_argument("--paging-blocks", type=int, default=64, help="paging's blocks")
    parser.add_argument("--paging-block", type=int, default=4 * MiB, help="paging's block bytes")
    parser.add_argument("--gpu-pool", default="64MiB", help="depot-gpu's simulated GPU")
    parser.add_argument("--timeout", type=float, default=600, help="seconds, per run")
    parser.add_argument(
        "--sampled-times", action="store_true",
        help="time the run whose memory is sampled (one run, not two: the sampling's CPU "
        "time then slows the run)",
    )
    parser.add_argument("--json", action="store_true", help="print every run's figures as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # WORKLOAD:SCHEDULER, one run
    args = parser.parse_args()
    _measured.check_choices(parser, args, {"workloads": (*WORKLOADS, *OPTIONAL_WORKLOADS),
                                           "schedulers": SCHEDULERS + OPTIONAL_SCHEDULERS})
    return args


def main() -> None:
    args = _arguments()
    if args.child:
        kind, scheduler = args.child.split(":")
        _measured.child_main(lambda say: _child(kind, scheduler, args, say))
        return
    schedulers = args.schedulers.split(",")
    schedulers.sort(key=lambda s: s != "threads")  # the reference first
    print(_sizes(args), flush=True)
    figures = {}
    for kind in args.workloads.split(","):
        figures[kind] = _runs(kind, args, schedulers)
        _report(kind, figures[kind])
    _measured.finish(args, figures)


if __name__ == "__main__":
    main()
