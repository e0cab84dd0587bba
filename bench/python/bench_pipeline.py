#!/usr/bin/env python3
"""A two-stage pipeline passing 100 MB numpy arrays between tasks (issue 13): on depot, and on
Ray and Dask when they are installed, with the same number of worker processes.

  python bench/python/bench_pipeline.py [--workers 2] [--chains 8] [--mb 100] [--repeat 3]

Stage 1 makes K arrays of --mb megabytes (`np.full`, a task each); stage 2 runs K tasks,
task j reading arrays j and j+1 (mod K), so about half of what stage 2 reads was made by
another worker process; each returns a few numbers. Timed: from the first submit to the
last result, best of --repeat runs, with the arrays dropped between runs. Baseline in the
same run: np.copyto of one array (memcpy of --mb megabytes) in this process.

depot: `client.submit` of functions sent by value on `start_daemon(workers=W)`; an array a
task returns is stored in the host arena, and the next stage maps it with no copy.
`depot*`: the same, with stage 1 filling its output where it is stored
(`depot.output_array`) instead of returning a private array the worker copies in. Ray:
`@ray.remote` tasks on `ray.init(num_cpus=W)`, arrays in its plasma store. Dask:
`client.submit` on a `LocalCluster` of W single-threaded worker processes (arrays stay in
the worker that made them and travel to another over its comms).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import depot


def make(seed, n):
    return np.full(n, float(seed))


def make_in_place(seed, n):
    """make, filling its output where it is stored (depot.output_array): no private array
    to copy into the store afterwards."""
    out = depot.output_array(n, "float64")
    out.fill(float(seed))
    return out


def combine(a, b):
    return float(a[0] + b[-1]), a.nbytes + b.nbytes


def memcpy_baseline(n: int, repeat: int = 5) -> float:
    src = np.full(n, 1.0)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return best


def check(results, chains: int, n: int) -> None:
    for j, (value, nbytes) in enumerate(results):
        assert value == float(j + (j + 1) % chains), (j, value)
        assert nbytes == 16 * n


def bench_depot(workers: int, chains: int, n: int, repeat: int, maker=make) -> float:
    memory = f"{max(2048, 3 * chains * n * 8 >> 20)}MiB"
    with depot.start_daemon(memory=memory, workers=workers) as daemon, daemon.client() as c:
        c.get_many([c.submit(make, 0, 1), c.submit(combine, np.ones(1), np.ones(1))], timeout=60)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            arrays = [c.submit(maker, i, n) for i in range(chains)]
            outs = [c.submit(combine, arrays[j], arrays[(j + 1) % chains]) for j in range(chains)]
            results = c.get_many(outs, timeout=600)
            best = min(best, time.perf_counter() - start)
            check(results, chains, n)
            c.delete(arrays + outs)
    return best


def bench_ray(workers: int, chains: int, n: int, repeat: int):
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             object_store_memory=max(2 << 30, 3 * chains * n * 8))
    try:
        remote_make = ray.remote(make)
        remote_combine = ray.remote(combine)
        ray.get(remote_combine.remote(remote_make.remote(0, 1), remote_make.remote(1, 1)))
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            arrays = [remote_make.remote(i, n) for i in range(chains)]
            outs = [remote_combine.remote(arrays[j], arrays[(j + 1) % chains])
                    for j in range(chains)]
            results = ray.get(outs)
            best = min(best, time.perf_counter() - start)
            check(results, chains, n)
            del arrays, outs
    finally:
        ray.shutdown()
    return best


def bench_dask(workers: int, chains: int, n: int, repeat: int):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        return None
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit=0) as cluster, Client(cluster) as client:
        client.submit(combine, client.submit(make, 0, 1), client.submit(make, 1, 1)).result()
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            arrays = [client.submit(make, i, n, pure=False) for i in range(chains)]
            outs = [client.submit(combine, arrays[j], arrays[(j + 1) % chains], pure=False)
                    for j in range(chains)]
            results = client.gather(outs)
            best = min(best, time.perf_counter() - start)
            check(results, chains, n)
            del arrays, outs
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--mb", type=int, default=100, help="each array, in megabytes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-dask", action="store_true")
    args = parser.parse_args()

    n = args.mb * 1_000_000 // 8
    copy = memcpy_baseline(n)
    print(f"baseline memcpy of {args.mb} MB: {copy * 1e3:.2f} ms")
    print(f"{'system':8} {'workers':>7} {'chains':>6} {'total':>10} {'per array':>10} "
          f"{'x memcpy':>9}")
    totals = {}
    runs = [
        ("depot", bench_depot),
        ("depot*", lambda *a: bench_depot(*a, maker=make_in_place)),
    ]
    if not args.no_ray:
        runs.append(("ray", bench_ray))
    if not args.no_dask:
        runs.append(("dask", bench_dask))
    for system, bench in runs:
        total = bench(args.workers, args.chains, n, args.repeat)
        if total is None:
            print(f"{system:8} {args.workers:7d}  (not installed)")
            continue
        totals[system] = total
        per = total / args.chains
        print(f"{system:8} {args.workers:7d} {args.chains:6d} {total * 1e3:8.1f} ms "
              f"{per * 1e3:7.1f} ms {per / copy:9.2f}")
    others = [totals[s] for s in ("ray", "dask") if s in totals]
    if others:
        fastest = min(others)
        print(f"fastest of Ray and Dask / depot: {fastest / totals['depot']:.2f}x, "
              f"/ depot*: {fastest / totals['depot*']:.2f}x")


if __name__ == "__main__":
    main()
