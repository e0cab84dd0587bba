"""Fused chains run a slab at a time (depot._dask_tiling): the same values as Dask's own run of
each fused task, temporaries of a slab's size, and chains it does not understand run whole.
In process: no daemon."""

import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import DataNode, Task, TaskRef, _execute_subgraph, execute_graph

from depot import _dask_tiling


def _fused_tasks(x):
    """The fused chains (Dask's ``_execute_subgraph`` tasks) of ``x``'s optimised graph, at
    its top level or inside another, each with the values of its arguments."""
    dsk = dict(x.__dask_optimize__(x.__dask_graph__(), x.__dask_keys__()))
    found = []
    fused = [v for v in dsk.values() if isinstance(v, Task) and v.func is _execute_subgraph]
    known = execute_graph(dsk, keys=set().union(*(v.dependencies for v in fused)))

    def value(arg, graph):
        if isinstance(arg, TaskRef):
            return known[arg.key] if graph is dsk else execute_graph(graph, keys=[arg.key])[arg.key]
        return arg.value if isinstance(arg, DataNode) else arg

    def visit(node, graph):
        if not (isinstance(node, Task) and node.func is _execute_subgraph):
            return
        inner, outkey, inkeys, *refs = node.args
        deps = [value(r, graph) for r in refs]
        found.append((inner, outkey, inkeys, deps))
        nested = dict(inner)
        nested.update({k: DataNode(k, v) for k, v in zip(inkeys, deps)})
        for child in inner.values():
            visit(child, nested)

    for node in dsk.values():
        visit(node, dsk)
    return found


def _both_ways(args):
    """The task's value run by Dask, and by depot a slab at a time, with the peak bytes
    NumPy allocated for each (tracemalloc)."""
    out = []
    for runner in (_execute_subgraph, _dask_tiling.execute_subgraph):
        tracemalloc.start()
        value = runner(args[0], args[1], args[2], *args[3])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out.append((value, peak))
    return out


def _tiles(args):
    """Whether depot runs the task's chain a slab at a time (rather than whole)."""
    inner, outkey, inkeys, deps = args
    try:
        _dask_tiling._run(_dask_tiling._Chain(inner, dict(zip(inkeys, deps)), outkey))
        return True
    except _dask_tiling._NotTiled:
        return False


def _rows(a):
    """``a`` in chunks of whole rows, 2 MiB each, for a rechunk to columns (a task that merges
    four slices of them)."""
    return a.rechunk((128, 2048))


def _chain(a):
    a = np.sqrt((a + 1) * 2)
    a = np.abs(np.log(a) - 0.25)
    return np.exp(np.sin(a) ** 2) / 3


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda a: _chain(a), id="elementwise"),
        pytest.param(lambda a: _chain(a).sum(), id="sum"),
        pytest.param(lambda a: _chain(a).max(axis=0), id="max-along-slabs"),
        pytest.param(lambda a: _chain(a).min(axis=1), id="min-across-slabs"),
        pytest.param(lambda a: (a * a.T).sum(), id="product-7449"),
        pytest.param(lambda a: (_chain(a) > 0.3).sum(), id="comparison"),
        pytest.param(lambda a: _rows(a).rechunk((2048, 512), method="tasks").sum(), id="merge-sum"),
        pytest.param(
            lambda a: _chain(_rows(a).rechunk((2048, 512), method="tasks")).sum(axis=1),
            id="merge-chain",
        ),
    ],
)
def test_a_fused_chain_gives_what_dask_gives_with_slab_sized_temporaries(make):
    # 2048 x 2048 float64 in chunks of 1024 x 1024: 8 MiB each, over LEAST_BYTES.
    a = da.random.default_rng(3).random((2048, 2048), chunks=1024)
    tiled = 0
    for args in _fused_tasks(make(a)):
        (want, whole_peak), (got, tiled_peak) = _both_ways(args)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert np.asarray(got).dtype == np.asarray(want).dtype
        if _tiles(args):
            tiled += 1
            output = np.asarray(got).nbytes
            # Whole, the chain makes chunk-sized temporaries; a slab at a time, its output and
            # a few slabs' worth.
            assert tiled_peak <= output + 4 * _dask_tiling.SLAB_BYTES, (tiled_peak, output)
            assert whole_peak >= 2**23, whole_peak
    assert tiled >= 4, "every chunk's chain runs a slab at a time"


