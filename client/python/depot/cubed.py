"""depot.cubed: Cubed plans run on depot's worker processes, with their intermediate arrays
in the store's shared memory instead of files.

    import cubed.array_api as xp, depot.cubed
    with depot.cubed.Executor(workers=4, memory="8GiB") as executor:  # or socket=...
        spec = executor.spec(allowed_mem="500MB")
        a = xp.ones((20000, 20000), chunks=(5000, 5000), spec=spec)
        xp.sum(a @ a.T).compute()

Cubed projects every task's memory from its plan before anything runs (``projected_mem``,
at most ``allowed_mem``) and writes each stage's output to a Zarr store, which the next
stage reads. This executor runs each stage's tasks as depot tasks and, with the spec that
:meth:`Executor.spec` makes, keeps those arrays in a :class:`depot.zarr.Store` of the
daemon: a stage writes each chunk once into shared memory and the next stage's tasks map
it, wherever they run, with no file and no copy. Chunks are stored uncompressed (Cubed's
``zarr_compressor=None``) unless the spec says otherwise: compressing chunks in memory
costs time and saves no copy.

**Memory.** Cubed bounds each task by ``allowed_mem``; its local executors bound only how
many run at once. This one also bounds their sum: it admits a task only while the projected
memory of the tasks it has submitted and not yet seen finish, with the new one, stays within
``memory`` (default: the machine's physical memory less the daemon's arena, where the
arrays live). A stage whose projected memory alone exceeds ``memory`` is refused before
anything runs, naming the stage. The arrays themselves are in the store, whose capacity
bounds them: a computation whose arrays do not fit raises ``depot.StoreFull`` (the store
never evicts them; see depot.zarr).

**Intermediates** are deleted as soon as the last stage that reads them has finished, unless
``keep_intermediates`` (or Cubed's ``resume``, which reads them again). The arrays a
compute returns stay for Cubed to read back after the plan has run, until the executor's
next compute starts; :meth:`Executor.close` (or leaving the ``with`` block, or garbage
collection of the executor) deletes everything under the executor's prefix.

**Faults.** A task that raises runs again up to ``retries`` times (Cubed's executors'
default: 2), then its exception is raised in the caller with the worker's traceback. A task
whose worker dies is run again by the daemon on another worker (the same count). Ctrl-C
cancels the tasks submitted and not yet run and raises KeyboardInterrupt at once; those
already running finish, and closing the executor waits for them (up to a minute) before it
deletes its arrays, since they may still write chunks.

**Callbacks.** Cubed's callbacks see each operation start and end and each task end, with
the task's timings and peak memory as measured in the worker (Cubed's TqdmProgressBar,
HistoryCallback and TimelineVisualizationCallback work).

Stages run one after another (``compute(..., compute_arrays_in_parallel=True)`` runs the
stages of each topological generation together, as Cubed's executors do).
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import networkx as nx
from cubed.runtime.pipeline import visit_node_generations, visit_nodes
from cubed.runtime.types import Callback, DagExecutor
from cubed.runtime.utils import (
    execute_with_stats,
    handle_callbacks,
    handle_operation_end_callbacks,
    handle_operation_start_callbacks,
)
from zarr.core.sync import sync

from . import _codec
from ._client import Client
from ._errors import DepotError, InvalidArgument, ObjectNotFound, StoreFull, TaskFailed
from ._ref import ObjectRef
from .zarr import Store, clear_prefix

__all__ = ["Executor"]

_END = object()  # the end of a stage's items
# How long close() waits for tasks an interrupted compute left running (they may write).
_RUNNING_WAIT_S = 60.0
# Tasks submitted in one request, and in flight at most (each wait names them all): the
# daemon queues what its workers cannot start yet, so more would only cost bytes.
_SUBMIT_BATCH = 1000
_MOST_IN_FLIGHT = 4000
_PLANS_KEPT = 64  # computes started and not yet run or ended that _Plans remembers


def _run_task(function: Any, config: Any, item: Any) -> Tuple[Any, Dict[str, Any]]:
    """What a worker runs for one task of a stage: Cubed's stage function on one item, with
    the timings and peak memory Cubed's callbacks expect."""
    return execute_with_stats(function, item, config=config)


def _clear(socket: str, prefix: str) -> None:
    """Deletes every object under ``prefix`` (the executor's arrays), if the daemon is up."""
    try:
        with Client(socket, name="depot.cubed cleanup") as client:
            clear_prefix(client, prefix)
    except DepotError:  # the daemon is gone, and its objects with it
        pass


