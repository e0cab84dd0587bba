"""Fused chains of elementwise operations run a slab at a time, in the processor's cache
(``depot.dask``'s part of issue 40, "fusion of what fits").

Dask fuses a chain of blockwise operations into one task, ``_execute_subgraph`` of the
chain's small graph, but still runs each operation on the whole chunk: ten operations on a
46 MiB chunk make ten 46 MiB temporaries, each written to memory and read back by the next,
and a reduction at the end of the chain (the first stage of ``x.sum()``) reads a whole
temporary only to throw it away. A rechunk's merge, which depot's fusion runs inside the
chain that reads it (depot._dask_fusion), first concatenates its pieces into a new chunk.
Here such a task runs on slabs of its result instead: consecutive pieces along its first
axis of about :data:`SLAB_BYTES` each, read straight from the task's inputs (a slab of a
merge from the piece it lies in, a slab of a slice from the sliced chunk) and kept in the
processor's cache from one operation to the next. A slab's results go into the output
(allocated once), or, for a chain that ends in a reduction, are reduced as they come: the
task's temporaries are slab-sized, whatever the chunk's size, and a merge is never made.

A task runs so only when all of it is understood; any other runs as Dask runs it (the
subgraphs inside it may still run so):

- its operations are elementwise (NumPy ufuncs with one output and no keywords, and the
  ``operator`` module's arithmetic and comparisons), on arrays of one shape and scalars (no
  broadcasting of arrays against each other), ``numpy.transpose``, slices of a chunk
  (``getitem`` with slices of step 1: a rechunk's splits) and the concatenation of
  chunks along their first axis (``concatenate_shaped``: a rechunk's merges), and fused
  subgraphs of those;
- its last operation may be a reduction along some axes with ``keepdims=True`` (what
  ``dask.array``'s ``sum``, ``prod``, ``max`` and ``min`` make of each chunk): partial
  results along the slab axis are combined with the reduction's own operation (``+``,
  ``*``, ``maximum``, ``minimum``), along any other axis they are placed side by side;
- it computes something (a reduction or an elementwise operation: a merge alone is left to
  NumPy's concatenation);
- its inputs are NumPy arrays (not subclasses, not CuPy: a GPU form runs whole), and its
  result before any reduction has at least :data:`LEAST_BYTES` (smaller chunks fit the
  cache already).

A sum over slabs adds in a different order than NumPy's pairwise sum of the whole chunk: the
result may differ in its last bits, as Dask's own results differ with the chunking.
"""

import functools
import itertools
import operator
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from ._dask_sizes import _getitems

SLAB_BYTES = 256 << 10
"""Bytes of the chain's widest array a slab holds: measured on a 2-core VM, a chain of ten
operations on 64 KiB to 1 MiB slabs ran in 0.70 of the whole chunk's time, on 4 MiB slabs
in 1.3 of it."""

LEAST_BYTES = 4 << 20
"""Results (before the reduction) smaller than this run whole."""

_OPERATORS = frozenset(
    {
        operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
        operator.mod, operator.pow, operator.neg, operator.pos, operator.abs,
        operator.invert, operator.and_, operator.or_, operator.xor, operator.lt,
        operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    }
)


@functools.lru_cache(maxsize=None)
def _reductions() -> Dict[Any, Callable[[Any, Any], Any]]:
    """The reductions of a chunk a chain may end with, and how two partial results combine."""
    found: Dict[Any, Callable[[Any, Any], Any]] = {
        np.sum: np.add, np.prod: np.multiply, np.max: np.maximum, np.min: np.minimum,
    }
    try:
        from dask.array import reductions

        found[reductions.chunk_max] = np.maximum
        found[reductions.chunk_min] = np.minimum
    except (ImportError, AttributeError):  # another Dask: those run whole
        pass
    return found


@functools.lru_cache(maxsize=None)
def _concatenate_shaped() -> Any:
    try:
        from dask.array.core import concatenate_shaped

        return concatenate_shaped
    except ImportError:
        return None


_MOST_OPERATIONS = 256
"""Operations a task may have to run a slab at a time: each is a level of recursion while a
slab is worked out (longer chains run whole)."""