def test_a_merge_fused_with_the_slices_it_reads_is_never_made():
    # depot's fusion runs a rechunk's splits inside the merge that reads them (Task.fuse of
    # the merge and its splits: one subgraph reading the row chunks). A slab of the merge is
    # a slice of one row chunk: the task's allocations are its output's few KiB and a slab's.
    a = da.random.default_rng(3).random((2048, 2048), chunks=(128, 2048))
    x = _chain(a.rechunk((2048, 512), method="tasks"))
    dsk = dict(x.__dask_optimize__(x.__dask_graph__(), x.__dask_keys__()))
    merges = [k for k, v in dsk.items() if isinstance(v, Task) and "rechunk-merge" in str(k)]
    assert merges
    rows = execute_graph(dsk, keys={d for k in merges for s in dsk[k].dependencies
                                    for d in dsk[s].dependencies})
    for key in merges:
        node = dsk[key]
        splits = [dsk[d] for d in node.dependencies]
        fused = Task.fuse(node, *splits, key=key)
        values = {d: rows[d] for d in fused.dependencies}
        args = (fused.args[0], fused.args[1], fused.args[2], [values[r.key] for r in fused.args[3:]])
        assert _tiles(args)
        (want, whole_peak), (got, tiled_peak) = _both_ways(args)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert tiled_peak <= np.asarray(got).nbytes + 4 * _dask_tiling.SLAB_BYTES, tiled_peak
        assert whole_peak >= 2**23, whole_peak  # the 8 MiB merge, at least


def test_chains_it_does_not_understand_or_too_small_to_gain_run_as_dask_runs_them():
    a = da.random.default_rng(3).random((2048, 2048), chunks=1024)
    row = da.random.default_rng(4).random((1, 2048), chunks=(1, 1024))
    small = da.random.default_rng(5).random((256, 256), chunks=128)
    class Unhashable:  # __eq__ without __hash__: a callable no set can hold
        def __eq__(self, other):
            return self is other

        def __call__(self, x):
            return x * 2

    cases = {
        "broadcast": (a + row).sum(),
        "mean (a dict of partial results)": _chain(a).mean(),
        "small chunks": _chain(small).sum(),
        "a reduction of the input alone": a.sum(),
        "a gufunc (matmul's core dimensions)": da.map_blocks(np.matmul, a + 1, a.T + 1).sum(),
        "an unhashable callable": da.map_blocks(Unhashable(), a + 1).sum(),
    }
    for name, x in cases.items():
        fused = _fused_tasks(x)
        assert fused, name
        for args in fused:
            assert not _tiles(args), name
            (want, _), (got, _) = _both_ways(args)
            if isinstance(want, dict):  # mean's partial results: counts and totals
                assert want.keys() == got.keys(), name
                for k in want:
                    np.testing.assert_array_equal(got[k], want[k])
            else:
                np.testing.assert_array_equal(got, want)


def test_a_chain_longer_than_the_recursion_limit_gives_dasks_values():
    # 600 operations: each is a level of recursion while a task is looked at and a slab
    # worked out, so past _MOST_OPERATIONS a task runs whole; whatever Dask fused into one
    # task, nothing but Dask's values comes out.
    x = da.random.default_rng(3).random((2048, 2048), chunks=1024)
    for _ in range(600):
        x = x + 1
    for args in _fused_tasks(x.sum()):
        (want, _), (got, _) = _both_ways(args)
        np.testing.assert_allclose(got, want, rtol=1e-12)