class _Plans(Callback):
    """Which arrays each compute returns, for executors to keep: Cubed passes the plan (its
    ``array_names``) to callbacks only, so this one is among Cubed's active callbacks while
    an Executor is open (and only then: other computations see no change)."""

    def __init__(self) -> None:
        # id(dag): (dag, names), oldest first; at most _PLANS_KEPT (a compute that fails on
        # another executor never ends).
        self._returned: Dict[int, Tuple[Any, Set[str]]] = {}
        self._users = 0
        self._lock = threading.Lock()

    def on_compute_start(self, event: Any) -> None:
        plan = getattr(event, "plan", None)
        if plan is not None:
            self._returned[id(event.dag)] = (event.dag, set(plan.array_names))
            while len(self._returned) > _PLANS_KEPT:
                del self._returned[next(iter(self._returned))]

    def on_compute_end(self, event: Any) -> None:
        self._returned.pop(id(event.dag), None)  # a compute no executor of ours ran

    def take(self, dag: Any) -> Optional[Set[str]]:
        """The arrays the compute about to run ``dag`` returns (forgotten here: a compute
        that fails never ends); None if not known."""
        entry = self._returned.pop(id(dag), None)
        return entry[1] if entry is not None and entry[0] is dag else None

    def use(self) -> None:
        with self._lock:
            self._users += 1
            if self._users == 1:
                self.register()

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self.unregister()


_plans = _Plans()


def _release(socket: str, prefix: str) -> None:
    """What closing an executor does, or collecting one never closed."""
    _plans.release()
    _clear(socket, prefix)


def _projected_mem(node: Dict[str, Any]) -> int:
    """The memory Cubed projects for one task of an operation node (0 if it says none)."""
    return int(getattr(node.get("primitive_op"), "projected_mem", 0) or 0)


class _Stage:
    """One stage's tasks: its name, the callable the workers run, its items still to
    submit, and the memory Cubed projects for each task."""

    def __init__(self, name: str, node: Dict[str, Any]) -> None:
        pipeline = node["pipeline"]
        self.name = name
        self.projected_mem = _projected_mem(node)
        self.function = functools.partial(_run_task, pipeline.function, pipeline.config)
        self.items: Iterator[Any] = iter(pipeline.mappable)
        self.submitted = 0


# A task: its stage, its item, and how often it ran and failed.
_Entry = Tuple[_Stage, Any, int]


class _Queue:
    """The tasks still to submit: those to run again first, then the stages' items, the
    stages taken in turn."""

    def __init__(self, stages: List[_Stage]) -> None:
        self._stages = list(stages)
        self._again: List[_Entry] = []
        self._head: Optional[_Entry] = None

    def peek(self) -> Optional[_Entry]:
        if self._head is None:
            self._head = self._again.pop() if self._again else self._next()
        return self._head

    def take(self) -> _Entry:
        entry, self._head = self._head, None
        assert entry is not None
        return entry

    def again(self, entry: _Entry) -> None:
        self._again.append(entry)

    def _next(self) -> Optional[_Entry]:
        while self._stages:
            stage = min(self._stages, key=lambda s: s.submitted)
            item = next(stage.items, _END)
            if item is _END:
                self._stages.remove(stage)
                continue
            stage.submitted += 1
            return stage, item, 0
        return None