def _member(func: Any, functions: Any) -> bool:
    """``func in functions``, false for a callable that cannot be hashed."""
    try:
        return func in functions
    except TypeError:
        return False


class _NotTiled(Exception):
    """The task is not one this module runs (or not worth it): Dask runs it whole."""


Name = Tuple[int, Any]
"""An array or a scalar of the task: (the subgraph it is in, its key there); values given
to the task, or held in its graph, are (-1, n)."""


class _Chain:
    """One task, flattened: every array it makes or reads by Name, each as an operation on
    others (``ops``) with its shape, whatever fused subgraph it was in."""

    def __init__(self, inner: Mapping[Any, Any], inputs: Mapping[Any, Any], out: Any) -> None:
        from dask._task_spec import Alias, DataNode, Task, TaskRef
        from dask._task_spec import List as ListNode

        self.Alias, self.DataNode, self.List, self.Task, self.TaskRef = (
            Alias, DataNode, ListNode, Task, TaskRef,
        )
        # Each subgraph met: its graph, and its inputs by key: ("value", v), or ("ref",
        # space, key) for a key of the subgraph around it.
        self.spaces: List[Tuple[Mapping[Any, Any], Dict[Any, Tuple[Any, ...]]]] = []
        self.names: Dict[Tuple[int, Any], Name] = {}
        self.ops: Dict[Name, Tuple[Any, ...]] = {}
        self.shapes: Dict[Name, Tuple[int, ...]] = {}
        self.leaves = itertools.count()
        space = self._space(inner, {k: ("value", v) for k, v in inputs.items()})
        space, key = self._final(space, out)
        top = self.spaces[space][0].get(key) if key not in self.spaces[space][1] else None
        reduction = self._reduction(top) if isinstance(top, self.Task) else None
        self.reduce: Optional[Tuple[Any, Callable[[Any, Any], Any], Tuple[int, ...]]] = None
        if top is not None and reduction is not None:
            self.root = self._name(space, self._key(top.args[0]))
        else:
            self.root = self._name(space, key)
        if self.ops[self.root][0] in ("scalar", "input"):
            raise _NotTiled()  # nothing made: a reduction of an input alone is NumPy's
        self.shape = self.shapes[self.root]
        if reduction is not None:
            self.reduce = (top, reduction[0], self._axes(reduction[1]))
        # Which arrays are read along which axis from the result's first, and how many
        # operations read each (only those read twice are kept while a slab is worked out).
        self.uses: Dict[Name, int] = {}
        computes = self._walk()
        if not computes and self.reduce is None:
            raise _NotTiled()  # a merge alone, or a slice: nothing to keep in cache

    # Flattening.

    def _space(self, graph: Mapping[Any, Any], given: Dict[Any, Tuple[Any, ...]]) -> int:
        self.spaces.append((graph, given))
        return len(self.spaces) - 1

    def _key(self, arg: Any) -> Any:
        if isinstance(arg, self.TaskRef):
            return arg.key
        if isinstance(arg, self.Alias):
            return arg.target
        raise _NotTiled()

    def _nested(self, node: Any) -> bool:
        return isinstance(node, self.Task) and node.func in _subgraph_runners()

    def _enter(self, space: int, node: Any) -> Tuple[int, Any]:
        """The subgraph a nested task runs, and the key of its result there."""
        inner, outkey, inkeys, *refs = node.args
        if not isinstance(inner, Mapping) or len(inkeys) != len(refs):
            raise _NotTiled()
        given: Dict[Any, Tuple[Any, ...]] = {}
        for k, r in zip(inkeys, refs):
            if isinstance(r, (self.TaskRef, self.Alias)):
                given[k] = ("ref", space, self._key(r))
            else:
                given[k] = ("value", r.value if isinstance(r, self.DataNode) else r)
        return self._space(inner, given), outkey

    def _final(self, space: int, key: Any) -> Tuple[int, Any]:
        """Where the value of ``key`` is made: through aliases and into nested subgraphs."""
        for _ in range(10_000):
            graph, given = self.spaces[space]
            if key in given:
                return space, key
            node = graph.get(key)
            if isinstance(node, self.Alias):
                key = node.target
            elif self._nested(node):
                space, key = self._enter(space, node)
            else:
                return space, key
        raise _NotTiled()

    def _leaf(self, value: Any) -> Name:
        name = (-1, next(self.leaves))
        if type(value) is np.ndarray and value.ndim > 0:
            self.ops[name] = ("input", value)
            self.shapes[name] = value.shape
        else:
            self.ops[name] = ("scalar", _scalar(value))
        return name

    def _name(self, space: int, key: Any) -> Name:
        if (space, key) in self.names:
            return self.names[space, key]
        space, key = self._final(space, key)
        if (space, key) in self.names:
            return self.names[space, key]
        graph, given = self.spaces[space]
        if key in given:
            how = given[key]
            name = self._leaf(how[1]) if how[0] == "value" else self._name(how[1], how[2])
        else:
            node = graph.get(key)
            if isinstance(node, self.DataNode):
                name = self._leaf(node.value)
            elif isinstance(node, self.Task) and not isinstance(node, self.List):
                if len(self.ops) >= _MOST_OPERATIONS:
                    raise _NotTiled()
                name = (space, key)
                self.ops[name], shape = self._op(space, node)
                self.shapes[name] = shape
            else:
                raise _NotTiled()
        self.names[space, key] = name
        return name

    def _array(self, space: int, arg: Any) -> Name:
        name = self._name(space, self._key(arg))
        if self.ops[name][0] == "scalar":
            raise _NotTiled()
        return name

    def _op(self, space: int, task: Any) -> Tuple[Tuple[Any, ...], Tuple[int, ...]]:
        func = task.func
        if func is np.transpose:
            if len(task.args) != 1 or set(task.kwargs) - {"axes"}:
                raise _NotTiled()
            child = self._array(space, task.args[0])
            ndim = len(self.shapes[child])
            axes = task.kwargs.get("axes")
            axes = tuple(reversed(range(ndim))) if axes is None else axes
            if not isinstance(axes, (tuple, list)) or sorted(axes) != list(range(ndim)):
                raise _NotTiled()
            axes = tuple(int(a) for a in axes)
            return ("transpose", child, axes), tuple(self.shapes[child][a] for a in axes)
        if func in _getitems():
            return self._slice(space, task)
        if func is _concatenate_shaped() and func is not None:
            return self._merge(space, task)
        if not (_elementwise(func) and not task.kwargs):
            raise _NotTiled()
        operands: List[Tuple[bool, Any]] = []
        for arg in task.args:
            if isinstance(arg, (self.TaskRef, self.Alias)):
                name = self._name(space, self._key(arg))
                op = self.ops[name]
                operands.append((False, op[1]) if op[0] == "scalar" else (True, name))
            else:
                operands.append((False, _scalar(arg.value if isinstance(arg, self.DataNode) else arg)))
        shapes = {self.shapes[n] for is_array, n in operands if is_array}
        if len(shapes) != 1:
            raise _NotTiled()  # broadcasting, or no array at all
        return ("ufunc", func, operands), shapes.pop()

    def _slice(self, space: int, task: Any) -> Tuple[Tuple[Any, ...], Tuple[int, ...]]:
        if len(task.args) != 2 or task.kwargs:
            raise _NotTiled()
        child = self._array(space, task.args[0])
        index = task.args[1]
        index = index.value if isinstance(index, self.DataNode) else index
        index = index if isinstance(index, tuple) else (index,)
        shape = self.shapes[child]
        if len(index) > len(shape) or not all(
            isinstance(i, slice) and i.step in (None, 1) for i in index
        ):
            raise _NotTiled()
        bounds = []
        index = index + (slice(None),) * (len(shape) - len(index))
        for i, extent in zip(index, shape):
            start, stop, _ = i.indices(extent)
            bounds.append((start, max(start, stop)))
        return ("slice", child, tuple(bounds)), tuple(hi - lo for lo, hi in bounds)

    def _merge(self, space: int, task: Any) -> Tuple[Tuple[Any, ...], Tuple[int, ...]]:
        if len(task.args) != 2 or task.kwargs or not isinstance(task.args[0], self.List):
            raise _NotTiled()
        layout = task.args[1]
        layout = layout.value if isinstance(layout, self.DataNode) else layout
        pieces = [self._array(space, arg) for arg in task.args[0].args]
        if not pieces or not isinstance(layout, (list, tuple)) or not layout or (
            layout[0] != len(pieces)
        ):
            raise _NotTiled()
        # A slab of a merge is a slab of one piece, or a few: their dtypes must be one, as
        # NumPy's concatenation of the whole would make it (slices of inputs: the splits).
        dtypes = {self._dtype(p) for p in pieces}
        if len(dtypes) != 1 or None in dtypes:
            raise _NotTiled()
        rest = self.shapes[pieces[0]][1:]
        if list(layout[1:]) != [1] * len(rest) or any(self.shapes[p][1:] != rest for p in pieces):
            raise _NotTiled()  # only along the first axis
        offsets, at = [], 0
        for p in pieces:
            offsets.append(at)
            at += self.shapes[p][0]
        return ("merge", tuple(pieces), tuple(offsets)), (at,) + rest

    def _dtype(self, name: Name) -> Optional[np.dtype]:
        """The dtype of an input, or of slices and merges of inputs; None for any other."""
        op = self.ops[name]
        if op[0] == "input":
            return op[1].dtype
        if op[0] == "slice":
            return self._dtype(op[1])
        if op[0] == "merge":
            dtypes = {self._dtype(p) for p in op[1]}
            return dtypes.pop() if len(dtypes) == 1 else None
        return None

    def _reduction(self, task: Any) -> Optional[Tuple[Callable[[Any, Any], Any], Any]]:
        func, kwargs = task.func, dict(task.kwargs)
        if isinstance(func, functools.partial):
            kwargs = {**func.keywords, **kwargs}
            func = func.func
        if not _member(func, _reductions()) or len(task.args) != 1:
            return None
        if kwargs.get("keepdims") is not True or not set(kwargs) <= {"axis", "keepdims", "dtype"}:
            raise _NotTiled()
        if any(isinstance(v, (self.Task, self.TaskRef, self.DataNode)) for v in kwargs.values()):
            raise _NotTiled()
        return _reductions()[func], kwargs.get("axis")

    def _axes(self, axis: Any) -> Tuple[int, ...]:
        ndim = len(self.shape)
        axes = tuple(range(ndim)) if axis is None else axis if isinstance(axis, tuple) else (axis,)
        return tuple(int(a) % ndim for a in axes)

    def _walk(self) -> bool:
        """Counts each array's readers, checks that every merge is read along its first axis,
        and says whether anything computes."""
        computes = False
        seen: Set[Tuple[Name, int]] = set()
        todo = [(self.root, 0)]
        while todo:
            name, axis = todo.pop()
            if (name, axis) in seen:
                continue
            seen.add((name, axis))
            op = self.ops[name]
            if op[0] == "ufunc":
                computes = True
                reads = [(n, axis) for is_array, n in op[2] if is_array]
            elif op[0] == "transpose":
                computes = True
                reads = [(op[1], op[2][axis])]
            elif op[0] == "slice":
                reads = [(op[1], axis)]
            elif op[0] == "merge":
                if axis != 0:
                    raise _NotTiled()
                reads = [(p, 0) for p in op[1]]
            else:
                reads = []
            for n, a in reads:
                self.uses[n] = self.uses.get(n, 0) + 1
                todo.append((n, a))
        return computes

    # Running.

    def evaluate(self, name: Name, start: int, stop: int, axis: int, seen: Dict[Any, Any]) -> Any:
        """The slab [start, stop) along ``axis`` of the array ``name``, made from its inputs'
        slabs (``seen``: those read again, each made once a slab)."""
        memo = (name, axis, start, stop)
        if memo in seen:
            return seen[memo]
        op = self.ops[name]
        kind = op[0]
        if kind == "input":
            index = [slice(None)] * op[1].ndim
            index[axis] = slice(start, stop)
            value = op[1][tuple(index)]
        elif kind == "ufunc":
            value = op[1](*[
                self.evaluate(n, start, stop, axis, seen) if is_array else n
                for is_array, n in op[2]
            ])
        elif kind == "transpose":
            axes = op[2]
            value = np.transpose(self.evaluate(op[1], start, stop, axes[axis], seen), axes)
        elif kind == "slice":
            bounds = op[2]
            lo = bounds[axis][0]
            inner = self.evaluate(op[1], lo + start, lo + stop, axis, seen)
            index = [slice(b[0], b[1]) for b in bounds]
            index[axis] = slice(None)
            value = inner[tuple(index)]
        else:  # a merge, along its first axis
            parts = []
            for piece, offset in zip(op[1], op[2]):
                length = self.shapes[piece][0]
                lo, hi = max(start, offset), min(stop, offset + length)
                if lo < hi:
                    parts.append(self.evaluate(piece, lo - offset, hi - offset, 0, seen))
            value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        if self.uses.get(name, 0) > 1:
            seen[memo] = value
        return value

    def inputs(self) -> List[np.ndarray]:
        return [op[1] for op in self.ops.values() if op[0] == "input"]


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float, complex, np.generic)) or (
        type(value) is np.ndarray and value.ndim == 0
    ):
        return value
    raise _NotTiled()


