"""Dask graphs run by depot's own scheduler, on one host (depot.dask.get, depot.dask.Scheduler).

Each task of the graph becomes a depot task (Client.submit's form): the function ``_run``,
which every Python worker registers as ``depot.dask.run``, with the task's GraphNode pickled into the task's arguments and the outputs of
the tasks it depends on as its inputs. depotd places each where its inputs are, its workers
read them from the store with no copy, and each output stays where it was made. The graph is
checked whole before anything runs (keys asked for that it does not have, dependencies it
lacks, cycles, functions that cannot be pickled), submitted in batches, and each
intermediate result is given up (Client.delete(after_tasks=True)) once the batch holding its
last reader is submitted, so that the daemon deletes it as soon as that reader is done. The
results asked for are read with one get; their values view the store.

An exception in a task's function is carried, as a value, to the tasks that read its output
(which do not run) and on to the results: the caller then re-raises the first one, as Dask's
own schedulers do, with the worker's traceback as a note. Ctrl-C cancels what has not
started and deletes everything the graph made once what runs is done.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import itertools
import math
import operator
import os
import pickle
import threading
import time
import traceback
import types
from typing import (
    Any, Callable, Dict, Hashable, Iterable, Iterator, List, Mapping, Optional, Sequence, Set,
    Tuple, Union,
)

from . import _dask_fusion, _dask_gpu, _depot, _tasks
from ._client import Client
from ._dask_plan import GraphPlan, parse_memory, project
from ._dask_sizes import Sizes
from ._device import DeviceArray
from ._errors import (
    DepotError, InvalidArgument, LimitExceeded, ObjectNotFound, StoreFull, Timeout,
)
from ._ref import ObjectRef

BATCH = 1000
"""Tasks submitted in one request."""

_MOST_RETRIES = 100
"""A task's retries at most (the daemon's bound)."""

_IDLE_RETRIES = 2
"""Times a batch refused at the client's limit is tried again, with no task known to run,
before it is halved."""

_BATCH_BYTES = 256 * 1024
"""Bytes of tasks submitted in one request at most: the daemon reads a request of up to
1 MiB into a buffer every client has, beyond which the buffer counts against the client's
limit (``--client-max-metadata``), and one it cannot count closes the client's session."""

_MOST_INPUTS = 4000
"""Inputs of one depot task at most (the daemon takes 4,096, and a task may read its stored
arguments too). A Dask task that depends on more reads
them through tasks that gather them in lists of this many."""

_MOST_OUTPUTS = 64
"""Outputs of one depot task at most (the daemon's limit): a task whose value more items of
are read is not split (_Plan._split)."""

_GATHER = 10_000
"""Results read with one get."""

_GATHER_SLICE = 5.0
"""Seconds a get of results waits before it is asked again (so that it ends with a run that
failed: results that will never be made)."""

Key = Hashable


class _Raised:
    """An exception a task's function raised, as the task's output: pickled if it can be, and
    the worker's traceback."""

    __slots__ = ("pickled", "text", "key")

    def __init__(self, error: BaseException, text: str, key: Any) -> None:
        try:
            self.pickled: Optional[bytes] = pickle.dumps(error, protocol=5)
            pickle.loads(self.pickled)
        except Exception:  # an exception that does not survive pickling: its text only
            self.pickled = None
        self.text = text
        self.key = key

    def error(self) -> BaseException:
        """The exception to raise in the caller, with the worker's traceback as a note."""
        error: BaseException
        if self.pickled is not None:
            error = pickle.loads(self.pickled)
        else:
            error = DepotError(f"task {self.key!r} failed")
        error.add_note(f"in depot task {self.key!r}, on a worker:\n{self.text}")
        return error

    def __reduce__(self) -> Any:
        return (_raised_of, (self.pickled, self.text, self.key))


def _raised_of(pickled: Optional[bytes], text: str, key: Any) -> _Raised:
    raised = _Raised.__new__(_Raised)
    raised.pickled, raised.text, raised.key = pickled, text, key
    return raised


class _ByValue(pickle.PicklingError):
    """A plain pickle of a node met a function to pickle by value for the first time."""


class _SharingPickler:
    """What both node picklers share: the callables a graph's tasks share are pickled as
    references to objects of their own, each stored once a graph and loaded once by a
    worker, instead of once a task. They are functions pickle cannot name (lambdas,
    closures, functions of __main__: by value, through cloudpickle), and partials and
    curried functions whose pickle is large (dask.array's carry their function's docstring:
    2.4 KB a task for ``da.ones``); each is stored from the second node holding it (the
    first carries it inline). The objects are pinned, so that the store does not evict them
    under memory pressure, and deleted when the run ends."""

    store: "_Functions"
    # While a node's GPU form is pickled: what replaces registered functions (_dask_gpu).
    gpu: Optional[_dask_gpu.Forms] = None

    def shared_reduction(self, obj: Any) -> Any:
        """A reduction naming the stored object of ``obj`` (or, in a GPU form, its form's), or
        None: pickle it in place."""
        if self.gpu is not None:
            form = self.gpu.reduction(obj)
            if form is not None:
                return form
        if self.store.tiled and obj is _execute_subgraph():
            return (_tiled, ())  # fused chains run a slab at a time (_dask_tiling)
        if isinstance(obj, types.FunctionType) and self.store.by_name(obj):
            return None
        if isinstance(obj, _SHARED_KINDS):
            ref = self.store.shared(obj)
            if ref is not None:
                return (_shared, (ref,))
        return None


class _PlainNodePickler(_SharingPickler, pickle.Pickler):
    """The fast one: plain pickle. Refuses (_ByValue) a node holding a function to pickle
    by value that is not stored yet, for cloudpickle to carry it."""

    def __init__(self, out: io.BytesIO, store: "_Functions") -> None:
        super().__init__(out, protocol=5)
        self.store = store

    def reducer_override(self, obj: Any) -> Any:
        # Called for objects other than builtin containers, strings and numbers only.
        reduction = self.shared_reduction(obj)
        if reduction is not None:
            return reduction
        if isinstance(obj, types.FunctionType) and not self.store.by_name(obj):
            raise _ByValue()
        return NotImplemented


def _cloud_pickler() -> type:
    """The node pickler for what plain pickle cannot load on a worker: cloudpickle's, which
    pickles functions and classes of __main__ and closures by value."""
    try:
        import cloudpickle
    except ImportError:  # then what plain pickle cannot do cannot be done
        return _PlainNodePickler

    class _CloudNodePickler(_SharingPickler, cloudpickle.Pickler):
        def __init__(self, out: io.BytesIO, store: "_Functions") -> None:
            super().__init__(out, protocol=5)
            self.store = store

        def reducer_override(self, obj: Any) -> Any:
            reduction = self.shared_reduction(obj)
            return reduction if reduction is not None else super().reducer_override(obj)

    return _CloudNodePickler


def _execute_subgraph() -> Any:
    """Dask's runner of a fused chain of blockwise tasks."""
    from dask._task_spec import _execute_subgraph as execute

    return execute


