"""Fused chains of elementwise operations run a slab at a time, in the processor's cache
(``depot.dask``'s part of issue 40, "fusion of what fits").

Dask fuses a chain of blockwise operations into one task, ``_execute_subgraph`` of the
chain's small graph, but still runs each operation on the whole chunk: ten operations on a
46 MiB chunk make ten 46 MiB temporaries, each written to memory and read back by the next,
and a reduction at the end of the chain (the first stage of ``x.sum()``) reads a whole
temporary only to throw it away. Here such a task runs its chain on slabs of the chunk
instead: consecutive pieces along one axis of about :data:`SLAB_BYTES` each, which stay in
the processor's cache from one operation to the next. A slab's results go into the output
(allocated once), or, for a chain that ends in a reduction, are reduced as they come: the
task's temporaries are slab-sized, whatever the chunk's size.

A chain runs so only when all of it is understood; any other runs as Dask runs it:

- its operations are elementwise (NumPy ufuncs with one output and no keywords, and the
  ``operator`` module's arithmetic and comparisons), on arrays of one shape and scalars (no
  broadcasting of arrays against each other), and ``numpy.transpose``;
- its last operation may be a reduction along some axes with ``keepdims=True`` (what
  ``dask.array``'s ``sum``, ``prod``, ``max`` and ``min`` make of each chunk): partial
  results along the slab axis are combined with the reduction's own operation (``+``,
  ``*``, ``maximum``, ``minimum``), along any other axis they are placed side by side;
- its inputs are NumPy arrays (not subclasses, not CuPy: a GPU form runs whole), and its
  output has at least :data:`LEAST_BYTES` (smaller chunks fit the cache already).

A sum over slabs adds in a different order than NumPy's pairwise sum of the whole chunk: the
result may differ in its last bits, as Dask's own results differ with the chunking.
"""

import functools
import operator
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

SLAB_BYTES = 256 << 10
"""Bytes of the chain's widest array a slab holds: measured on a 2-core VM, a chain of ten
operations on 64 KiB to 1 MiB slabs ran in 0.70 of the whole chunk's time, on 4 MiB slabs
in 1.3 of it."""

LEAST_BYTES = 4 << 20
"""Outputs (before the reduction) smaller than this run whole."""

_OPERATORS = frozenset(
    {
        operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
        operator.mod, operator.pow, operator.neg, operator.pos, operator.abs,
        operator.invert, operator.and_, operator.or_, operator.xor, operator.lt,
        operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    }
)


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


_REDUCTIONS = _reductions()


class _NotTiled(Exception):
    """The chain is not one this module runs (or not worth it): Dask runs it whole."""


def _graph_nodes() -> Tuple[type, type, type]:
    from dask._task_spec import DataNode, Task, TaskRef

    return Task, TaskRef, DataNode


