#!/usr/bin/env python3
"""A tree reduction: leaves made by tasks, summed pairwise by tasks, level by level, in a
store much smaller than all the intermediates together. The scheduler runs the sums of
existing data before making more leaves, and the graph lets go of each intermediate once
its reader is done, so the store's evictions keep up.

    python examples/tree_reduction.py [--workers 2] [--leaves 64] [--leaf-mib 4]
"""

import argparse

import numpy as np

import depot


def leaf(index, count):
    return np.full(count, float(index))


def add(a, b):
    return a + b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--leaves", type=int, default=64)
    parser.add_argument("--leaf-mib", type=int, default=4)
    args = parser.parse_args()
    if args.leaves & (args.leaves - 1):
        parser.error("--leaves is a power of two")

    count = args.leaf_mib * (1 << 20) // 8
    memory = 32 * args.leaf_mib  # MiB: far less than the leaves and sums together
    with depot.start_daemon(memory=f"{memory}MiB", segment_size=f"{memory // 2}MiB",
                            workers=args.workers) as daemon, daemon.client() as c:
        level = c.map(leaf, range(args.leaves), [count] * args.leaves)
        while len(level) > 1:
            level = c.map(add, level[0::2], level[1::2])
        total = c.get(level[0], timeout=300)
        evicted = c.status().evictions
    expected = float(sum(range(args.leaves)))
    assert total.shape == (count,) and np.all(total == expected)
    made = (2 * args.leaves - 1) * args.leaf_mib
    print(f"{2 * args.leaves - 1} tasks made {made} MiB of arrays in a {memory} MiB store "
          f"({evicted} evicted); every element is {expected:.0f}")


if __name__ == "__main__":
    main()