def _tiled() -> Any:
    """depot's, which runs such a chain a slab at a time: a node's reference to Dask's
    becomes a call of this on the worker that loads it. (Imported here: workers import this
    module without NumPy or Dask.)"""
    from . import _dask_tiling

    return _dask_tiling.execute_subgraph


def _shared_kinds() -> Tuple[type, ...]:
    kinds: List[type] = [types.FunctionType, functools.partial]
    try:
        from toolz import curry  # type: ignore[import-untyped]

        kinds.append(curry)
    except ImportError:
        pass
    return tuple(kinds)


_SHARED_KINDS = _shared_kinds()
_SHARED_LEAST = 256  # bytes: a shared callable pickled smaller than this travels in each task


class _Functions:
    """The callables of one run that travel as objects of their own: stored once each."""

    def __init__(self, client: Client) -> None:
        self.client = client
        # id(callable) -> its object's id, or None: pickled in each task that holds it.
        self.refs: Dict[int, Optional[bytes]] = {}
        self.first_node: Dict[int, int] = {}  # id(callable) -> the node that held it first
        self.named: Dict[int, bool] = {}  # id(function) -> whether pickle names it
        self.keep: List[Any] = []  # the callables looked at, so that their ids stay theirs
        self.stored: List[ObjectRef] = []
        self.node = 0  # the node being pickled
        self.cloud = _cloud_pickler()
        self.tiled = False  # fused chains run a slab at a time (depot's fusion is on)

    def by_name(self, fn: Any) -> bool:
        key = id(fn)
        named = self.named.get(key)
        if named is None:
            self.keep.append(fn)
            named = self.named[key] = _by_reference(fn)
        return named

    def shared(self, obj: Any) -> Optional[bytes]:
        key = id(obj)
        if key in self.refs:
            return self.refs[key]
        first = self.first_node.setdefault(key, self.node)
        if first == self.node:  # the first node holding it carries it
            self.keep.append(obj)
            return None
        data = _tasks._dumps_function(obj)
        self.refs[key] = self.store(data) if len(data) >= _SHARED_LEAST else None
        return self.refs[key]

    def store(self, data: bytes) -> bytes:
        ref = self.client.put(data, pin=True)
        self.stored.append(ref)
        return ref.id

    def dumps(self, node: Any, gpu: Optional[_dask_gpu.Forms] = None) -> bytes:
        """The node pickled as _tasks._dumps pickles arguments (plainly where a worker can
        load that, else with cloudpickle), with these picklers; with ``gpu``, its GPU form."""
        self.node += 1

        def pickler(kind: Callable[..., Any]) -> Callable[[io.BytesIO], Any]:
            def make(out: io.BytesIO) -> Any:
                made = kind(out, self)
                made.gpu = gpu
                return made

            return make

        return _tasks._dumps(node, plain=pickler(_PlainNodePickler), by_value=pickler(self.cloud))


def _by_reference(fn: Any) -> bool:
    """Whether plain pickle pickles ``fn`` by its name, for a worker to import."""
    try:
        return b"__main__" not in pickle.dumps(fn, protocol=5)
    except Exception:
        return False


# On a worker: the callables loaded from the store, by the id of their object, with the
# size of their pickle; the least recently used go first when there are more than
# _LOADED_MOST or their pickles pass _LOADED_BYTES (a closure may hold a large array). Object
# ids are never reused, so an entry is never stale.
_loaded: "collections.OrderedDict[bytes, Tuple[Any, int]]" = collections.OrderedDict()
_loaded_bytes = 0
_LOADED_MOST = 1024
_LOADED_BYTES = 64 << 20
_loaded_lock = threading.Lock()


def _shared(pid: bytes) -> Any:
    """On a worker: the callable stored in the object ``pid`` (see _SharingPickler)."""
    global _loaded_bytes
    with _loaded_lock:
        entry = _loaded.get(pid)
        if entry is not None:
            _loaded.move_to_end(pid)
            return entry[0]
    from ._worker import get_client

    # Stored (pinned) before the task was submitted, and kept until the graph's run ends.
    data = get_client().get(ObjectRef(pid), timeout=0)
    fn, size = pickle.loads(data), len(data)
    with _loaded_lock:
        if pid not in _loaded:
            _loaded[pid] = (fn, size)
            _loaded_bytes += size
        while len(_loaded) > _LOADED_MOST or (_loaded_bytes > _LOADED_BYTES and len(_loaded) > 1):
            _loaded_bytes -= _loaded.popitem(last=False)[1][1]
    return fn


def _run(node_bytes: bytes, keys: Sequence[Key], *values: Any) -> Any:
    """One task of a graph, on a worker: the GraphNode pickled in ``node_bytes`` given the
    values of its dependencies ``keys``, in order. What an upstream task raised goes on
    unchanged; what this one raises (loading the node included) is its value."""
    for value in values:
        if isinstance(value, _Raised):
            return value
    node = None
    try:
        node = pickle.loads(node_bytes)
        inputs, device = _on_device(values)
        with device:
            return node(dict(zip(keys, inputs)))
    except Exception as error:
        return _Raised(error, traceback.format_exc(), getattr(node, "key", None))


def _run_split(
    node_bytes: bytes, keys: Sequence[Key], items: Sequence[Any], item_keys: Sequence[Key],
    *values: Any,
) -> Any:
    """``_run`` of a task whose readers take items of its value (_Plan._split): those items,
    each an output of its own (alone, the output). An item that cannot be taken (a key the
    value lacks) is what its own readers get as raised, under the key of the task that
    took it in the graph (``item_keys``)."""
    value = _run(node_bytes, keys, *values)
    if isinstance(value, _Raised):
        made: List[Any] = [value] * len(items)
    else:
        made = []
        for item, key in zip(items, item_keys):
            try:
                made.append(value[item])
            except Exception as error:
                made.append(_Raised(error, traceback.format_exc(), key))
    return made[0] if len(made) == 1 else tuple(made)


def _run_offloadable(
    node_bytes: bytes, gpu_bytes: Optional[bytes], keys: Sequence[Key], *values: Any
) -> Any:
    """``_run`` of a task with a GPU form (depot._dask_gpu): its CPU variant, the node as the
    graph has it."""
    return _run(node_bytes, keys, *values)


def _run_offloadable_gpu(
    node_bytes: bytes, gpu_bytes: Optional[bytes], keys: Sequence[Key], *values: Any
) -> Any:
    """Its GPU variant: the node with registered functions replaced by their GPU forms
    (``gpu_bytes``), or the node itself where its functions dispatch to CuPy (None)."""
    return _run(node_bytes if gpu_bytes is None else gpu_bytes, keys, *values)


def _on_device(values: Sequence[Any]) -> Tuple[Sequence[Any], Any]:
    """In a task that runs on a GPU (annotated ``resources={"GPU": ...}``), its array inputs
    come as depot.DeviceArray on that GPU; where CuPy is installed and the GPU is real, as
    CuPy arrays viewing the same memory, with that GPU CuPy's current device while the task
    runs (so that what it makes is made there). The values, and the context to run it in."""
    from ._worker import task_device

    device = task_device()
    if device is None or not any(
        isinstance(v, DeviceArray) and not v.simulated for v in values
    ):
        return values, contextlib.nullcontext()
    try:
        import cupy
    except ImportError:
        return values, contextlib.nullcontext()
    converted = [
        cupy.asarray(v) if isinstance(v, DeviceArray) and not v.simulated else v for v in values
    ]
    return converted, cupy.cuda.Device(device)


