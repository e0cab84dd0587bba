#!/usr/bin/env python3
"""depot.aio (issue 36): N concurrent awaits of objects another process seals later, on one
event loop; how long until all are answered after the last seal, and the longest the loop
went without turning meanwhile.

  python bench/python/bench_aio.py [--awaits 1000] [--repeat 3]

Needs the depot package installed (`make test-python`'s venv: build-py/venv/bin/python).
Each run starts a private depotd; the objects (small ints) are put by a child process, so
that nothing in this process but the loop holds the GIL.

Compared in the same run with what an asyncio program does without depot.aio: each await
runs a blocking ``Client.get`` in a worker thread (``asyncio.to_thread``, the loop's default
executor), and with the blocking gets alone, on N threads of their own (``threads``).

Reported per way: `last seal -> all answered` (ms, median of the runs), `loop max gap` (the
longest interval between two turns of a monitor task, ms, worst of the runs: on a busy
machine it includes the time the OS did not run the loop's thread), `of it CPU` (the most
CPU time the loop's thread spent between two turns: the loop's own work), and the
daemon's get and wait requests per await.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time

import depot
import depot.aio

PUTTER = """
import depot, sys, time
client = depot.Client(sys.argv[1])
n = int(sys.argv[2])
sys.stdin.readline()
for i in range(n):
    client.put(i, name="bench-aio/%d" % i)
print(time.perf_counter(), flush=True)
"""


def requests_of(client, kind):
    for line in client.metrics().splitlines():
        if line.startswith(f'depot_requests_total{{type="{kind}"}} '):
            return int(line.split()[-1])
    return 0


def start_putter(socket, n):
    child = subprocess.Popen(
        [sys.executable, "-c", PUTTER, socket, str(n)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    return child


def finish_putter(child):
    last_seal = float(child.stdout.readline())
    child.wait(60)
    return last_seal


async def run_loop(socket, n, way):
    """One run: start n awaits, let the putter seal them, wait for all. Returns (ms from the
    last seal to all answered, loop max gap ms)."""
    stop = asyncio.Event()
    longest = [0.0, 0.0]  # wall, and this thread's CPU time

    async def monitor():
        last = (time.perf_counter(), time.thread_time())
        while not stop.is_set():
            await asyncio.sleep(0)
            now = (time.perf_counter(), time.thread_time())
            for k in range(2):
                longest[k] = max(longest[k], now[k] - last[k])
            last = now

    names = [f"bench-aio/{i}" for i in range(n)]
    child = start_putter(socket, n)  # before the monitor: starting a process blocks the loop
    if way == "depot.aio":
        client = depot.aio.AsyncClient(socket)
        awaits = [asyncio.ensure_future(client.get(name)) for name in names]
    else:
        blocking = depot.Client(socket)
        awaits = [asyncio.ensure_future(asyncio.to_thread(blocking.get, name)) for name in names]
    await asyncio.sleep(0.2)  # every await started (threads: as many as the executor has)
    watching = asyncio.ensure_future(monitor())
    await asyncio.sleep(0)  # the monitor runs from here on
    child.stdin.write("go\n")
    child.stdin.flush()
    values = await asyncio.gather(*awaits)
    done = time.perf_counter()
    stop.set()
    await watching
    last_seal = finish_putter(child)
    assert values == list(range(n))
    if way == "depot.aio":
        await client.close()
    else:
        blocking.close()
    return (done - last_seal) * 1000, longest[0] * 1000, longest[1] * 1000


def run_threads(socket, n):
    """The blocking gets alone, each on a thread of its own."""
    client = depot.Client(socket)
    values = [None] * n
    finished = []

    def one(i):
        values[i] = client.get(f"bench-aio/{i}")
        finished.append(time.perf_counter())

    child = start_putter(socket, n)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    child.stdin.write("go\n")
    child.stdin.flush()
    for t in threads:
        t.join()
    last_seal = finish_putter(child)
    assert values == list(range(n))
    client.close()
    return (max(finished) - last_seal) * 1000, float("nan"), float("nan")


def measure(way, n, repeat):
    after, gaps, cpu_gaps, per_await = [], [], [], []
    for _ in range(repeat):
        with depot.start_daemon(memory="512MiB") as daemon, daemon.client() as observer:
            before = requests_of(observer, "get") + requests_of(observer, "wait")
            if way == "threads":
                a, g, c = run_threads(daemon.socket, n)
            else:
                a, g, c = asyncio.run(run_loop(daemon.socket, n, way))
            after.append(a)
            gaps.append(g)
            cpu_gaps.append(c)
            per_await.append(
                (requests_of(observer, "get") + requests_of(observer, "wait") - before) / n
            )
    return statistics.median(after), max(gaps), max(cpu_gaps), statistics.median(per_await)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--awaits", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.awaits} awaits of objects sealed later by another process; {args.repeat} runs")
    print(f"{'way':<16}{'last seal -> all (ms)':>23}{'loop max gap (ms)':>19}"
          f"{'of it CPU (ms)':>16}{'requests/await':>16}")
    results = {}
    for way in ("depot.aio", "to_thread(get)", "threads"):
        results[way] = measure(way, args.awaits, args.repeat)
        a, g, c, r = results[way]
        print(f"{way:<16}{a:>23.1f}{g:>19.2f}{c:>16.2f}{r:>16.2f}")
    base = results["to_thread(get)"][0]
    print(f"depot.aio / to_thread(get), last seal -> all: {results['depot.aio'][0] / base:.2f}")


if __name__ == "__main__":
    main()
