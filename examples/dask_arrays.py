#!/usr/bin/env python3
"""A dask.array computation run by depot's scheduler: Python worker processes that read each
other's chunks from the store with no copy, and intermediates deleted as soon as their last
reader is done. Prints the plan first (the projected peak, stage by stage), runs the graph
with check=True (refused before anything runs if it cannot fit the store), and checks its
result against Dask's threaded scheduler.

    python examples/dask_arrays.py [--workers 2] [--size 4000] [--chunk 1000]
"""

import argparse
import time

import dask
import dask.array as da
import numpy as np

import depot.dask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=1000)
    args = parser.parse_args()

    x = da.random.RandomState(0).random((args.size, args.size), chunks=args.chunk)
    y = (x * x.T).sum() + (x + 1).std(axis=0).max()

    with depot.dask.Scheduler(workers=args.workers, memory="2GiB", check=True) as scheduler:
        print(scheduler.plan(y))
        start = time.perf_counter()
        (ours,) = dask.compute(y, scheduler=scheduler.get)
        seconds = time.perf_counter() - start
        # The daemon deletes each intermediate once its readers' workers let go of it, a
        # moment after they end: what is left once that has landed (10 s at most).
        deadline = time.monotonic() + 10
        while scheduler.client.list() and time.monotonic() < deadline:
            time.sleep(0.01)
        left = len(scheduler.client.list())
    theirs = y.compute(scheduler="threads")
    assert np.isclose(ours, theirs), (ours, theirs)
    print(f"{ours:.6f} in {seconds:.2f} s on {args.workers} workers: the threaded scheduler's "
          f"result; {left} objects left in the store")


if __name__ == "__main__":
    main()