def _run_gathered(node: Any, keys: Sequence[Key], *lists: List[Any]) -> Any:
    """``_run`` for a task with more dependencies than a depot task has inputs: their values
    come in lists, each made by a ``_gather`` task."""
    return _run(node, keys, *[value for values in lists for value in values])


def _gather(*values: Any) -> List[Any]:
    """Values of a Dask task's dependencies, in a list for the task (``_run_gathered``)."""
    return list(values)


# What every Python worker registers (depot.Worker), by the names tasks run them under.
BUILTINS = {"depot.dask.run": _run, "depot.dask.run_gathered": _run_gathered,
            "depot.dask.gather": _gather, "depot.dask.run_offloadable": _run_offloadable,
            "depot.dask.run_split": _run_split}
# Their GPU variants, which a worker with a GPU registers beside them.
GPU_BUILTINS = {"depot.dask.run_offloadable": _run_offloadable_gpu}


def _annotations(dsk: Any) -> Dict[str, Dict[Key, Any]]:
    """The annotations (dask.annotate) of the graph Dask hands a scheduler, by name and key:
    ``{"resources": {key: {...}}, "priority": ...}``. An expression (dask-expr) says those of
    the graph it optimized; but the low-level optimisation of ``dask.array`` makes one layer of
    all, without them, so those of the layers it started from are taken too (the optimized
    graph's win)."""
    out: Dict[str, Dict[Key, Any]] = {}
    for graph in _source_graphs(dsk):
        for layer in graph.layers.values():
            for name, value in (getattr(layer, "annotations", None) or {}).items():
                by_key = out.setdefault(name, {})
                for key in layer:
                    by_key[key] = value(key) if callable(value) else value
    given = getattr(dsk, "__dask_annotations__", None)
    for name, by_key in (given() if given else {}).items():
        out.setdefault(name, {}).update(by_key)
    return out


def _source_graphs(dsk: Any) -> List[Any]:
    """The high-level graphs an expression was made of, before optimisation."""
    try:
        from dask._expr import Expr, HLGExpr
    except ImportError:
        return []
    graphs: List[Any] = []
    stack = [dsk] if isinstance(dsk, Expr) else []
    seen: Set[int] = set()
    while stack:
        expr = stack.pop()
        if id(expr) in seen:
            continue
        seen.add(id(expr))
        graph = expr.operand("dsk") if isinstance(expr, HLGExpr) else None
        if hasattr(graph, "layers"):
            graphs.append(graph)
        stack.extend(op for op in expr.operands if isinstance(op, Expr))
    return graphs


def _key_like(item: Any) -> bool:
    """Whether ``item`` names a part of a value that no other item overlaps, unless equal:
    an int, a string, bytes, or a tuple of those (a dict's key, a tuple's place)."""
    if isinstance(item, tuple):
        return all(_key_like(i) for i in item)
    return isinstance(item, (int, str, bytes)) and not isinstance(item, bool)


