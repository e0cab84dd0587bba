"""Dask tasks that can run on a CPU or a GPU, on depot's scheduler (depot.dask.register_gpu,
depot.dask.offload).

A task of a graph has a GPU form when the functions it calls have one: a function given one
with ``register_gpu(cpu_fn, gpu_fn)`` (a task calling it runs ``gpu_fn`` in its place on a
GPU), or, where CuPy is installed, a ``dask.array`` task whose functions are all NumPy's,
Dask's or the standard library's (they dispatch to CuPy when their inputs are CuPy arrays,
as Dask's own CuPy-backed arrays rely on). Such a task is submitted as the function
``depot.dask.run_offloadable``, which a Python worker with a GPU registers with two variants
(depot.Worker.register's): the CPU one runs the task as the graph has it, the GPU one runs
its GPU form with its array inputs on that GPU. The daemon then chooses per task, as for any
function with two variants: the one it expects to finish first, counting the copies its
inputs need, from what it measured of each for the task's layer (the task's kind) at
similar input sizes. ``offload(x)`` (or ``dask.annotate(depot_offload=True)``) pins the GPU
variant for the tasks of ``x`` that have a GPU form; ``resources={"GPU": 1}`` places them on
a GPU too.

A task's GPU form is found by pickling its node a second time: registered functions are
replaced by their GPU forms as they are met, wherever they are (a partial's function, a
fused subgraph's tasks), and the functions met are noted.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
import types
from typing import Any, Callable, Dict, Optional, Tuple

from ._errors import InvalidArgument

# What a registered CPU function is replaced by: id(cpu) -> (cpu, gpu). The CPU function is
# kept so that its id stays its own.
_forms: Dict[int, Tuple[Any, Callable]] = {}
_forms_lock = threading.Lock()

# The modules whose functions take CuPy arrays where they take NumPy's, through NumPy's
# dispatch (__array_ufunc__, __array_function__) or by only moving arrays around.
_DISPATCHING = frozenset({
    "numpy", "operator", "_operator", "dask", "builtins", "functools", "_functools", "toolz",
    "tlz", "cytoolz", "math", "cupy", "depot",
})

OFFLOAD = "depot_offload"
"""The annotation that pins the GPU variant (offload)."""


def register_gpu(cpu: Any, gpu: Optional[Callable] = None) -> Any:
    """Gives ``cpu``, a function that Dask tasks call, a GPU form ``gpu``, for graphs run by
    depot's scheduler (:class:`depot.dask.Scheduler`, :func:`depot.dask.get`).

    A task calling ``cpu`` (directly, through a partial, or inside a fused task) may then run
    on a GPU of a worker that has one, calling ``gpu`` in its place with its array inputs on
    that GPU: CuPy arrays where CuPy is installed and the GPU is real, else
    :class:`depot.DeviceArray` (a simulated GPU's). What ``gpu`` returns is stored where it
    is: a GPU array in that GPU's pool (for the next task there), anything else in host
    memory. The scheduler runs each task where it expects it to finish first, from what it
    measured of both forms, counting the copies of its inputs; :func:`offload` pins the GPU.
    ``gpu=None`` makes a decorator: ``@depot.dask.register_gpu(np.sort)``. Registering again
    replaces; :func:`unregister_gpu` removes. The registry is this process's: it decides
    what a graph submitted from here does."""
    if gpu is None:
        def decorate(fn: Callable) -> Callable:
            register_gpu(cpu, fn)
            return fn

        return decorate
    if not callable(cpu) or not callable(gpu):
        raise InvalidArgument(
            f"register_gpu takes two callables, a function and its GPU form, not "
            f"{type(cpu).__name__} and {type(gpu).__name__}"
        )
    with _forms_lock:
        _forms[id(cpu)] = (cpu, gpu)
    return gpu


def unregister_gpu(cpu: Any) -> None:
    """Forgets the GPU form of ``cpu`` (nothing if it has none)."""
    with _forms_lock:
        entry = _forms.get(id(cpu))
        if entry is not None and entry[0] is cpu:
            del _forms[id(cpu)]


def _registered() -> bool:
    return bool(_forms)


def _form_of(obj: Any) -> Optional[Callable]:
    entry = _forms.get(id(obj))
    return entry[1] if entry is not None and entry[0] is obj else None


@functools.lru_cache(maxsize=1)
def cupy_installed() -> bool:
    """Whether CuPy can be imported here (looked for once, not imported)."""
    return importlib.util.find_spec("cupy") is not None


def _same(value: Any) -> Any:
    """What a pickled GPU form unpickles to: the form itself."""
    return value


class Forms:
    """One node's GPU form being pickled (the picklers' ``gpu``): replaces registered
    functions by their forms, and notes whether a function met dispatches to CuPy."""

    def __init__(self) -> None:
        self.replaced = 0
        self.foreign: Optional[str] = None  # a function met that does not dispatch
        self.placed: set[int] = set()  # ids of the forms put in: pickled as they are

    def reduction(self, obj: Any) -> Any:
        form = _form_of(obj) if _forms and id(obj) not in self.placed else None
        if form is not None:
            self.replaced += 1
            self.placed.add(id(form))
            return (_same, (form,))
        if self.foreign is None and isinstance(obj, _FUNCTIONS):
            module = getattr(obj, "__module__", None) or ""
            if type(obj).__name__ != "ufunc" and module.split(".")[0] not in _DISPATCHING:
                self.foreign = f"{module}.{getattr(obj, '__qualname__', obj)}"
        return None


_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def has_form(forms: Forms, array_task: bool) -> Optional[str]:
    """Of a node pickled with ``forms``: ``"replaced"`` when its GPU form differs (it calls a
    registered function), ``"dispatch"`` when it is the same node (an array task calling only
    NumPy's and Dask's functions, with CuPy installed), or None: it has no GPU form."""
    if forms.replaced:
        return "replaced"
    if array_task and forms.foreign is None and cupy_installed():
        return "dispatch"
    return None


def offload(*collections: Any) -> Any:
    """``x`` (or each of several collections), its tasks pinned to a GPU's variant: those of
    its graph that have a GPU form (see :func:`register_gpu`) run it on a GPU, the others
    as before. The same as building ``x`` inside ``dask.annotate(depot_offload=True)``.
    Takes Dask collections with a high-level graph (``dask.array``, ``dask.delayed``);
    returns new ones, the originals unchanged."""
    if not collections:
        raise InvalidArgument("offload takes one or more Dask collections")
    out = tuple(_offloaded(x) for x in collections)
    return out[0] if len(out) == 1 else out


def _offloaded(x: Any) -> Any:
    import copy

    from dask.highlevelgraph import HighLevelGraph

    graph = getattr(x, "__dask_graph__", None)
    graph = graph() if graph is not None else None
    if not isinstance(graph, HighLevelGraph):
        raise InvalidArgument(
            f"offload takes Dask collections with a high-level graph (dask.array, "
            f"dask.delayed), not {type(x).__name__}: build it inside "
            "dask.annotate(depot_offload=True) instead"
        )
    layers = {}
    for name, layer in graph.layers.items():
        layer = copy.copy(layer)
        layer.annotations = {**(layer.annotations or {}), OFFLOAD: True}
        layers[name] = layer
    rebuild, args = x.__dask_postpersist__()
    return rebuild(HighLevelGraph(layers, graph.dependencies), *args)