def _elementwise(func: Any) -> bool:
    if isinstance(func, np.ufunc):
        return func.nout == 1 and func.signature is None  # not a gufunc such as matmul
    return _member(func, _OPERATORS)


def execute_subgraph(inner: Mapping[Any, Any], outkey: Any, inkeys: Sequence[Any], *deps: Any) -> Any:
    """What Dask's ``_execute_subgraph`` computes (the value of ``outkey`` in the graph
    ``inner`` whose inputs ``inkeys`` have the values ``deps``), a slab at a time where the
    task is one this module runs, else as Dask does."""
    from dask._task_spec import _execute_subgraph

    try:
        chain = _Chain(inner, dict(zip(inkeys, deps)), outkey)
    except (_NotTiled, RecursionError, TypeError, ValueError, IndexError, KeyError):
        # Not a task this module runs, or one it misread: Dask runs it.
        return _execute_subgraph(inner, outkey, inkeys, *deps)
    try:
        return _run(chain)
    except Exception:
        # Not worth it (_NotTiled), or an error a slab met: the task runs whole, as Dask
        # runs it, and an error of its own functions is raised from there.
        return _execute_subgraph(inner, outkey, inkeys, *deps)


@functools.lru_cache(maxsize=None)
def _subgraph_runners() -> Tuple[Any, ...]:
    """Dask's runner of fused subgraphs and this module's: what a nested subgraph task calls.
    (Looked up when first needed: workers import this module without Dask.)"""
    from dask._task_spec import _execute_subgraph

    return (_execute_subgraph, execute_subgraph)


def _run(chain: _Chain) -> Any:
    shape = chain.shape
    if not shape:
        raise _NotTiled()
    # Intermediates are float64 more often than not, whatever the inputs.
    widest = max([8] + [a.itemsize for a in chain.inputs()])
    row = widest * int(np.prod(shape[1:], dtype=np.int64))
    if row == 0 or row * shape[0] < LEAST_BYTES:
        raise _NotTiled()
    rows = max(1, SLAB_BYTES // row)
    if rows >= shape[0]:
        raise _NotTiled()
    out: Any = None
    partials: List[Any] = []
    for start in range(0, shape[0], rows):
        stop = min(start + rows, shape[0])
        value = chain.evaluate(chain.root, start, stop, 0, {})
        if chain.reduce is None:
            if out is None:
                out = np.empty(shape, dtype=np.asarray(value).dtype)
            out[start:stop] = value
            continue
        task, combine, axes = chain.reduce
        partial = task.func(value, **task.kwargs)
        if 0 in axes:
            out = partial if out is None else combine(out, partial)
        else:
            partials.append(partial)
    if chain.reduce is not None and partials:
        out = np.concatenate(partials, axis=0)
    return out
