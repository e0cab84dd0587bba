#!/usr/bin/env python3
"""depot.dask against plain Dask distributed, in the same run (issue 15).

  python bench/python/bench_dask.py [--n 16000] [--chunk 2000] [--workers 4] [--repeat 2]
      [--workloads product,persisted,rechunk,set_index,set_index_p2p] [--threshold 1MiB]
      [--segment-size SIZE] [--no-prefault]

Each workload runs on a LocalCluster of --workers worker processes (one thread each, Dask's
default memory limit: RAM / workers), once with plain Dask and once with every worker
attached to a depotd through depot.dask.DepotPlugin (--threshold), a fresh cluster (and
daemon) for each run, runs alternating.

- product: `a = da.random.random((n, n), chunks=chunk)` (seeded); (a * a.T).sum().compute()`. Chunk
  (j, i) of a must meet chunk (i, j), so most chunks cross to another worker.
- persisted: the same product of an `a` persisted first (in the workers' memory, or the
  store's, while the product runs), as a notebook that reuses `a` has it.
- rechunk: `da.random.random((n, n), chunks=(chunk, n)).rechunk((n, chunk), method="tasks")
  .sum().compute()`: rows to columns, every output chunk takes a piece of every input chunk.
- set_index: a dask.dataframe of --rows rows of 4 random float64 columns in --partitions
  partitions, `df.set_index("a", shuffle_method="tasks").sum().compute()`: every output
  partition takes a piece (a pandas DataFrame) of every input partition. Its pieces are
  small (rows / partitions^2), so run it with a --threshold below their size.
- set_index_mixed: the tasks shuffle of a frame of the same rows with columns of several
  kinds: a float key, datetimes, Arrow strings ("name-<n>", pandas' default string type with
  pyarrow) and a float; `.map_partitions(_digest).sum().compute()` after it.
- set_index_p2p: the same as set_index with Dask's own default for a distributed cluster,
  shuffle_method="p2p", whose shards travel through the shuffle extension's own messages,
  not as results: depot.dask leaves them alone (the reference for what plain Dask does best).

Measured, median over --repeat:
- wall time of compute();
- idle memory: the same sum as peak memory (below) before the computation (Python, numpy and
  distributed in each worker; the daemon and the pages it allocated ahead), which both sides
  pay;
- peak memory, sampled every 20 ms: the workers' and the daemon's PSS without its shared
  part (Pss - Pss_Shmem in /proc/PID/smaps_rollup: their private pages, each counted once)
  plus every page allocated in the store's files (the daemon's memfds, by their allocated
  blocks), whether or not a process maps it: depotd allocates a shared segment's pages
  ahead of use, and keeps pages an object freed for the next one, and no process's PSS
  counts a page that no process maps. With plain Dask it is the workers' PSS;
- peak PSS: the sum of PSS over the same processes, which counts each mapped page once and
  misses the store's pages that nobody maps (the figure these notes gave before 2026-11-27,
  which flattered depot);
- replicas at peak: at the sample of peak memory, the bytes of results held by more than one
  worker (Dask's scheduler's who_has), counted once per extra holder. In plain Dask each is
  a private copy, so plain Dask's peak over (its peak less them) bounds what any scheme
  that keeps each result once per host could save at that moment; with depot.dask the
  extra holders map the store's copy;
- bytes moved between workers: the sizes of the values workers sent one another, and the
  bytes they wrote to the comms for them (Worker.transfer_outgoing_log);
- with depot, the objects left in the store once the result is in and Dask has released
  the keys (waiting up to 30 s for the releases to reach the workers): 0 every time.
Baseline in the same run: one np.copyto of the whole array into a preallocated one (memcpy).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time

from _memory import pss as _pss, store_pages as _store_pages  # beside this script

MB = 1_000_000


def _replicas(dask_scheduler=None) -> int:
    """The bytes of results that more than one worker holds, each counted once per extra
    holder: what plain Dask keeps twice (or more) because a task on another worker needed
    it, and what sharing memory between workers could save at most."""
    return sum(
        ts.nbytes * (len(ts.who_has) - 1)
        for ts in dask_scheduler.tasks.values()
        if ts.who_has and len(ts.who_has) > 1 and ts.nbytes > 0
    )


class _Sampler(threading.Thread):
    def __init__(self, pids, daemon_pid=None, dask_client=None, interval=0.02):
        super().__init__(daemon=True)
        self.pids = pids
        self.daemon_pid = daemon_pid
        self.dask_client = dask_client
        self.interval = interval
        self.peak_pss = 0
        self.peak_memory = 0
        self.replicas_at_peak = 0
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            samples = [_pss(p) for p in self.pids]
            pss = sum(s for s, _ in samples)
            memory = pss - sum(m for _, m in samples)
            if self.daemon_pid is not None:
                memory += _store_pages(self.daemon_pid)
            if memory > self.peak_memory:
                self.peak_memory = memory
                if self.dask_client is not None:
                    self.replicas_at_peak = self.dask_client.run_on_scheduler(_replicas)
            self.peak_pss = max(self.peak_pss, pss)
            self._done.wait(self.interval)

    def stop(self):
        self._done.set()
        self.join()


def _transfers(peers, dask_worker=None):
    log = [t for t in dask_worker.transfer_outgoing_log if t["who"] in peers]
    return sum(t["total"] for t in log), sum(t["compressed"] or 0 for t in log)


def _workload(kind: str, args, client) -> float:
    import dask.array as da
    from distributed import wait

    n, chunk = args.n, args.chunk
    if kind.startswith("set_index"):
        import dask.dataframe as dd

        rows = da.random.RandomState(0).random_sample(
            (args.rows, 4), chunks=(-(-args.rows // args.partitions), 4)
        )
        df = dd.from_dask_array(rows, columns=["a", "b", "c", "d"])
        method = "p2p" if kind.endswith("p2p") else "tasks"
        if kind == "set_index_mixed":
            shuffled = df.map_partitions(_mixed_columns).set_index("a", shuffle_method=method)
            return client.compute(shuffled.map_partitions(_digest).sum()).result()
        return client.compute(df.set_index("a", shuffle_method=method).sum().sum()).result()
    if kind == "rechunk":
        a = da.random.RandomState(0).random_sample((n, n), chunks=(chunk, n))
        return client.compute(a.rechunk((n, chunk), method="tasks").sum()).result()
    a = da.random.RandomState(0).random_sample((n, n), chunks=chunk)
    if kind == "persisted":
        a = client.persist(a)
        wait(a)
    return client.compute((a * a.T).sum()).result()


def _mixed_columns(part):
    """A partition of 4 random float columns as one of a float key, datetimes, Arrow strings
    and a float."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = pa.array((part["b"].to_numpy() * 1000).astype("int64"))
    names = pc.binary_join_element_wise("name-", pc.cast(codes, pa.string()), "")
    return pd.DataFrame(
        {
            "a": part["a"].to_numpy(),
            "t": pd.to_datetime((part["c"].to_numpy() * 1e17).astype("int64")),
            "name": pd.arrays.ArrowStringArray(names),
            "d": part["d"].to_numpy(),
        },
        index=part.index,
    )


