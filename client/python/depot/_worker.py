"""depot.Worker: a process that runs Python functions as tasks of depotd's scheduler."""

from __future__ import annotations

import os
import pickle
import threading
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _codec, _dask_graphs, _depot, _tasks
from ._client import Client, _array_layout, _copy_strided
from ._errors import ConnectionError
from ._ref import ObjectRef

# The attributes depot.task marks a function with: the name it is registered under, and
# its GPU variant.
_MARK = "__depot_task__"
_GPU_MARK = "__depot_task_gpu__"


def task(
    fn: Optional[Callable] = None, *, name: Optional[str] = None, gpu: Optional[Callable] = None
) -> Any:
    """Marks a module's function as a task for the workers that load the module
    (``depot-worker MODULE``, :meth:`Worker.register_module`), under its own name or
    ``name``: ``@depot.task`` or ``@depot.task(name="load")``. ``gpu`` is a GPU variant of
    it (see :meth:`Worker.register`). Returns the function unchanged."""

    def mark(f: Callable) -> Callable:
        setattr(f, _MARK, name or f.__name__)
        if gpu is not None:
            setattr(f, _GPU_MARK, gpu)
        return f

    return mark if fn is None else mark(fn)


# The worker whose task the current thread runs (set while a task's function runs).
_running = threading.local()


def get_client() -> Client:
    """In a task's function: the Client of the worker running it, to read the ObjectRefs
    nested in its arguments (those are passed as they are, not as dependencies) or to put
    objects of its own. Raises RuntimeError anywhere else."""
    client = getattr(_running, "client", None)
    if client is None:
        raise RuntimeError("depot.get_client() is for a task's function, while it runs")
    return client


def output_array(shape: Any, dtype: Any = "float64", *, index: int = 0) -> Any:
    """In a task's function: the task's output ``index`` as a writable numpy array (C order)
    in the store, to fill in place and then return as that output. The worker seals it
    instead of copying a private array into the store: the array is made where its readers
    will map it. Returning anything else as that output drops it (and stores what was
    returned, copying first what that views of it, ``out.T`` or ``{"a": out[:8]}``); so does
    an exception. Raises RuntimeError outside a task, IndexError for an
    output the task does not have, ValueError when called twice for one output."""
    get_client()  # only in a task
    task = _running.task
    if not 0 <= index < len(task.outputs):
        raise IndexError(f"the task has {len(task.outputs)} outputs; there is no output {index}")
    created = _running.created
    if index in created:
        raise ValueError(f"output {index} was made already")
    if task.sealed(index):
        # An earlier attempt stored it before its worker died; it is kept, and what this
        # one computes for it is not used.
        import numpy as np

        return np.empty(shape, dtype=dtype)
    layout = _array_layout(shape, dtype)
    # Made through the task: the daemon seals it with the task's completion.
    array = layout.view(task.create(index, layout.nbytes, layout.metadata))
    created[index] = array
    return array


def task_device() -> Optional[int]:
    """In a task's function: the GPU it runs on (this process's CUDA ordinal), or None for a
    task on host memory. Raises RuntimeError anywhere else."""
    get_client()  # only in a task
    return getattr(_running, "device", None)


def _apart_from(encoded: Any, made: Any) -> Any:
    """`encoded` with a private copy of each of its parts that lies in the numpy array
    `made`'s memory (an output made in place, about to be dropped)."""
    import numpy as np

    if isinstance(encoded, _codec.StridedArray):
        if np.may_share_memory(encoded.array, made):
            return encoded._replace(array=encoded.array.copy())
        return encoded
    if not isinstance(encoded, _codec.Encoded):
        return encoded  # on a GPU: not in host memory made here
    start = made.__array_interface__["data"][0]
    end = start + made.nbytes
    parts = []
    for part in encoded.parts:
        view = memoryview(part)
        address = _codec._address(view)
        inside = address is not None and address < end and start < address + view.nbytes
        parts.append(bytes(view) if inside else part)
    return encoded._replace(parts=parts)


