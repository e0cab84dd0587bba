#!/usr/bin/env python3
"""What depotd's pre-faulting costs in memory and saves in put speed.

  python bench/python/bench_arena_pages.py [--objects 96] [--mib 8] [--repeat 3]
      [--depotd PATH] [--baseline-depotd PATH]

For each daemon, a fresh one each repetition (4 GiB, segments of 1 GiB): after a second
(the pre-faulting it does at start-up is done), one client puts --objects numpy arrays of
--mib MiB each (a fresh arena: no page of theirs used before), deletes them, and puts them
again (the same pages, refilled). Measured: the put rate of each round, and the bytes the
daemon's files hold after the first round (the allocated blocks of its memfds), mapped by a
process or not. Daemons: --depotd (default: the one installed with the package) as it is
and with --no-prefault, and --baseline-depotd as it is, if given (an older build, to compare
policies). Baseline in the same run: np.copyto of the same arrays into a warm buffer.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import depot
from _memory import store_pages as _store_pages  # beside this script

MiB = 1 << 20


def _round(client: depot.Client, value: np.ndarray, count: int) -> tuple:
    start = time.perf_counter()
    refs = [client.put(value) for _ in range(count)]
    return time.perf_counter() - start, refs


def _run(executable, args, value, count) -> tuple:
    with depot.start_daemon(memory="4GiB", executable=executable, args=args) as daemon:
        with daemon.client() as client:
            time.sleep(1.0)  # start-up pre-faulting done, as in a daemon that has run a while
            fresh, refs = _round(client, value, count)
            time.sleep(0.5)  # pre-faulting asked for by the last puts done
            held = _store_pages(daemon.pid)
            client.delete(refs)
            del refs
            refilled, refs = _round(client, value, count)
            client.delete(refs)
            del refs
    return fresh, refilled, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=96)
    parser.add_argument("--mib", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--depotd", default=None, help="default: the package's depotd")
    parser.add_argument("--baseline-depotd", default=None)
    args = parser.parse_args()

    value = np.random.default_rng(0).random(args.mib * MiB // 8)
    total = args.objects * args.mib * MiB
    target = np.empty_like(value)
    np.copyto(target, value)
    start = time.perf_counter()
    for _ in range(args.objects):
        np.copyto(target, value)
    memcpy = total / (time.perf_counter() - start)
    print(f"{args.objects} puts of {args.mib} MiB; memcpy (warm) {memcpy / 2**30:.2f} GiB/s")
    daemons = [
        ("depotd", args.depotd, []),
        ("depotd --no-prefault", args.depotd, ["--no-prefault"]),
    ]
    if args.baseline_depotd:
        daemons.insert(0, ("baseline depotd", args.baseline_depotd, []))
    for label, executable, flags in daemons:
        runs = [_run(executable, flags, value, args.objects) for _ in range(args.repeat)]
        fresh = total / statistics.median(r[0] for r in runs)
        refilled = total / statistics.median(r[1] for r in runs)
        held = statistics.median(r[2] for r in runs)
        print(
            f"{label:22} fresh arena {fresh / 2**30:5.2f} GiB/s ({fresh / memcpy:.2f} of memcpy), "
            f"refilled {refilled / 2**30:5.2f} GiB/s ({refilled / memcpy:.2f}); "
            f"pages held after {total // MiB} MiB of puts: {held // MiB} MiB"
        )


if __name__ == "__main__":
    main()