def _digest(part):
    """A float that reads every column of a partition."""
    import pandas as pd

    times = part["t"].to_numpy().view("int64") % 1000
    return pd.Series([float(part["d"].sum() + part["name"].str.len().sum() + times.sum())])


MODES = ("plain", "on-send", "always")


def _run(kind: str, mode: str, args) -> dict:
    import depot
    import depot.dask
    from distributed import LocalCluster

    with_depot = mode != "plain"
    daemon = store = None
    if with_depot:
        daemon = depot.start_daemon(
            memory=args.store_memory, segment_size=args.segment_size,
            prefault=not args.no_prefault,
        )
        store = daemon.client()
    try:
        with LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True,
            dashboard_address=":0", silence_logs=logging.CRITICAL,
        ) as cluster, cluster.get_client() as client:
            if with_depot:
                plugin = depot.dask.DepotPlugin(
                    socket=daemon.socket, keep=mode, threshold=args.threshold
                )
                client.register_plugin(plugin)
                client.register_plugin(depot.dask.DepotNannyPlugin())
            pids = list(client.run(os.getpid).values()) + ([daemon.pid] if daemon else [])
            idle = sum(_pss(p)[0] - _pss(p)[1] for p in pids)
            if daemon is not None:
                idle += _store_pages(daemon.pid)
            sampler = _Sampler(pids, daemon.pid if daemon else None, client)
            sampler.start()
            start = time.perf_counter()
            result = _workload(kind, args, client)
            seconds = time.perf_counter() - start
            sampler.stop()
            moved = client.run(_transfers, set(client.scheduler_info()["workers"]))
            if store is not None:  # what Dask has released must leave the store
                deadline = time.monotonic() + 30
                while store.status().objects_sealed and time.monotonic() < deadline:
                    time.sleep(0.05)
                leftover = store.status().objects_sealed
    finally:
        if store is not None:
            store.close()
        if daemon is not None:
            daemon.close()
    out = {
        "seconds": seconds,
        "idle_memory": idle,
        "peak_pss": sampler.peak_pss,
        "peak_memory": sampler.peak_memory,
        "replicas_at_peak": sampler.replicas_at_peak,
        "values_moved": sum(t for t, _ in moved.values()),
        "bytes_written": sum(w for _, w in moved.values()),
        "result": float(result),
    }
    if with_depot:
        out["objects_left"] = leftover
    return out