class _Plan:
    """A graph checked and put in order: the tasks to submit (producers first), where each
    key's value will be (an alias's: its target's), and which keys are read last by which
    task. With ``share`` (bytes: the bound over the workers), tasks that fit are fused into
    the tasks that read them (depot._dask_fusion): ``fused`` says which, by the key of the
    task that runs them."""

    def __init__(self, dsk: Any, keys: Sequence[Key], share: Optional[int] = None) -> None:
        from dask._task_spec import convert_legacy_graph

        self.annotations = _annotations(dsk)
        self.share = share
        source = dsk
        if not isinstance(dsk, Mapping):
            dsk = dsk.__dask_graph__()
        graph = convert_legacy_graph(dsk)
        missing = [k for k in keys if k not in graph]
        if missing:
            raise InvalidArgument(
                f"{len(missing)} key(s) asked for are not in the graph, such as {missing[0]!r}"
            )
        self._walk(graph, keys)
        # What each task will make, where the graph's metadata says (dask.array chunks).
        self.sizes = Sizes(source, graph, self.order, self.aliases)
        # Tasks whose value only items of are read (_split): by the key of each, its
        # outputs (the first key reading each, and the item); and by the key of each item's
        # task, the split task and its output.
        self.split: Dict[Key, List[Tuple[Key, Any]]] = {}
        self.items: Dict[Key, Tuple[Key, int]] = {}
        self.taken: Dict[Key, List[Key]] = {}  # the keys of the items of each split task
        self.fused: Dict[Key, List[Key]] = {}
        self.fused_bytes: Dict[Key, int] = {}  # what the absorbed tasks make, by fused task
        if share is not None:
            self._split(keys)
            self._fuse(keys, share)
        # The task (by its place in order) that reads each key last.
        self.last_reader: Dict[Key, int] = {}
        for i, key in enumerate(self.order):
            for dep in self.deps[key]:
                self.last_reader[self.resolve(dep)] = i

    def _walk(self, graph: Dict[Key, Any], keys: Sequence[Key]) -> None:
        """What the keys asked for need, and in which order (producers first); each task's
        dependencies in a fixed order (its inputs' order), sorted once; aliases and data."""
        from dask._task_spec import Alias, DataNode

        self.order: List[Key] = []
        self.deps: Dict[Key, List[Key]] = {}
        state: Dict[Key, int] = {}  # 1: being visited, 2: done

        def visit(key: Key) -> Iterator[Key]:
            state[key] = 1
            self.deps[key] = sorted(graph[key].dependencies, key=repr)
            return iter(self.deps[key])

        for root in keys:
            if root in state:
                continue
            stack: List[Tuple[Key, Iterator[Key]]] = [(root, visit(root))]
            while stack:
                key, deps = stack[-1]
                dep = next(deps, None)
                if dep is None:
                    stack.pop()
                    state[key] = 2
                    self.order.append(key)
                    continue
                if dep not in graph:
                    raise InvalidArgument(
                        f"task {key!r} depends on {dep!r}, which is not in the graph"
                    )
                seen = state.get(dep)
                if seen == 1:
                    raise InvalidArgument(f"the graph has a cycle through {dep!r}")
                if seen is None:
                    stack.append((dep, visit(dep)))
        self.graph = graph
        self.aliases: Dict[Key, Key] = {}
        for key in self.order:
            node = graph[key]
            if isinstance(node, Alias):
                target = node.target
                self.aliases[key] = self.aliases.get(target, target)
        # A task Dask fused is keyed anew, its chain's last key an alias of it: it is
        # annotated as that key is.
        for by_key in self.annotations.values():
            for alias, task in self.aliases.items():
                if alias in by_key and task not in by_key:
                    by_key[task] = by_key[alias]
        self.data = {k for k in self.order if isinstance(graph[k], DataNode)}

    def _fuse(self, keys: Sequence[Key], share: int) -> None:
        """Fuses what fits (depot._dask_fusion) and walks the graph again."""
        wanted = {self.resolve(k) for k in keys}
        found, inside = _dask_fusion.groups(
            self.order, self.graph, self.deps, self.resolve, self.aliases, self.data, wanted,
            self.sizes, self.options, share, kept=set(self.split) | set(self.items),
        )
        if not found:
            return
        graph = dict(self.graph)
        aliases_of: Dict[Key, List[Key]] = {}
        for alias, target in self.aliases.items():
            aliases_of.setdefault(target, []).append(alias)
        for leader, members in found.items():
            # Aliases of absorbed tasks: read by the group only (their targets' one reader).
            aliases = [a for m in members[1:] for a in aliases_of.get(m, ())]
            node, folded = _dask_fusion.fused_nodes(self.graph, members, aliases)
            graph[leader] = node
            for key in members[1:]:
                del graph[key]
            for alias in folded:
                graph.pop(alias, None)
        self.fused = found
        self.fused_bytes = inside
        self._walk(graph, keys)
        for key in list(self.split):
            if len(self.deps[key]) > _MOST_INPUTS:  # its producers' inputs now its own
                self.unsplit(key)

    def _split(self, keys: Sequence[Key]) -> None:
        """Finds the tasks whose readers all take an item of their value (``getitem`` with
        a key-like constant: an int, a string, bytes, or a tuple of those, as the splits of
        a task-based shuffle take each group of a partition): such a task makes each item
        read as an output of its own, and the items' tasks are not run. Its value is never
        stored whole, nor read whole by each item's task (a shuffle's group of 16 frames
        unpickled 16 times, each frame stored twice). Items that are equal are one output,
        read by all their readers; at most _MOST_OUTPUTS of them. Not where an item could
        overlap another (a slice, None, a list or an array: each would be a copy of its
        own), nor a dask.array chunk (whose size the graph's metadata gives: its slices are
        views that fusion takes inside their readers, where nothing is copied), nor a task
        annotated to run on a GPU (its value stays there, where items are not taken).
        Fusion absorbs neither a split task nor its items."""
        from dask._task_spec import Alias, Task, TaskRef

        wanted = {self.resolve(k) for k in keys}
        parts: Dict[Key, List[Tuple[Key, Any]]] = {}
        refused: Set[Key] = set(wanted) | self.data
        for key in self.order:
            if key in self.aliases or key in self.data:
                continue
            node = self.graph[key]
            source = None
            if (
                isinstance(node, Task) and node.func is operator.getitem and not node.kwargs
                and len(node.args) == 2 and isinstance(node.args[0], (Alias, TaskRef))
                and _key_like(node.args[1]) and len(node.dependencies) == 1
            ):
                ref = node.args[0]
                source = self.resolve(ref.target if isinstance(ref, Alias) else ref.key)
            for dep in self.deps[key]:
                dep = self.resolve(dep)
                if dep == source:
                    parts.setdefault(dep, []).append((key, node.args[1]))
                else:
                    refused.add(dep)
        for key, taken in parts.items():
            outputs: Dict[Any, int] = {}
            for _, item in taken:
                outputs.setdefault(item, len(outputs))
            options = self.options(key)
            if (
                key in refused or key in self.items or len(outputs) > _MOST_OUTPUTS
                or len(self.deps[key]) > _MOST_INPUTS or self.sizes.declared(key)
                or options.get("resources", {}).get("GPU") or "variant" in options
            ):
                continue
            firsts: Dict[int, Key] = {}
            for part, item in taken:
                self.items[part] = (key, outputs[item])
                firsts.setdefault(outputs[item], part)
            self.split[key] = [(firsts[i], item) for item, i in outputs.items()]
            self.taken[key] = [part for part, _ in taken]

    def unsplit(self, key: Key) -> None:
        """Runs the task of ``key`` as written after all, and its items' tasks."""
        del self.split[key]
        for part in self.taken.pop(key):
            del self.items[part]

    def resolve(self, key: Key) -> Key:
        return self.aliases.get(key, key)

    def options(self, key: Key) -> Dict[str, Any]:
        """submit's options for the task of ``key`` from its annotations: ``resources``
        (``{"GPU": 1}`` runs it on a GPU, its array inputs there), ``priority`` (higher
        first, as in Dask) and ``retries`` (depot's: runs again after its worker died; an
        exception the function raises is the task's result, never retried); other
        annotations are Dask distributed's and mean nothing on one host. Values out of
        depot's bounds are refused before anything runs; a resource no worker offers is
        refused by the daemon when its batch is submitted."""
        out: Dict[str, Any] = {}
        resources = self.annotations.get("resources", {}).get(key)
        if resources is not None:
            try:
                amounts = {str(k): float(v) for k, v in dict(resources).items()}
            except (TypeError, ValueError):
                amounts = None
            if amounts is None or not all(
                math.isfinite(v) and v >= 0 for v in amounts.values()
            ) or not amounts.get("GPU", 0) <= 1:
                raise InvalidArgument(
                    f"task {key!r} is annotated with resources {resources!r}: depot takes a "
                    "mapping of names to amounts of 0 or more, a GPU share at most 1, such as "
                    "{'GPU': 1}"
                )
            out["resources"] = amounts
        for name, least, most in (("priority", -(2**31), 2**31 - 1), ("retries", 0, _MOST_RETRIES)):
            value = self.annotations.get(name, {}).get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value == int(value) and least <= value <= most
                ):
                    raise InvalidArgument(
                        f"task {key!r} is annotated with {name} {value!r}: depot takes a "
                        f"whole number from {least} to {most}"
                    )
                out[name] = int(value)
        offload = self.annotations.get(_dask_gpu.OFFLOAD, {}).get(key)
        if offload is not None and not isinstance(offload, bool):
            raise InvalidArgument(
                f"task {key!r} is annotated with {_dask_gpu.OFFLOAD} {offload!r}: True or False"
            )
        if offload:
            out["variant"] = "gpu"  # where it has a GPU form (_Run.encode)
        return out


