"""What each task of a Dask graph will make, in bytes, known before anything runs.

Dask arrays carry their metadata in the graph: each layer of a ``HighLevelGraph`` that makes
an array says its chunks and dtype (``collection_annotations``), so the chunk a task makes
has ``prod(chunk shape) * itemsize`` bytes. Three things keep that from being exact:

- Dask fuses chains of blockwise layers before a scheduler sees the graph; the fused task's
  key is named ``<prefix>-<name of the chain's last layer>``, and the last layer's
  metadata is what it makes.
- The first stage of a reduction (``sum``, ``mean``, ``max``, the contraction of ``@``) is a
  blockwise layer that keeps the metadata of its input, though it reduces each chunk along
  ``axis`` (with ``keepdims``): those axes count as length 1 here.
- A task that slices a chunk of known shape (``operator.getitem`` with slices and
  integers: a rechunk's splits, an array's ``x[a:b]``) makes the slice's shape.
- Other tasks whose keys name no layer (dataframes, delayed) have no metadata. They are unknown: nothing is declared to the daemon for them, and a plan counts
  each as the sum of its inputs (:meth:`Sizes.projected`): right for the merges and
  concatenations most of them are, more than enough for the rest.

A ``map_blocks`` whose function changes its chunks' shape without saying so (``chunks=``)
is misdescribed by its own graph: its declared size is wrong the same way.
"""

import math
import operator
import sys
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

Key = Any

_SLACK = 4096
"""Bytes declared beyond a chunk's data: its object's metadata (dtype and shape) and the
arena's alignment."""


def _layers(dsk: Any) -> Dict[str, Any]:
    """The layers of the HighLevelGraphs in what a scheduler is handed: a HighLevelGraph, or
    an expression (dask >= 2025) whose parts hold one (``HLGExpr`` and its kinds).
    Expressions of dask-expr collections (dataframes) hold none: no metadata."""
    layers = getattr(dsk, "layers", None)
    if isinstance(layers, Mapping):
        return dict(layers)
    try:
        from dask._expr import Expr, HLGExpr
    except ImportError:  # a Dask before expressions: graphs come as mappings
        return {}

    found: Dict[str, Any] = {}
    if isinstance(dsk, Expr):
        for expr in dsk.walk():
            if isinstance(expr, HLGExpr):
                found.update(expr.hlg.layers)
    return found


def _reduced_axes(layer: Any, ndim: int) -> Tuple[int, ...]:
    """The axes a blockwise reduction stage reduces each chunk along (with keepdims):
    those of its function's ``axis`` when it keeps dims; none for any other layer."""
    task = getattr(layer, "task", None)
    kwargs = getattr(task, "kwargs", None)
    if not isinstance(kwargs, Mapping) or kwargs.get("keepdims") is not True:
        return ()
    axis = kwargs.get("axis")
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    try:
        return tuple(int(a) % ndim for a in axes) if ndim else ()
    except (TypeError, ValueError):
        return ()


class _Layer:
    """One array layer's metadata, as sizes need it."""

    def __init__(self, layer: Any) -> None:
        meta = getattr(layer, "collection_annotations", None) or {}
        self.chunks: Optional[Tuple[Tuple[int, ...], ...]] = None
        self.itemsize = 0
        chunks, dtype = meta.get("chunks"), meta.get("dtype")
        itemsize = getattr(dtype, "itemsize", 0)
        if chunks is None or not itemsize or getattr(dtype, "hasobject", True):
            return  # no metadata, or Python objects of any size
        try:
            self.chunks = tuple(tuple(int(c) for c in dim) for dim in chunks)
        except (TypeError, ValueError):
            return
        self.itemsize = int(itemsize)
        self.reduced = set(_reduced_axes(layer, len(self.chunks)))

    def shape(self, index: Sequence[Any]) -> Optional[Tuple[int, ...]]:
        """The shape of the chunk at ``index`` (a key's block index)."""
        chunks = self.chunks
        if chunks is None or len(index) != len(chunks):
            return None
        shape = []
        for axis, (i, dim) in enumerate(zip(index, chunks)):
            if not isinstance(i, int) or not 0 <= i < len(dim):
                return None
            shape.append(1 if axis in self.reduced else dim[i])
        return tuple(shape)


