#!/usr/bin/env python3
"""A data-parallel map over numpy chunks: each chunk is put once, each task reads its chunk
where it lies (no copy) and returns a small summary; then one task combines them.

    python examples/map_chunks.py [--workers 2] [--chunks 16] [--chunk-mib 8]
"""

import argparse

import numpy as np

import depot


def summarize(chunk):
    return {"n": chunk.size, "sum": float(chunk.sum()), "max": float(chunk.max())}


def combine(*parts):
    return {
        "n": sum(p["n"] for p in parts),
        "mean": sum(p["sum"] for p in parts) / sum(p["n"] for p in parts),
        "max": max(p["max"] for p in parts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--chunk-mib", type=int, default=8)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    data = rng.random(args.chunks * args.chunk_mib * (1 << 20) // 8)
    with depot.start_daemon(memory="1GiB", workers=args.workers) as daemon, daemon.client() as c:
        chunks = [c.put(part) for part in np.array_split(data, args.chunks)]
        summaries = c.map(summarize, chunks)
        result = c.get(c.submit(combine, *summaries), timeout=120)
        moved = c.status().scheduler.moved_bytes
    assert result["n"] == data.size
    assert abs(result["mean"] - data.mean()) < 1e-9
    assert result["max"] == data.max()
    print(f"{result['n']} values in {args.chunks} chunks: mean {result['mean']:.6f}, "
          f"max {result['max']:.6f}; {moved} bytes moved between tiers")


if __name__ == "__main__":
    main()
