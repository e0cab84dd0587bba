"""The examples in examples/ run from a fresh interpreter and check their own results."""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


@pytest.mark.parametrize(
    "script, args, expect",
    [
        ("map_chunks.py", ["--chunks", "8", "--chunk-mib", "2"], "0 bytes moved"),
        ("tree_reduction.py", ["--leaves", "32", "--leaf-mib", "2"], "every element is 496"),
        ("dask_arrays.py", ["--size", "2000", "--chunk", "500"],
         "the threaded scheduler's result; 0 objects left in the store"),
        ("cubed_matmul.py", ["--size", "1000", "--chunk", "250"],
         "numpy's result; arrays left in the store: 3 (the 3 computed)"),
        # Simulated GPUs here (the example uses CuPy on real ones when it finds them).
        ("gpu_pipeline.py", ["--chains", "6", "--mib", "4", "--simulate"],
         "every sum right; 0 bytes moved, 0 replicas made"),
    ],
)
def test_example_runs(script, args, expect):
    run = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), *args],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert expect in run.stdout