def _memcpy_seconds(n: int) -> float:
    import numpy as np

    src = np.random.random((n, n))
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16000)
    parser.add_argument("--chunk", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64_000_000, help="set_index's rows")
    parser.add_argument("--partitions", type=int, default=64, help="set_index's partitions")
    parser.add_argument("--threshold", default="1MiB", help="DepotPlugin's threshold")
    parser.add_argument("--store-memory", default="12GiB")
    parser.add_argument(
        "--segment-size", default=None, help="the daemon's --segment-size (default: depotd's)"
    )
    parser.add_argument(
        "--no-prefault", action="store_true", help="start the daemon with --no-prefault"
    )
    parser.add_argument("--workloads", default="product,persisted,rechunk")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args()

    memcpy = _memcpy_seconds(args.n)
    array_mb = args.n * args.n * 8 / MB
    print(
        f"array {args.n}x{args.n} float64 = {array_mb:.0f} MB in chunks of {args.chunk}; "
        f"dataframe {args.rows} x 4 float64 = {args.rows * 32 / MB:.0f} MB in "
        f"{args.partitions} partitions; {args.workers} workers; threshold {args.threshold}; "
        f"memcpy of the array {memcpy * 1e3:.0f} ms"
    )
    figures = {}
    for kind in args.workloads.split(","):
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeat):
            for mode in MODES:
                runs[mode].append(_run(kind, mode, args))
        figures[kind] = runs
        med = {
            mode: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "result"}
            for mode, rs in runs.items()
        }
        plain = med["plain"]
        print(f"\n{kind} (ratio: plain Dask's figure over depot.dask's):")
        print(f"  {'':24}{'plain Dask':>11}" + "".join(f"{'keep=' + m:>15}{'ratio':>10}" for m in MODES[1:]))
        rows = [
            ("wall time (s)", "seconds", 1),
            ("peak memory (MB)", "peak_memory", MB),
            ("peak PSS (MB)", "peak_pss", MB),
            ("replicas at peak (MB)", "replicas_at_peak", MB),
            ("idle memory (MB)", "idle_memory", MB),
            ("values moved (MB)", "values_moved", MB),
            ("bytes written (MB)", "bytes_written", MB),
        ]
        for label, key, unit in rows:
            line = f"  {label:24}{plain[key] / unit:11.2f}"
            for m in MODES[1:]:
                dep = med[m][key]
                ratio = plain[key] / dep if dep else float("inf")
                line += f"{dep / unit:15.2f}{ratio:9.2f}x"
            print(line)
        # The most that keeping each result once on the host can save of plain Dask's peak.
        bound = plain["peak_memory"] / max(1, plain["peak_memory"] - plain["replicas_at_peak"])
        print(f"  plain Dask's peak memory over the same less its replicas: {bound:.2f}x")
        print("  wall time / memcpy: " + ", ".join(
            f"{m} {med[m]['seconds'] / memcpy:.1f}" for m in MODES
        ) + "; objects left in the store: " + str(
            max(r["objects_left"] for m in MODES[1:] for r in runs[m])
        ))
        results = {r["result"] for rs in runs.values() for r in rs}
        print(f"  results: {sorted(results)}")
    if args.json:
        json.dump(figures, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
