#!/usr/bin/env python3
"""Cubed's matmul example (Cubed #284) run by depot's executor: each stage's tasks run on
depot's Python worker processes, the arrays between stages are Zarr arrays in the store's
shared memory (depot.zarr.Store), read by the next stage with no copy and deleted once it is
done. Checks the result against numpy, and what is left in the store.

    python examples/cubed_matmul.py [--workers 2] [--size 4000] [--chunk 1000]
"""

import argparse
import random
import time

import cubed.array_api as xp
import cubed.random
import numpy as np

import depot.cubed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=1000)
    args = parser.parse_args()
    shape, chunks = (args.size, args.size), (args.chunk, args.chunk)

    with depot.cubed.Executor(workers=args.workers, memory="2GiB") as executor:
        spec = executor.spec(allowed_mem="500MB")
        random.seed(0)  # cubed.random draws its seed from Python's generator
        a = cubed.random.random(shape, chunks=chunks, spec=spec)
        b = cubed.random.random(shape, chunks=chunks, spec=spec)
        product = xp.matmul(xp.astype(a, xp.float32), xp.astype(b, xp.float32))
        start = time.perf_counter()
        ours, a_values, b_values = cubed.compute(product, a, b)
        seconds = time.perf_counter() - start
        # What is left: the three arrays computed (for Cubed to read back), not one
        # intermediate; leaving the block deletes them.
        prefix = executor.prefix + "/"
        names = [o.name[len(prefix):] for o in executor.client.list() if o.name.startswith(prefix)]
        arrays = {name.split("/")[0] for name in names if "/" in name}
    theirs = a_values.astype(np.float32) @ b_values.astype(np.float32)
    assert np.allclose(ours, theirs, rtol=1e-4), np.abs(ours - theirs).max()
    print(f"{args.size}x{args.size} product in {seconds:.2f} s on {args.workers} workers: "
          f"numpy's result; arrays left in the store: {len(arrays)} (the 3 computed)")


if __name__ == "__main__":
    main()