class Executor(DagExecutor):
    """Runs Cubed plans on depot's workers: ``cubed.Spec(executor=...)``, or
    ``compute(executor=...)``; see the module's docstring.

    Attaches to the depotd at ``socket`` (default: ``DEPOT_SOCKET`` or the user's default
    socket), whose worker processes run the tasks; or, with ``workers=N`` and no socket,
    starts a private depotd of ``store_memory`` (default 1 GiB) with N Python worker
    processes, stopped by :meth:`close`. ``memory`` bounds the sum of the projected memory
    of the tasks admitted at once (bytes or a size such as ``"8GiB"``). ``retries``: how
    often a failed task runs again. ``keep_intermediates`` keeps every array until
    :meth:`close`.
    """

    def __init__(
        self,
        workers: Optional[int] = None,
        *,
        socket: Optional[str] = None,
        memory: Union[str, int, None] = None,
        store_memory: Union[str, int] = "1GiB",
        retries: int = 2,
        keep_intermediates: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise InvalidArgument(f"workers is a count of worker processes, 1 or more, not {workers!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgument(f"retries is a count, 0 or more, not {retries!r}")
        budget = None if memory is None else _codec.parse_size(memory)
        if budget is not None and budget <= 0:
            raise InvalidArgument(f"memory is a size above 0, not {memory!r}")
        self._daemon = None
        if workers is not None and socket is None:
            from ._daemon import start_daemon

            self._daemon = start_daemon(
                store_memory, workers=workers, prefault=False, stop_with_parent=True
            )
            socket = self._daemon.socket
        self.client = Client(socket, name="depot.cubed executor")
        self.socket: str = self.client.socket
        if budget is None:
            budget = max(_physical_memory() - self.client.status().capacity_bytes, 1 << 30)
        self.memory: int = budget
        self.retries = retries
        self.keep_intermediates = keep_intermediates
        self.prefix = f"cubed/{uuid.uuid4().hex[:16]}"
        self._store = Store(self.prefix, socket=self.socket)
        self._last_returned: List[str] = []  # paths of the last compute's results
        self._submitted = 0  # tasks submitted: their outputs are named <prefix>/tasks/<n>
        self._running: List[ObjectRef] = []  # outputs of tasks an interrupt left running
        _plans.use()
        self._cleanup = weakref.finalize(self, _release, self.socket, self.prefix)

    @property
    def name(self) -> str:
        return "depot"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __reduce__(self) -> Any:
        # Cubed sends the spec, and with it its executor, to the tasks: they get a stand-in.
        return (_Elsewhere, (self.socket, self.prefix))

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Deletes the executor's arrays and stops its private daemon, if it has one. Tasks an
        interrupted compute left running are waited for first (up to a minute), since they
        may still write chunks of its arrays."""
        try:
            if self._running:
                self.client.wait(self._running, timeout=_RUNNING_WAIT_S)
                # Their outputs: the daemon knows them by id only (names are the client's).
                self.client.delete(self._running, after_tasks=True)
        except ObjectNotFound:
            pass
        finally:
            self._running = []
            self._cleanup()
            self.client.close()
        if self._daemon is not None:
            self._daemon.close()
            self._daemon = None

    def store(self) -> Store:
        """The Zarr store of this executor's arrays (under its prefix)."""
        return self._store

    def spec(self, **options: Any) -> Any:
        """A ``cubed.Spec`` that runs on this executor with its intermediate arrays in the
        store (``intermediate_store``), uncompressed unless ``zarr_compressor`` is given;
        other options (``allowed_mem``, ``reserved_mem``...) as cubed.Spec takes them."""
        import cubed

        for given in ("executor", "intermediate_store", "work_dir"):
            if given in options:
                raise InvalidArgument(f"Executor.spec sets {given} itself")
        options.setdefault("zarr_compressor", None)
        return cubed.Spec(intermediate_store=self.store(), executor=self, **options)

    # Cubed's executor interface.

    def execute_dag(
        self,
        dag: nx.MultiDiGraph,
        callbacks: Optional[Sequence[Callback]] = None,
        spec: Any = None,
        compute_id: Optional[str] = None,
        resume: Optional[bool] = None,
        compute_arrays_in_parallel: Optional[bool] = None,
        **kwargs: Any,
    ) -> None:
        stages = [name for name, _ in visit_nodes(dag)]
        projected = {name: _projected_mem(dag.nodes[name]) for name in stages}
        largest = max(stages, key=lambda name: projected[name], default=None)
        if largest is not None and projected[largest] > self.memory:
            raise StoreFull(
                f"depot.cubed: operation {largest} projects {projected[largest]:,} bytes for "
                f"one task, more than the executor's memory bound of {self.memory:,} bytes"
            )
        returned = _plans.take(dag)
        # Without the plan (execute_dag called other than by cubed.compute), every array stays.
        keep = self.keep_intermediates or bool(resume) or returned is None
        if not keep:
            # What the last compute returned has been read back since: it goes now, so that
            # a session of computes holds at most one compute's results.
            self._delete_arrays(self._last_returned)
        self._last_returned = [] if keep else self._arrays_of(dag, returned or set())
        finished: Set[str] = set()
        freed: Set[str] = set()
        groups = (
            [[name for name, _ in generation] for generation in visit_node_generations(dag)]
            if compute_arrays_in_parallel
            else [[name] for name in stages]
        )
        for group in groups:
            for name in group:
                handle_operation_start_callbacks(callbacks, name)
            running = [_Stage(name, dag.nodes[name]) for name in group]
            try:
                self._run(running, callbacks)
            finally:
                self._forget_functions(running)
            for name in group:
                handle_operation_end_callbacks(callbacks, name)
            finished.update(group)
            if not keep:
                assert returned is not None
                self._free_intermediates(dag, finished, freed, returned)

    # Running stages.

    def _run(self, stages: List[_Stage], callbacks: Optional[Sequence[Callback]]) -> None:
        """Runs the stages' tasks, admitting them while their projected memory fits. A task's
        output is named before it is submitted and stays in ``in_flight`` until it has been
        deleted, so that an interrupt anywhere leaves no task running and nothing stored."""
        client = self.client
        queue = _Queue(stages)
        in_flight: Dict[ObjectRef, _Entry] = {}  # each task's output: the task
        used = 0
        try:
            while True:
                used = self._admit(queue, in_flight, used)
                if not in_flight:
                    return
                done, _ = client.wait(list(in_flight), return_when="FIRST_COMPLETED")
                for ref in done:
                    stage, item, attempt = in_flight[ref]
                    try:
                        result, stats = client.get(ref)
                    except TaskFailed:
                        if attempt >= self.retries:
                            raise
                        queue.again((stage, item, attempt + 1))
                        continue
                    finally:
                        client.delete(ref)
                        del in_flight[ref]
                        used -= stage.projected_mem
                    stats["name"] = stage.name
                    handle_callbacks(callbacks, result, stats)
        except BaseException:
            if in_flight:
                # What has not started is cancelled (its output sealed as failed). What runs
                # finishes, and may still write chunks: close() waits for it before it
                # deletes the executor's arrays. An output named and never submitted, or
                # deleted already, is "unknown" to cancel and not found by delete.
                refs = list(in_flight)
                outcomes = client.cancel(refs)
                self._running.extend(r for r, o in zip(refs, outcomes) if o == "running")
                try:
                    client.delete([r for r, o in zip(refs, outcomes) if o != "running"])
                except ObjectNotFound:
                    pass
            raise

    def _admit(self, queue: "_Queue", in_flight: Dict[ObjectRef, "_Entry"], used: int) -> int:
        """Submits, in one request, the next tasks whose projected memory fits beside that of
        the tasks in flight (at least one if none is); returns the memory then in use."""
        batch: List[_Entry] = []
        while len(batch) < _SUBMIT_BATCH and len(in_flight) + len(batch) < _MOST_IN_FLIGHT:
            entry = queue.peek()
            if entry is None:
                break
            if (in_flight or batch) and used + entry[0].projected_mem > self.memory:
                break
            batch.append(queue.take())
            used += entry[0].projected_mem
        if batch:
            tasks = []
            for entry in batch:
                stage, item, _ = entry
                self._submitted += 1
                name = f"{self.prefix}/tasks/{self._submitted}"
                tasks.append(self.client._task(stage.function, (item,), retries=self.retries,
                                               label=f"cubed {stage.name}", name=name))
                in_flight[ObjectRef.from_name(name)] = entry
            self.client._submit(tasks)
        return used

    def _forget_functions(self, stages: List[_Stage]) -> None:
        """Deletes the stages' functions from the store (each stored once when its first task
        was submitted), once no task that reads them is pending."""
        refs = [self.client._functions.get(stage.function) for stage in stages]
        try:
            self.client.delete([r for r in refs if r is not None], after_tasks=True)
        except ObjectNotFound:  # a function two stages share, deleted once
            pass

    def _ours(self, target: Any) -> Optional[str]:
        """The path of an array node's target, if it is an array of this executor's own store
        (Executor.spec's intermediate_store): those alone are ever deleted here, never an
        array the user keeps in another depot.zarr.Store (cubed.to_zarr, store)."""
        path = getattr(target, "path", None)
        if getattr(target, "store", None) == self._store and isinstance(path, str) and path:
            return path
        return None

    def _arrays_of(self, dag: nx.MultiDiGraph, names: Set[str]) -> List[str]:
        """The paths of the named arrays of the graph that are in this executor's store."""
        paths = [self._ours(dag.nodes[name].get("target")) for name in names if name in dag.nodes]
        return [path for path in paths if path is not None]

    def _delete_arrays(self, paths: List[str]) -> None:
        for path in paths:
            sync(self._store.delete_dir(path))

    def _free_intermediates(
        self, dag: nx.MultiDiGraph, finished: Set[str], freed: Set[str], returned: Set[str]
    ) -> None:
        """Deletes the arrays of this executor's store made by finished stages whose every
        reader has finished too, except those the compute returns (which Cubed reads back
        after the plan has run)."""
        for name, data in dag.nodes(data=True):
            path = self._ours(data.get("target"))
            if path is None or name in freed or name in returned:
                continue
            makers = list(dag.predecessors(name))
            readers = list(dag.successors(name))
            if (
                readers
                and any(m in finished for m in makers)
                and all(r in finished or "pipeline" not in dag.nodes[r] for r in readers)
            ):
                self._delete_arrays([path])
                freed.add(name)


class _Elsewhere(DagExecutor):
    """A depot.cubed.Executor in another process than the one that made it (in a task's
    spec): it can run nothing there."""

    def __init__(self, socket: str, prefix: str) -> None:
        super().__init__(socket=socket, prefix=prefix)

    @property
    def name(self) -> str:
        return "depot"

    def execute_dag(self, dag: nx.MultiDiGraph, **kwargs: Any) -> None:
        raise InvalidArgument(
            "a depot.cubed.Executor runs plans only in the process that made it "
            f"(this one was sent from there; its daemon is at {self.kwargs['socket']})"
        )


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
