#!/usr/bin/env python3
"""Python tasks (issue 13): no-op task throughput and submit-to-result latency, against a
socket round trip of this process, and against Ray and Dask when they are installed.

  python bench/python/bench_tasks.py [--workers 1,2] [--tasks 20000] [--latency 2000]

Needs the depot package installed (`make test-python`'s venv: build-py/venv/bin/python).
Each configuration starts a private depotd with W worker processes
(depot.start_daemon(workers=W): a process per CPU slot).

1. throughput: `client.map(noop, range(N))` (batches of 1,000 submitted at once), then one
   get_many of every output; tasks per second, best of --repeat runs. The function is sent
   by value (a lambda): stored once, cached by the workers.
2. latency: submit of one no-op task, then get of its output, one at a time; median and p99.

Baselines in the same run: a Unix socket round trip between two threads of this process
(`socket_rtt`); with `pip install ray`, `ray.get([noop.remote() for ...])` and one
`ray.get(noop.remote())` at a time, on a local Ray with W worker CPUs; with `pip install
dask distributed`, `client.gather(client.map(...))` and `client.submit(...).result()` on a
`LocalCluster` of W single-threaded worker processes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import depot
from echo import EchoSocket


def noop(*args):
    return None


def socket_rtt(n: int = 20000) -> float:
    times = []
    with EchoSocket() as echo:
        for _ in range(n):
            start = time.perf_counter()
            echo.round_trip()
            times.append(time.perf_counter() - start)
    return statistics.median(times[n // 10 :])


def latencies(one_task, n: int):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        one_task()
        times.append(time.perf_counter() - start)
    times = sorted(times[n // 10 :])  # the first tenth warms up
    return statistics.median(times), times[int(len(times) * 0.99)]


def bench_depot(workers: int, tasks: int, latency_n: int, repeat: int):
    with depot.start_daemon(memory="1GiB", workers=workers) as daemon, daemon.client() as c:
        fn = lambda x: None  # noqa: E731 (sent by value)
        c.get_many(c.map(fn, range(1000)), timeout=120)  # warm: stored, loaded, cached
        best = 0.0
        for _ in range(repeat):
            start = time.perf_counter()
            refs = c.map(fn, range(tasks))
            c.get_many(refs, timeout=600)
            best = max(best, tasks / (time.perf_counter() - start))
            del refs
        median, p99 = latencies(lambda: c.get(c.submit(fn, 0), timeout=60), latency_n)
    return best, median, p99


def bench_ray(workers: int, tasks: int, latency_n: int, repeat: int):
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(noop)
        ray.get([remote.remote(i) for i in range(1000)])
        best = 0.0
        for _ in range(repeat):
            start = time.perf_counter()
            ray.get([remote.remote(i) for i in range(tasks)])
            best = max(best, tasks / (time.perf_counter() - start))
        median, p99 = latencies(lambda: ray.get(remote.remote(0)), latency_n)
    finally:
        ray.shutdown()
    return best, median, p99


def bench_dask(workers: int, tasks: int, latency_n: int, repeat: int):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        return None
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.gather(client.map(noop, range(1000), pure=False))
        best = 0.0
        for _ in range(repeat):
            start = time.perf_counter()
            client.gather(client.map(noop, range(tasks), pure=False))
            best = max(best, tasks / (time.perf_counter() - start))
        median, p99 = latencies(lambda: client.submit(noop, 0, pure=False).result(), latency_n)
    return best, median, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--latency", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-dask", action="store_true")
    args = parser.parse_args()

    rtt = socket_rtt()
    print(f"baseline socket_rtt: {rtt * 1e6:.2f} µs (median)")
    print(f"{'system':8} {'workers':>7} {'tasks/s':>10} {'per RTT':>8} "
          f"{'latency median':>15} {'p99':>9} {'x RTT':>7}")
    for w in (int(x) for x in args.workers.split(",")):
        runs = [("depot", bench_depot)]
        if not args.no_ray:
            runs.append(("ray", bench_ray))
        if not args.no_dask:
            runs.append(("dask", bench_dask))
        for system, bench in runs:
            result = bench(w, args.tasks, args.latency, args.repeat)
            if result is None:
                print(f"{system:8} {w:7d}  (not installed)")
                continue
            rate, median, p99 = result
            print(f"{system:8} {w:7d} {rate:10.0f} {rate * rtt:8.3f} "
                  f"{median * 1e6:12.1f} µs {p99 * 1e6:6.1f} µs {median / rtt:7.2f}")


if __name__ == "__main__":
    main()