class _Chain:
    """One task's chain: its operations by key, its inputs' values, and the shape of every
    array it makes (checked while they are worked out)."""

    def __init__(self, inner: Mapping[Any, Any], inputs: Mapping[Any, Any], out: Any) -> None:
        self.Task, self.TaskRef, self.DataNode = _graph_nodes()
        self.inner = inner
        # Its inputs: the values of the task's dependencies, and arrays the graph holds.
        self.inputs = dict(inputs)
        for key, node in inner.items():
            if isinstance(node, self.DataNode) and type(node.value) is np.ndarray:
                self.inputs.setdefault(key, node.value)
        self.out = out
        self.shapes: Dict[Any, Tuple[int, ...]] = {}
        self.axes: Dict[Any, Tuple[int, ...]] = {}  # of each transpose
        self.reduce: Optional[Tuple[Any, Callable[[Any, Any], Any], Tuple[int, ...]]] = None
        top = inner.get(out)
        if not isinstance(top, self.Task):
            raise _NotTiled()
        reduction = self._reduction(top)
        if reduction is not None:
            self.root = self._ref(top.args[0])
            if self.root in inputs:
                raise _NotTiled()  # a reduction of an input alone: nothing to keep in cache
            self.reduce = (top, reduction[0], reduction[1])
        else:
            self.root = out
        self.shape = self._shape(self.root)
        # How many operations read each array: only those read twice are kept for the second
        # reader while a slab is worked out, so that the rest go as soon as they are read.
        self.uses: Dict[Any, int] = {}
        for key in self.shapes:
            if key in self.inputs:
                continue
            task = self.inner[key]
            reads = [task.args[0].key] if key in self.axes else [
                k for is_array, k in self._operands(task) if is_array
            ]
            for k in reads:
                self.uses[k] = self.uses.get(k, 0) + 1
        if self.reduce is not None:
            self.reduce = (self.reduce[0], self.reduce[1], self._axes(self.reduce[2]))

    def _reduction(self, task: Any) -> Optional[Tuple[Callable[[Any, Any], Any], Any]]:
        func, kwargs = task.func, dict(task.kwargs)
        if isinstance(func, functools.partial):
            kwargs = {**func.keywords, **kwargs}
            func = func.func
            if func not in _REDUCTIONS or len(task.args) != 1:
                return None
        elif func not in _REDUCTIONS or len(task.args) != 1:
            return None
        if kwargs.get("keepdims") is not True or not set(kwargs) <= {"axis", "keepdims", "dtype"}:
            raise _NotTiled()
        if any(isinstance(v, (self.Task, self.TaskRef, self.DataNode)) for v in kwargs.values()):
            raise _NotTiled()
        return _REDUCTIONS[func], kwargs.get("axis")

    def _axes(self, axis: Any) -> Tuple[int, ...]:
        ndim = len(self.shape)
        axes = tuple(range(ndim)) if axis is None else axis if isinstance(axis, tuple) else (axis,)
        return tuple(int(a) % ndim for a in axes)

    def _ref(self, arg: Any) -> Any:
        if isinstance(arg, self.TaskRef):
            return arg.key
        raise _NotTiled()

    def _operands(self, task: Any) -> List[Tuple[bool, Any]]:
        """A task's arguments: (True, key) for an array it reads, (False, value) for a
        scalar."""
        out: List[Tuple[bool, Any]] = []
        for arg in task.args:
            if isinstance(arg, self.TaskRef) and type(self.inputs.get(arg.key)) is not np.ndarray:
                if arg.key in self.inputs:  # a constant of the chain, passed in as an input
                    out.append((False, self._scalar(self.inputs[arg.key])))
                    continue
                out.append((True, arg.key))
            elif isinstance(arg, self.TaskRef):
                out.append((True, arg.key))
            elif isinstance(arg, self.DataNode):
                out.append((False, self._scalar(arg.value)))
            else:
                out.append((False, self._scalar(arg)))
        return out

    @staticmethod
    def _scalar(value: Any) -> Any:
        if isinstance(value, (bool, int, float, complex, np.generic)) or (
            type(value) is np.ndarray and value.ndim == 0
        ):
            return value
        raise _NotTiled()

    def _shape(self, key: Any) -> Tuple[int, ...]:
        if key in self.shapes:
            return self.shapes[key]
        if key in self.inputs:
            value = self.inputs[key]
            if type(value) is not np.ndarray:
                raise _NotTiled()
            shape = value.shape
        else:
            task = self.inner.get(key)
            if not isinstance(task, self.Task):
                raise _NotTiled()
            if task.func is np.transpose:
                if len(task.args) != 1 or set(task.kwargs) - {"axes"}:
                    raise _NotTiled()
                inner = self._shape(self._ref(task.args[0]))
                axes = task.kwargs.get("axes")
                axes = tuple(reversed(range(len(inner)))) if axes is None else axes
                if not isinstance(axes, (tuple, list)) or sorted(axes) != list(range(len(inner))):
                    raise _NotTiled()
                self.axes[key] = tuple(int(a) for a in axes)
                shape = tuple(inner[a] for a in self.axes[key])
            elif _elementwise(task):
                shapes = {self._shape(k) for is_array, k in self._operands(task) if is_array}
                if len(shapes) != 1:
                    raise _NotTiled()  # broadcasting, or no array at all
                (shape,) = shapes
            else:
                raise _NotTiled()
        self.shapes[key] = shape
        return shape

    def evaluate(self, key: Any, start: int, stop: int, axis: int, seen: Dict[Any, Any]) -> Any:
        """The slab [start, stop) along ``axis`` of the array ``key``: its inputs' slabs, and
        the operations on them, each once a slab (``seen``: those read again)."""
        if (key, axis) in seen:
            return seen[key, axis]
        if key in self.inputs:
            index = [slice(None)] * len(self.shapes[key])
            index[axis] = slice(start, stop)
            value = self.inputs[key][tuple(index)]
        else:
            task = self.inner[key]
            if key in self.axes:
                axes = self.axes[key]
                value = np.transpose(
                    self.evaluate(task.args[0].key, start, stop, axes[axis], seen), axes
                )
            else:
                args = [
                    self.evaluate(k, start, stop, axis, seen) if is_array else k
                    for is_array, k in self._operands(task)
                ]
                value = task.func(*args)
        if self.uses.get(key, 0) > 1:
            seen[key, axis] = value
        return value


def _elementwise(task: Any) -> bool:
    func = task.func
    if isinstance(func, np.ufunc):
        return func.nout == 1 and not task.kwargs
    return func in _OPERATORS and not task.kwargs


def execute_subgraph(inner: Mapping[Any, Any], outkey: Any, inkeys: Sequence[Any], *deps: Any) -> Any:
    """What Dask's ``_execute_subgraph`` computes (the value of ``outkey`` in the graph
    ``inner`` whose inputs ``inkeys`` have the values ``deps``), a slab at a time where the
    chain is one this module runs, else as Dask does."""
    try:
        chain = _Chain(inner, dict(zip(inkeys, deps)), outkey)
        return _run(chain)
    except _NotTiled:
        from dask._task_spec import _execute_subgraph

        return _execute_subgraph(inner, outkey, inkeys, *deps)


def _run(chain: _Chain) -> Any:
    shape = chain.shape
    if not shape:
        raise _NotTiled()
    # Intermediates are float64 more often than not, whatever the inputs.
    widest = max([8] + [chain.inputs[k].itemsize for k in chain.inputs if k in chain.shapes])
    row = widest * int(np.prod(shape[1:], dtype=np.int64))
    if row * shape[0] < LEAST_BYTES or row == 0:
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