def _getitems() -> Tuple[Any, ...]:
    """The functions a task slices a chunk with: Python's and dask.array's (which copies a
    slice smaller than half its chunk), where dask.array is imported: a graph holding its
    function has imported it, and a graph of others (dask.delayed) does not pay for
    importing it (about a second, on the first compute)."""
    chunk = sys.modules.get("dask.array.chunk")
    getitem = getattr(chunk, "getitem", None)
    return (operator.getitem,) if getitem is None else (operator.getitem, getitem)


def is_slice(node: Any) -> bool:
    """Whether ``node`` only slices the output of another task: ``getitem`` of a TaskRef
    with slices and integers (a view, or a copy of a small part)."""
    from dask._task_spec import Task, TaskRef

    if not isinstance(node, Task) or node.func not in _getitems():
        return False
    args = node.args
    if len(args) != 2 or node.kwargs or not isinstance(args[0], TaskRef):
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return all(
        isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool)) for i in index
    )


def _sliced(shape: Tuple[int, ...], index: Any) -> Optional[Tuple[int, ...]]:
    """The shape of ``x[index]`` for an ``x`` of ``shape``: for an index of slices and
    integers only (else None)."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > len(shape):
        return None
    out = []
    for n, i in zip(shape, index):
        if isinstance(i, slice):
            out.append(len(range(*i.indices(n))))
        elif isinstance(i, int) and not isinstance(i, bool) and -n <= i < n:
            continue
        else:
            return None
    return tuple(out) + tuple(shape[len(index) :])


class Sizes:
    """The output bytes of a graph's tasks, from its metadata where it has it."""

    def __init__(
        self, dsk: Any, graph: Mapping[Key, Any], order: Iterable[Key], aliases: Mapping[Key, Key]
    ) -> None:
        layers = _layers(dsk)
        self._layers = {name: _Layer(layer) for name, layer in layers.items()}
        self._named: Dict[str, Optional[_Layer]] = {}
        # Each key's array shape and item size, where known; producers come first in order.
        self.shapes: Dict[Key, Tuple[Tuple[int, ...], int]] = {}
        self.known: Dict[Key, int] = {}
        for key in order:
            found = self._of(key) or self._slice_of(graph.get(key))
            if found is not None:
                self.shapes[key] = found
                self.known[key] = math.prod(found[0]) * found[1]
        # An alias's metadata is its target's, if the target has none of its own (a fused
        # chain's output keeps its last layer's key as an alias).
        for alias, target in aliases.items():
            if target not in self.known and alias in self.known:
                self.known[target] = self.known[alias]

    def _layer(self, name: str) -> Optional[_Layer]:
        if name not in self._named:
            found = self._layers.get(name)
            # A fused chain: "<prefix>-<its last layer's name>", the longest such suffix.
            start = name.find("-")
            while found is None and start >= 0:
                found = self._layers.get(name[start + 1 :])
                start = name.find("-", start + 1)
            self._named[name] = found
        return self._named[name]

    def _of(self, key: Key) -> Optional[Tuple[Tuple[int, ...], int]]:
        """The shape and item size the metadata of the key's layer gives its chunk."""
        if isinstance(key, tuple) and key and isinstance(key[0], str):
            name, index = key[0], key[1:]
        elif isinstance(key, str):
            name, index = key, ()
        else:
            return None
        layer = self._layer(name)
        shape = layer.shape(index) if layer is not None else None
        return (shape, layer.itemsize) if shape is not None and layer is not None else None

    def _slice_of(self, node: Any) -> Optional[Tuple[Tuple[int, ...], int]]:
        """The shape and item size of what a getitem task of a chunk of known shape makes."""
        if not is_slice(node):
            return None
        args = node.args
        source = self.shapes.get(args[0].key)
        if source is None:
            return None
        shape = _sliced(source[0], args[1])
        return (shape, source[1]) if shape is not None else None

    def declared(self, key: Key) -> int:
        """What to declare to the daemon for the task of ``key`` (``output_bytes``): its
        metadata's bytes with room for the object's metadata and alignment, or 0
        (unknown)."""
        size = self.known.get(key)
        return size + _SLACK if size is not None else 0

    def projected(self, key: Key, inputs: Iterable[int]) -> int:
        """What a plan counts for the task of ``key``: its metadata's bytes, else the sum of
        its inputs' (0 for a task with no input)."""
        size = self.known.get(key)
        return size if size is not None else sum(inputs)