class _Run:
    """One graph's run: what it submitted, to give up or clean up."""

    def __init__(
        self, client: Client, plan: _Plan, keys: Sequence[Key], batch: int,
        bound: Optional[int] = None,
    ) -> None:
        self.client = client
        self.plan = plan
        # The graph's memory bound on a shared daemon: every task names it (an id of this
        # run's), and the daemon starts a task only while the outputs of the graph's tasks
        # stored in memory, and those declared by its placed tasks, leave room for its own.
        self.bound = _tasks.new_bound(bound) if bound else None
        self.wanted = {plan.resolve(k) for k in keys}
        self.batch = batch
        # Where each key's value is: the output of its task, named before it is submitted
        # (so that tasks in any batch can read it), or the object of a data node.
        self.refs: Dict[Key, ObjectRef] = {}
        # The arguments of tasks too large to travel in the task (Client.submit stores
        # them): read by their task only.
        self.extra: List[ObjectRef] = []
        self.given_up: Set[Key] = set()
        # How many keys not yet given up stand for an output of a split task, where more
        # than one.
        self.sharing: Dict[ObjectRef, int] = {}
        # While following: the keys whose values, or tasks, each output stands for.
        self.key_of: Dict[ObjectRef, List[Key]] = {}
        self.functions = _Functions(client)
        self.functions.tiled = plan.share is not None
        self.gpus: Optional[bool] = None  # whether a worker attached has a GPU (may_offload)
        self.batch_bytes = _BATCH_BYTES
        # The outputs of submitted tasks not seen to have ended, oldest first; and those
        # given up (deleted once their readers are done: one may never be seen sealed).
        self.running: Dict[ObjectRef, None] = {}
        self.given_refs: Set[ObjectRef] = set()
        self.stopped = threading.Event()  # the gets of the results give up (clean_up)

    def encode(self) -> List[Tuple[int, Dict[str, Any]]]:
        """Every task of the graph as submit takes it, producers first, with its place in
        the plan's order: all of them pickled before any is submitted, so that one that
        cannot be is refused before anything runs."""
        plan = self.plan
        token = _depot.random_id().hex()
        tasks: List[Tuple[int, Dict[str, Any]]] = []
        for i, key in enumerate(plan.order):
            if key in plan.aliases or key in plan.items:
                continue  # an item of a split task is its output, named with it
            node = plan.graph[key]
            if key in plan.data:
                self.refs[key] = self.client.put(node.value)
                continue
            deps = plan.deps[key]
            inputs = [self.refs[plan.resolve(d)] for d in deps]
            options = plan.options(key)
            offload = options.pop("variant", None)
            declared = plan.sizes.declared(key)
            array_task = declared > 0 and bool(inputs)  # a dask.array chunk made from others
            fn = "depot.dask.run"
            gpu_bytes: Optional[bytes] = None
            parts = plan.split.get(key)
            try:
                node_bytes = self.functions.dumps(node)
                form = None
                if len(inputs) <= _MOST_INPUTS and self.may_offload(array_task):
                    forms = _dask_gpu.Forms()
                    gpu_bytes = self.functions.dumps(node, forms)
                    form = _dask_gpu.has_form(forms, array_task)
                if parts is not None and form is not None:
                    # Its GPU form would leave its value on a GPU, where no item is taken:
                    # it runs as written, and its items' tasks too (they come after it).
                    plan.unsplit(key)
                    parts = None
                if parts is not None:
                    fn = "depot.dask.run_split"
                    options["num_outputs"] = len(parts)
                elif len(inputs) > _MOST_INPUTS:
                    fn, inputs = "depot.dask.run_gathered", self.gathered(key, inputs, token, i, tasks)
                elif form is not None:
                    fn = "depot.dask.run_offloadable"
                    gpu_bytes = gpu_bytes if form == "replaced" else None
                    if offload:
                        options["variant"] = offload
            except InvalidArgument:
                raise
            except Exception as error:
                raise InvalidArgument(f"task {key!r} cannot be sent to a worker: {error}") from error
            if declared:
                # Reserved before it starts: producers placed at once cannot together
                # overshoot the store's room (a hint: it never holds the graph up for good).
                options["output_bytes"] = declared
            args: Tuple[Any, ...] = (node_bytes, deps, *inputs)
            if fn == "depot.dask.run_offloadable":
                args = (node_bytes, gpu_bytes, deps, *inputs)
            elif parts is not None:
                items = [item for _, item in parts]
                args = (node_bytes, deps, items, [part for part, _ in parts], *inputs)
            task = self.encode_one(key, fn, args, f"depot.dask/{token}/{i}", _label(key), options)
            kind = _kind(key)
            if kind:
                # Its layer: the daemon times each layer's tasks apart (the choice between a
                # CPU and a GPU form), and expects a task that declares no size to make what
                # the most of its layer made so far.
                task["kind"] = kind
            made = [ObjectRef(o, n) for o, n in zip(task["outputs"], task["names"])]
            if parts is None:
                self.refs[key] = made[0]
            else:
                readers: Dict[ObjectRef, int] = {}
                for part in plan.taken[key]:
                    ref = made[plan.items[part][1]]
                    self.refs[part] = ref
                    readers[ref] = readers.get(ref, 0) + 1
                # An output that several item keys stand for goes with the last of them.
                self.sharing.update((r, n) for r, n in readers.items() if n > 1)
            tasks.append((i, task))
        return tasks

    def may_offload(self, array_task: bool) -> bool:
        """Whether a task may have a GPU form worth looking for: some function has one
        (register_gpu), or it is an array task and CuPy is installed; and some worker
        attached has a GPU (asked once a run)."""
        if not _dask_gpu._registered() and not (array_task and _dask_gpu.cupy_installed()):
            return False
        if self.gpus is None:
            self.gpus = any(w.gpus for w in self.client.workers())
        return self.gpus

    def encode_one(
        self, key: Key, fn: str, args: Sequence[Any], name: str, label: str,
        options: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        try:
            task = self.client._task(fn, args, name=name, label=label, **(options or {}))
        except Exception as error:
            raise InvalidArgument(f"task {key!r} cannot be sent to a worker: {error}") from error
        if self.bound is not None:
            task["bound_id"], task["bound_bytes"] = self.bound
        if _tasks.args_stored(task["args"]):
            self.extra.append(ObjectRef(task["inputs"][-1]))
        return task

    def gathered(
        self, key: Key, inputs: List[ObjectRef], token: str, i: int,
        tasks: List[Tuple[int, Dict[str, Any]]],
    ) -> List[ObjectRef]:
        """Tasks that gather ``inputs`` in lists of _MOST_INPUTS (appended to ``tasks``, at
        the place of the task ``i`` that reads them); the refs of their lists."""
        lists = []
        for start in range(0, len(inputs), _MOST_INPUTS):
            name = f"depot.dask/{token}/{i}/{start}"
            task = self.encode_one(
                key, "depot.dask.gather", inputs[start : start + _MOST_INPUTS], name,
                _label(key, f" (inputs {start}-{start + _MOST_INPUTS - 1})"),
            )
            tasks.append((i, task))
            lists.append(ObjectRef(task["outputs"][0], task["names"][0]))
            self.extra.append(lists[-1])  # read by task i only
        if len(lists) > _MOST_INPUTS:
            raise InvalidArgument(f"a task depends on {len(inputs)} others: too many")
        return lists

    def submit(self, tasks: List[Tuple[int, Dict[str, Any]]], give_up: bool = True) -> None:
        """Submits the tasks in batches, giving up each intermediate once its last reader is
        submitted (unless not ``give_up``: then ``follow`` does, once it has seen it)."""
        plan = self.plan
        # Keys by the place in order of the task reading them last.
        read_last: Dict[int, List[Key]] = {}
        for key, last in plan.last_reader.items():
            if key not in self.wanted:
                read_last.setdefault(last, []).append(key)
        # Where each place's tasks end in ``tasks``: a task reading over _MOST_INPUTS values
        # comes after the tasks gathering them, all at its place, and a batch may end among
        # them; the place is through only once its last task is submitted.
        last_of = {place: index for index, (place, _) in enumerate(tasks)}
        given = -1
        submitted = 0
        for chunk in self.batches(tasks):
            self.submit_batch([task for _, task in chunk])
            submitted += len(chunk)
            through = chunk[-1][0]
            if last_of[through] >= submitted:
                through -= 1  # the rest of this place's tasks are in the next batch
            if give_up:
                self.give_up(
                    k for i in range(given + 1, through + 1) for k in read_last.get(i, ())
                )
            given = through
        self.delete_after_tasks(self.extra)
        self.extra = []

    def batches(
        self, tasks: List[Tuple[int, Dict[str, Any]]]
    ) -> Iterator[List[Tuple[int, Dict[str, Any]]]]:
        """The tasks in batches of self.batch tasks and self.batch_bytes at most (which
        submit_batch lowers when a batch alone is past the client's limit)."""
        chunk: List[Tuple[int, Dict[str, Any]]] = []
        size = 0
        for item in tasks:
            cost = _cost(item[1])
            if chunk and (len(chunk) == self.batch or size + cost > self.batch_bytes):
                yield chunk
                chunk, size = [], 0
            chunk.append(item)
            size += cost
        if chunk:
            yield chunk

    def submit_batch(self, batch: List[Dict[str, Any]]) -> None:
        """Submits one batch. The daemon keeps each task until it ends, counted against this
        client (``depotd --client-max-metadata``): a batch past that limit is refused
        whole, and is submitted again once some of the tasks before it have ended. When none
        is known to run, it is tried again twice over 30 ms (a task's output may be sealed a
        moment before the daemon hears that the task ended), then in halves, and the
        batches after it are made no larger than a half; a single task past the limit is
        refused with the daemon's reason."""
        idle = 0  # refusals in a row with no task known to run
        while True:
            try:
                outputs = self.client._submit(batch)
                break
            except LimitExceeded as error:
                if "requests in progress" not in str(error):
                    raise
                if self.make_room():
                    idle = 0
                    continue
                if idle < _IDLE_RETRIES:
                    time.sleep(0.01 * 2**idle)
                    idle += 1
                    continue
                if len(batch) == 1:
                    raise
                half = len(batch) // 2
                self.batch_bytes = max(1, min(self.batch_bytes, sum(map(_cost, batch[:half]))))
                self.submit_batch(batch[:half])
                self.submit_batch(batch[half:])
                return
        for refs in outputs:
            for ref in refs:
                self.running[ref] = None

    def make_room(self) -> bool:
        """Waits until one of the oldest tasks this run submitted and has not seen end has
        ended, or a second has passed; False if none is left. An output given up may have
        been deleted once its readers were done, and one evicted once sealed: neither would
        be seen sealed, so after a second with none seen, the given up ones waited on are
        taken to have ended."""
        if not self.running:
            return False
        part = list(itertools.islice(self.running, _GATHER))
        sealed = self.client._native.wait([r.id for r in part], 1, 1000)
        ended = [r for r, s in zip(part, sealed) if s]
        if not ended:
            ended = [r for r in part if r in self.given_refs]
        for ref in ended:
            del self.running[ref]
        return True

    def give_up(self, keys: Iterable[Key]) -> None:
        refs = []
        for key in keys:
            if key in self.refs and key not in self.given_up:
                self.given_up.add(key)
                ref = self.refs[key]
                others = self.sharing.get(ref, 1) - 1  # keys standing for it still read
                if others:
                    self.sharing[ref] = others
                    continue
                refs.append(ref)
                self.given_refs.add(ref)
        self.delete_after_tasks(refs)

    def delete_after_tasks(self, refs: List[ObjectRef]) -> None:
        for start in range(0, len(refs), self.batch):
            try:
                self.client.delete(refs[start : start + self.batch], after_tasks=True)
            except ObjectNotFound:
                pass  # gone already: deleted (its readers done) or evicted

    def start_gather(self, keys: Sequence[Key]) -> Callable[[], Dict[Key, Any]]:
        """Asks for the results now, before their tasks are submitted: a waiting get takes
        each result as it is sealed, so the store cannot evict one before it is read (a
        result is read by no task, so nothing else holds it). One get of up to _GATHER ids
        on a thread of its own for each part (a Client is thread-safe), asked again every
        _GATHER_SLICE seconds until the run ends (``stop_gather``: after a failure, results
        that will never be made); the function returned waits for them (interruptibly)
        and returns the values by key."""
        refs = [self.refs[self.plan.resolve(k)] for k in keys]
        parts = [refs[start : start + _GATHER] for start in range(0, len(refs), _GATHER)]
        got: List[Any] = [None] * len(parts)

        def get(i: int) -> None:
            while True:
                try:
                    got[i] = ("ok", self.client.get_many(parts[i], timeout=_GATHER_SLICE))
                    return
                except Timeout:
                    if self.stopped.is_set():
                        got[i] = ("error", DepotError("the run ended before its results"))
                        return
                except BaseException as error:  # noqa: BLE001 - re-raised by the caller
                    got[i] = ("error", error)
                    return

        threads = [threading.Thread(target=get, args=(i,), daemon=True) for i in range(len(parts))]
        for t in threads:
            t.start()

        def wait() -> Dict[Key, Any]:
            values: List[Any] = []
            for i, t in enumerate(threads):
                while t.is_alive():
                    t.join(0.2)  # a Ctrl-C gets through between the slices
                kind, value = got[i]
                if kind == "error":
                    raise value
                values += value
            for value in values:
                if isinstance(value, _Raised):
                    raise value.error()
            return dict(zip(keys, values))

        return wait

    def follow(self, state: Dict[str, Any], pretask: List[Any], posttask: List[Any]) -> None:
        """For Dask's local callbacks (a ProgressBar): waits for the tasks to end, moving
        each key from state["waiting"] to state["finished"] and telling the callbacks,
        whose ``result`` is None (the values stay in the store). One wait request a turn,
        answered when a twentieth of what is left has ended or after 100 ms. The graph's
        intermediates are given up here, each once it has been seen sealed (submit did not):
        one deleted before that would never be."""
        pending: Dict[ObjectRef, List[Key]] = {}
        # A split task has no value of its own: it ends as its outputs are sealed, the first
        # item's among them.
        split = ((key, self.refs[parts[0][0]]) for key, parts in self.plan.split.items())
        for key, ref in itertools.chain(split, self.refs.items()):
            if key in state["waiting"]:
                pending.setdefault(ref, []).append(key)  # a split task before its first item
        self.key_of = dict(pending)
        while pending:
            refs = list(pending)
            enough = max(1, len(refs) // 20)
            done: List[ObjectRef] = []
            for start in range(0, len(refs), _GATHER):
                part = refs[start : start + _GATHER]
                ids = [r.id for r in part]
                sealed = self.client._native.wait(ids, min(enough, len(ids)), 100)
                done += [r for r, s in zip(part, sealed) if s]
            for ref in done:
                for key in pending.pop(ref):
                    state["waiting"].discard(key)
                    state["finished"].add(key)
                    for f in pretask:
                        f(key, self.plan.graph, state)
                    for f in posttask:
                        f(key, None, self.plan.graph, state, None)
            self.give_up(
                key for ref in done for key in self.key_of[ref] if key not in self.wanted
            )

    def clean_up(self) -> None:
        """After a failure or an interrupt: what has not started is cancelled, and all the
        graph made goes once no task of it runs any more; the gets of its results end."""
        self.stopped.set()
        refs = list(dict.fromkeys(self.refs.values())) + self.extra
        try:
            for start in range(0, len(refs), self.batch):
                self.client.cancel(refs[start : start + self.batch])
        finally:
            self.delete_after_tasks(refs + self.functions.stored)

    def end(self) -> None:
        """The run is over: the results and the functions sent by value go (the values
        returned view the store until collected)."""
        self.give_up(self.wanted)
        self.delete_after_tasks(self.functions.stored)


_CONTROLS = {c: "?" for c in [*range(0x20), *range(0x7F, 0xA0)]}


def _cost(task: Dict[str, Any]) -> int:
    """What a task takes in a submit request, with room for capnp's structure."""
    return (
        192 + len(task["function"]) + len(task["args"] or b"")
        + len(task.get("label", "").encode()) + len(task.get("kind", "").encode())
        + 16 * (len(task["inputs"]) + len(task.get("outputs", ())))
        + 4 * len(task["host_inputs"])
        + sum(32 + len(name) for name in task["resources"])
    )


def _kind(key: Key) -> str:
    """A task's kind for the daemon's output sizes: its layer (a tuple key's name; a string
    key's name without its token, as Dask's key_split gives it), cut to 256 bytes."""
    from dask.utils import key_split

    name = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else key_split(key)
    return name.encode("utf-8", "backslashreplace")[:256].decode(errors="ignore")


def _label(key: Key, suffix: str = "") -> str:
    """What ``depotctl tasks`` shows of the task of ``key``: the key, cut to the daemon's
    256 bytes."""
    text = key if isinstance(key, str) else repr(key)
    # The daemon takes printable text only: control characters (C0, DEL, C1) become '?'.
    text = text.translate(_CONTROLS)
    room = 256 - len(suffix.encode())
    return text.encode("utf-8", "backslashreplace")[:room].decode(errors="ignore") + suffix


def _flatten(keys: Any) -> List[Key]:
    if isinstance(keys, list):
        out: List[Key] = []
        for k in keys:
            out.extend(_flatten(k))
        return out
    return [keys]


def _pack(keys: Any, values: Mapping[Key, Any]) -> Any:
    if isinstance(keys, list):
        return [_pack(k, values) for k in keys]
    return values[keys]


def _run_graph(
    client: Client, dsk: Any, keys: Any, batch: int, callbacks: Any = None,
    check: Optional[int] = None, share: Optional[int] = None, bound: Optional[int] = None,
) -> Any:
    from dask.callbacks import local_callbacks, unpack_callbacks

    flat = _flatten(keys)
    with local_callbacks(callbacks) as active:
        starts, start_states, pretask, posttask, finishes = unpack_callbacks(active)
        for f in starts:
            f(dsk)
        errored = True
        state: Dict[str, Any] = {"ready": set(), "running": set(), "waiting": set(),
                                 "finished": set(), "cache": {}}
        try:
            plan = _Plan(dsk, flat, share)
            if check is not None:
                projected = project(plan, flat, check)
                if not projected.fits:
                    raise StoreFull(f"the graph cannot run within its bound: {projected.reason()}")
            run = _Run(client, plan, flat, batch, bound)
            try:
                tasks = run.encode()
                state["waiting"] = {k for k in plan.order if k not in plan.aliases}
                for f in start_states:
                    f(plan.graph, state)
                following = bool(pretask or posttask)
                gathered = run.start_gather(flat)
                run.submit(tasks, give_up=not following)
                if following:
                    run.follow(state, pretask, posttask)
                values = gathered()
            except BaseException:
                run.clean_up()
                raise
            errored = False
        finally:
            for f in finishes:
                f(dsk, state, errored)
    run.end()
    return _pack(keys, values)


_active: List["Scheduler"] = []
_lock = threading.Lock()


class Scheduler:
    """depot's scheduler for Dask graphs: ``dask.compute(x, scheduler=s.get)``.

    Attaches to the depotd at ``socket`` (default: ``DEPOT_SOCKET`` or the user's default
    socket), whose worker processes (``depot-worker``) run the tasks; or, with ``workers=N``
    and no socket, starts a private depotd of ``memory`` bytes (default 1 GiB) with N Python
    worker processes, stopped again by :meth:`close`; its pages are allocated as objects
    first use them unless ``prefault`` (``depotd --no-prefault``, as for depot.dask's
    nannies: a private daemon holds only what the graph used). ``gpus`` gives the private
    daemon's workers GPUs, one each: a count (the first ones) or CUDA ordinals; tasks
    annotated ``dask.annotate(resources={"GPU": 1})`` run there, their array inputs on that
    GPU (CuPy arrays where CuPy is installed, else :class:`depot.DeviceArray`), and a
    result left on the GPU stays there for the next GPU task. ``simulate_gpus`` serves
    simulated GPUs instead (see :func:`depot.start_daemon`), for trying this without one.
    ``spill_dir`` gives the private daemon a disk tier there (``depotd --spill-dir``):
    intermediates waiting for their readers spill to it when the store needs room, instead
    of the graph stopping with an error.
    As a context manager it is also what :func:`get` uses inside the ``with`` block, and
    there dask.dataframe shuffles by tasks unless ``dataframe.shuffle.method`` is
    configured (Dask's default on one host writes files; a shuffle's groups are then
    outputs in the store, each made once and read with no copy).

    ``memory`` is also the graphs' bound: on a daemon of its own, its capacity; attached to
    a running one, each graph's own bound there (the daemon starts a task only while the
    outputs of the graph's tasks stored in memory, those declared by its tasks placed, with
    their inputs on disk, and its own declared output fit; when one cannot fit while
    nothing of the graph runs, a daemon with a spill directory moves the graph's oldest
    outputs to disk until it does, and without one the task fails, naming itself, its size
    and the bound), else that daemon's capacity. With ``check``, a
    graph whose projected peak (:func:`plan`) exceeds it is refused before anything runs
    (StoreFull, naming the stage); ``get(..., check=...)`` decides per graph. Tasks whose
    output size the graph's metadata gives (``dask.array`` chunks) declare it to the
    daemon, which starts a task only where its output has room beside those of the tasks
    placed before it. With ``fuse`` (the default), tasks that only slice a chunk, or that
    are the only input of their one reader, run inside that reader while the fused task
    fits ``memory`` over the workers (depot._dask_fusion): their outputs are never stored;
    ``get(..., fuse=False)`` turns it off for a graph.
    """

    def __init__(
        self,
        workers: Optional[int] = None,
        *,
        memory: Optional[str] = None,
        socket: Optional[str] = None,
        batch: int = BATCH,
        prefault: bool = False,
        gpus: Union[int, Sequence[int], None] = None,
        simulate_gpus: Union[int, str, None] = None,
        check: bool = False,
        fuse: bool = True,
        spill_dir: Union[str, "os.PathLike[str]", None] = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise InvalidArgument("workers is a count of worker processes, 1 or more")
        ordinals = list(range(gpus)) if isinstance(gpus, int) else list(gpus or [])
        if (gpus is not None or simulate_gpus is not None or spill_dir is not None) and (
            workers is None or socket
        ):
            raise InvalidArgument(
                "gpus, simulate_gpus and spill_dir are for a private daemon (workers=N, no socket)"
            )
        if workers is not None and len(ordinals) > workers:
            raise InvalidArgument(f"{len(ordinals)} GPUs for {workers} workers: one GPU a worker")
        if batch < 1:
            raise InvalidArgument("batch is a count of tasks, 1 or more")
        private = workers is not None and socket is None
        bound = parse_memory(memory) if memory is not None and not private else None
        # On a shared daemon, memory= is each graph's bound there (a private one's store is).
        self._bound = bound
        self.batch = batch
        self.check = check
        self.fuse = fuse
        self._daemon = None
        if workers is not None and socket is None:
            from ._daemon import start_daemon

            self._daemon = start_daemon(
                memory or "1GiB", workers=workers, prefault=prefault, stop_with_parent=True,
                worker_gpus=ordinals, simulate_gpus=simulate_gpus,
                args=[] if spill_dir is None else ["--spill-dir", os.fspath(spill_dir)],
            )
            socket = self._daemon.socket
        self.client = Client(socket, name="depot.dask scheduler")
        status = self.client.status()
        self.memory: int = bound if bound is not None else status.capacity_bytes
        """The bound a graph's projected peak is checked against (``check``), in bytes."""
        self.workers: int = status.scheduler.workers
        """Worker processes attached when it started: a fused task's share of the bound is
        :attr:`memory` over them."""
        if status.scheduler.workers == 0:
            path = self.client.socket
            self.close()
            raise DepotError(
                f"no worker process is attached to the depotd at {path}: start some "
                "(depot-worker --socket PATH), or use depot.dask.Scheduler(workers=N)"
            )

    def get(self, dsk: Mapping[Key, Any], keys: Any, **kwargs: Any) -> Any:
        """A Dask scheduler's get: the values of ``keys`` (a key, or nested lists of them)
        of the graph ``dsk``. Dask's local callbacks (``dask.diagnostics.ProgressBar``,
        ``callbacks=``) are told as tasks finish (``pretask`` then, too: when a task starts
        is the worker's); ``check`` and ``fuse`` (default: the scheduler's) as above; other
        keyword arguments Dask passes are accepted and not used."""
        check = kwargs.get("check", self.check)
        fuse = kwargs.get("fuse", self.fuse)
        return _run_graph(
            self.client, dsk, keys, self.batch, kwargs.get("callbacks"),
            self.memory if check else None, self.share if fuse else None, self._bound,
        )

    @property
    def share(self) -> int:
        """A fused task's share of the bound, in bytes."""
        return self.memory // max(1, self.workers)

    def plan(self, *collections: Any) -> GraphPlan:
        """:func:`plan` within this scheduler's :attr:`memory`, fused as it would be."""
        return plan(*collections, memory=self.memory, workers=self.workers, fuse=self.fuse)

    def close(self) -> None:
        self.client.close()
        if self._daemon is not None:
            self._daemon.close()
            self._daemon = None

    def __enter__(self) -> "Scheduler":
        with _lock:
            _active.append(self)
        _shuffle_by_tasks(+1)
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _active.remove(self)
        _shuffle_by_tasks(-1)
        self.close()

    def __repr__(self) -> str:
        return f"<depot.dask.Scheduler on {self.client.socket!r}>"


_default: Optional[Scheduler] = None


_SHUFFLE = "dataframe.shuffle.method"
_blocks = 0  # Scheduler blocks open, in all threads
_shuffle_set = False  # whether the first of them set _SHUFFLE


def _shuffle_by_tasks(change: int) -> None:
    """While a Scheduler's ``with`` block is open (``change`` +1 as one opens, -1 as it
    closes), dask.dataframe shuffles by tasks where no method is configured. Dask's
    default on one host is "disk": partd files that every worker appends to and reads
    back; by tasks, a shuffle's groups are outputs in the store, read with no copy (set_index
    on two workers: 0.32 s by disk, 0.20 by tasks). As distributed's Client sets "p2p"
    while it is the default client. Dask's configuration is global: the first block to open
    sets it, and the last to close sets it back unless something else has changed it
    since."""
    global _blocks, _shuffle_set
    try:
        import dask
    except ImportError:
        return
    with _lock:
        _blocks += change
        if change > 0 and _blocks == 1:
            _shuffle_set = dask.config.get(_SHUFFLE, None) is None
            if _shuffle_set:
                dask.config.set({_SHUFFLE: "tasks"})
        elif change < 0 and _blocks == 0 and _shuffle_set:
            _shuffle_set = False
            if dask.config.get(_SHUFFLE, None) == "tasks":
                dask.config.set({_SHUFFLE: None})


def get(dsk: Mapping[Key, Any], keys: Any, **kwargs: Any) -> Any:
    """A Dask scheduler: ``dask.compute(x, scheduler=depot.dask.get)``, or
    ``dask.config.set(scheduler=depot.dask.get)``. Runs the graph on the innermost
    :class:`Scheduler` of a ``with`` block, or else on the workers of the depotd at
    ``DEPOT_SOCKET`` (or the user's default socket), attached to once."""
    global _default
    with _lock:
        scheduler = _active[-1] if _active else None
        if scheduler is None:
            if _default is None:
                _default = Scheduler(socket=os.environ.get("DEPOT_SOCKET"))
            scheduler = _default
    return scheduler.get(dsk, keys, **kwargs)


def plan(
    *collections: Any, memory: Union[str, int, None] = None, workers: Optional[int] = None,
    fuse: bool = True,
) -> GraphPlan:
    """The memory the computation of ``collections`` (as ``dask.compute`` takes them)
    needs, projected before anything runs: the peak of what is live when depot's scheduler
    runs its tasks one at a time in its order (see depot._dask_plan), the stages (each
    layer: its tasks, the bytes each makes), the stages fused into others (with ``fuse``,
    as a :class:`Scheduler` of ``workers`` fuses them: default, the innermost one of a
    ``with`` block's, else one a CPU), the task that needs most at once, and whether it
    fits ``memory`` (a size such as ``"8GiB"`` or bytes; default: the bound of the
    innermost :class:`Scheduler` of a ``with`` block, else this host's memory). Sizes come
    from the graph's metadata (``dask.array`` chunks and dtypes); a task without any counts
    as the sum of its inputs. ``print`` it for a table."""
    import dask
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr
    from dask.core import flatten

    with _lock:
        active = _active[-1] if _active else None
    if memory is None:
        bound = active.memory if active else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        bound = parse_memory(memory)
    if workers is None:
        workers = active.workers if active else os.cpu_count() or 1
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidArgument(f"workers is a count of worker processes, 1 or more, not {workers!r}")
    collections = tuple(c for c in collections if dask.is_dask_collection(c))
    if not collections:
        raise InvalidArgument("plan takes dask collections (arrays, dataframes, delayed)")
    expr = FinalizeCompute(collections_to_expr(collections, True)).optimize()
    keys = list(flatten(expr.__dask_keys__()))
    return project(_Plan(expr, keys, bound // workers if fuse else None), keys, bound)


__all__ = ["Scheduler", "get", "plan", "BATCH"]