class Worker:
    """A worker: attaches to the daemon's scheduler and runs the tasks it is sent.

    ``cpus`` is the number of CPU slots it offers (tasks asking for ``CPU=1`` that may run
    at once; they share this process's interpreter, so for CPU-bound Python start one
    worker process per slot), ``gpus`` this process's CUDA ordinals it offers, each whole,
    and ``resources`` custom resources such as ``{"ssd": 1}``. Register functions by name
    with :meth:`register` or :meth:`task`, then call :meth:`run`. Any function sent by value
    (``client.submit(callable, ...)``) runs too.

    A function gets its arguments as ``client.submit`` gave them, with the value of each
    ObjectRef in place of the ref (numpy arrays read-only, with no copy; in a task that runs
    on a GPU, arrays as :class:`depot.DeviceArray` on that GPU). What it returns
    is stored as the task's output (as ``Client.put`` stores it); with ``num_outputs=n`` it
    returns n values. An exception fails the task, and ``get`` of its outputs raises
    :class:`depot.TaskFailed` with the traceback.
    """

    def __init__(
        self,
        socket: Union[str, "os.PathLike[str]", None] = None,
        *,
        cpus: float = 1,
        gpus: Optional[Sequence[int]] = None,
        resources: Optional[Mapping[str, float]] = None,
        name: str = "",
    ) -> None:
        name = name or f"python worker {os.getpid()}"
        # Inputs are read, and large outputs written, through a client of its own.
        self._client = Client(socket, name=name + " (data)")
        # None once closed.
        self._worker: Optional[_depot.Worker] = _depot.Worker(
            self._client.socket, name, float(cpus), list(gpus or []), dict(resources or {})
        )
        self._by_value: Dict[bytes, Callable] = {}  # functions sent by value, by object id
        self._lock = threading.Lock()
        # Whether run()'s serving thread runs the C++ worker: close() waits for it to end
        # (notified) before it detaches, so that no task is abandoned while it runs.
        self._serving = False
        self._served = threading.Condition()
        self._worker.register(_tasks.CALL, self._run_by_value)
        # The functions depot.dask's scheduler runs, by name: no object per function.
        # A worker with a GPU registers their GPU variants too.
        for builtin, fn in _dask_graphs.BUILTINS.items():
            on_gpu = _dask_graphs.GPU_BUILTINS.get(builtin) if gpus else None
            self._worker.register(
                builtin,
                lambda task, fn=fn: self._run(fn, task, 0),
                None if on_gpu is None else (lambda task, fn=on_gpu: self._run(fn, task, 0)),
            )

    @property
    def client(self) -> Client:
        """The worker's own Client, for functions that read or write more of the store."""
        return self._client

    def register(
        self,
        name: str,
        fn: Optional[Callable] = None,
        *,
        cpu: Optional[Callable] = None,
        gpu: Optional[Callable] = None,
    ) -> None:
        """Registers ``fn`` as ``name``, before :meth:`run`; a later one replaces it.

        With ``cpu=`` and ``gpu=`` (or ``fn`` and ``gpu=``), registers two variants under
        one name: the CPU one runs tasks placed on host memory, the GPU one tasks placed on
        one of this worker's GPUs, its array arguments as :class:`depot.DeviceArray` on
        that GPU. For each task that asks no GPU, the scheduler runs the variant it expects
        to finish first, counting the copies its inputs need, from what it has measured of
        each at similar input sizes (``submit(..., variant="cpu"|"gpu")`` pins one). Either
        variant may be left out: this worker does not offer it."""
        if fn is not None and cpu is not None:
            raise TypeError("register takes fn or cpu=, not both")
        cpu = fn if fn is not None else cpu
        if cpu is None and gpu is None:
            raise TypeError("register needs a function: fn, cpu= or gpu=")
        self._open().register(
            name,
            None if cpu is None else (lambda task: self._run(cpu, task, 0)),
            None if gpu is None else (lambda task: self._run(gpu, task, 0)),
        )

    def register_module(self, module: Any) -> List[str]:
        """Registers the functions of ``module`` marked with :func:`depot.task`; their names."""
        names = []
        for value in list(vars(module).values()):
            name = getattr(value, _MARK, None)
            if isinstance(name, str) and callable(value):
                self.register(name, value, gpu=getattr(value, _GPU_MARK, None))
                names.append(name)
        return names

    def task(
        self,
        fn: Optional[Callable] = None,
        *,
        name: Optional[str] = None,
        gpu: Optional[Callable] = None,
    ) -> Any:
        """Registers a function under its own name (or ``name``), as a decorator:
        ``@worker.task``, ``@worker.task(name="load")``, or ``@worker.task(gpu=load_gpu)``
        with a GPU variant (see :meth:`register`). Returns it unchanged."""

        def register(f: Callable) -> Callable:
            self.register(name or f.__name__, f, gpu=gpu)
            return f

        return register if fn is None else register(fn)

    def run(self) -> None:
        """Runs tasks until :meth:`stop` (then returns once those running are complete), the
        daemon goes away (raises Disconnected), or Ctrl-C (stops, then raises
        KeyboardInterrupt)."""
        failure: List[BaseException] = []
        done = threading.Event()

        def serve() -> None:
            with self._served:
                worker = self._worker
                self._serving = worker is not None  # None: closed before this thread began
            try:
                if worker is not None:
                    worker.run()
            except BaseException as e:  # handed to the caller's thread
                failure.append(e)
            finally:
                with self._served:
                    self._serving = False
                    self._served.notify_all()
                done.set()

        # The wait is on an Event, not on Thread.join: a signal that interrupts join can
        # leave the thread marked as ended while it still runs (CPython 3.11's threading),
        # and the worker would then be closed under its own tasks. It wakes now and then, as
        # a signal the kernel gives to another thread only flags Python's main thread. Ctrl-C
        # may also come while the thread starts, before it is known to run: close() then
        # still waits for it.
        try:
            threading.Thread(target=serve, name="depot-worker", daemon=True).start()
            while not done.wait(0.2):
                pass
        except KeyboardInterrupt:
            self.stop()
            self._wait_served()
            raise
        if failure:
            raise failure[0]

    def _wait_served(self) -> None:
        """Waits until run()'s serving thread, if it runs, has ended: once stopped, when the
        running tasks are complete. A second Ctrl-C does not cut it short."""
        with self._served:
            while self._serving:
                try:
                    self._served.wait(0.2)
                except KeyboardInterrupt:
                    pass  # stopping already: the running tasks finish first

    def stop(self) -> None:
        """Asks the daemon for no more tasks; :meth:`run` returns once the running ones are
        complete. Thread-safe; nothing to do once closed."""
        worker = self._worker
        if worker is not None:
            worker.stop()

    def _open(self) -> _depot.Worker:
        """The C++ worker; ConnectionError once closed."""
        worker = self._worker
        if worker is None:
            raise ConnectionError("this Worker is closed; make a new one")
        return worker

    def close(self) -> None:
        """Detaches from the daemon (any task it runs is then run again elsewhere) and closes
        its Client. Call it after :meth:`run` has returned; if run()'s serving thread still
        runs (Ctrl-C came as run() started it), it is stopped, and its running tasks are
        complete, first."""
        # A serving thread that Ctrl-C left behind (run() raised as it started) is drained
        # first.
        with self._served:
            if self._serving:
                self.stop()
            self._wait_served()
            # The C++ worker holds the registered functions, which hold this object: dropping
            # it breaks that cycle. A serving thread that begins after this finds none.
            self._worker = None
        self._client.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Running one task (on a thread of the C++ worker, holding the GIL).

    def _run_by_value(self, task: Any) -> Optional[str]:
        try:
            key = task.inputs[0]
            with self._lock:
                fn = self._by_value.get(key)
            if fn is None:
                fn = pickle.loads(self._client.get(ObjectRef(key)))
                with self._lock:
                    self._by_value[key] = fn
        except Exception:
            return "could not load the task's function:\n" + traceback.format_exc()
        return self._run(fn, task, 1)

    def _run(self, fn: Callable, task: Any, first: int) -> Optional[str]:
        try:
            args = task.args
            refs = [ObjectRef(i) for i in task.inputs[first:]]
            # The pickle of a call's arguments, when stored, is its last input: read on host.
            data = refs[:-1] if _tasks.args_stored(args) else refs
            if task.device < 0 or not data:
                values = self._client.get_many(refs) if refs else []
            else:
                values = [self._client._task_value(r, task.device) for r in data]
                values += self._client.get_many(refs[len(data):])
            _running.client = self._client
            _running.device = task.device if task.device >= 0 else None
            _running.task = task
            created: Dict[int, Any] = {}  # outputs made in place (output_array)
            _running.created = created
            try:
                result = fn(*_tasks.decode_args(args, values))
                self._store(task, result, created)
            finally:
                _running.client = None
                _running.task = None
                _running.created = None
                for k in created:  # not returned, or a failure: dropped
                    try:
                        task.abort(k)
                    except Exception:
                        pass  # the failure already reported says more
        except Exception:
            return traceback.format_exc()
        return None

    def _store(self, task: Any, result: Any, created: Dict[int, Any]) -> None:
        outputs = task.outputs
        if len(outputs) == 1:
            results: Sequence[Any] = (result,)
        else:
            try:
                results = tuple(result)
            except TypeError:
                raise ValueError(
                    f"the task has {len(outputs)} outputs: its function returned "
                    f"a {type(result).__name__}, not {len(outputs)} values"
                ) from None
            if len(results) != len(outputs):
                raise ValueError(
                    f"the task has {len(outputs)} outputs: its function returned "
                    f"{len(results)} values"
                )
        # Outputs made in place (output_array) for which the function returned something
        # else: dropped, their memory free for the next object (that output's, made again).
        # What any value views of them is copied out first, whichever output it is.
        dropped = [
            created[k]
            for k, value in enumerate(results)
            if k in created and value is not created[k] and not task.sealed(k)
        ]
        # The values kept as parts, stored together: a task of several outputs waits for
        # the daemon's creates once, not once an output (TaskView.put_parts_many).
        batch: List[Tuple[int, List[Any], List[int], int, bytes]] = []
        for k, value in enumerate(results):
            if task.sealed(k):
                continue  # an earlier attempt stored it before its worker died
            made = created.pop(k, None)
            if made is not None and value is made:
                continue  # filled in place: the daemon seals it with the completion
            # Host values are made through the task, and sealed with its completion (small
            # ones travel in it); a GPU array goes to its own GPU, and one whose GPU its
            # pointer does not tell (a simulated GPU's) to the task's.
            encoded = _codec.encode(value)
            for gone in dropped:
                encoded = _apart_from(encoded, gone)
            if made is not None:
                task.abort(k)  # something else was returned: that is stored
            if isinstance(encoded, _codec.Encoded):
                batch.append((k, encoded.parts, encoded.offsets, encoded.size, encoded.metadata))
                continue
            if isinstance(encoded, _codec.StridedArray):
                _copy_strided(task.create(k, encoded.array.nbytes, encoded.metadata), encoded.array)
                continue
            device = task.device if task.device >= 0 else None
            self._client._put_encoded(
                ObjectRef(outputs[k]), value, encoded, False, default_device=device
            )
        if len(batch) == 1:
            task.put_parts(*batch[0])
        elif batch:
            task.put_parts_many(batch)
