"""depot.Client: put Python values into depotd and get them back without copies."""

from __future__ import annotations

import os
import weakref
from typing import (
    Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union,
)

from . import _codec, _depot, _device, _tasks
from ._device import DeviceArray
from ._errors import DepotError, InvalidArgument, ObjectExists, ObjectNotFound
from ._ref import ObjectRef

RefLike = Union[ObjectRef, str]
"""An ObjectRef, or the name an object was put with."""


def _ref(target: object) -> ObjectRef:
    """``target`` (an ObjectRef, or the name of one) as an ObjectRef; TypeError for others."""
    if isinstance(target, ObjectRef):
        return target
    if isinstance(target, str):
        return ObjectRef.from_name(target)
    raise TypeError(f"expected an ObjectRef or a name, not {type(target).__name__}")


def _device_ordinal(device: Any) -> int:
    if isinstance(device, bool) or not isinstance(device, int):
        try:
            device = int(device.__index__())
        except AttributeError:
            raise InvalidArgument(
                f"device must be a GPU ordinal (an int) or None for host memory, not {device!r}"
            ) from None
    if device < 0:
        raise InvalidArgument(f"device must be a GPU ordinal (>= 0) or None, not {device}")
    return device


def _ttl_ms(ttl: Optional[float], what: str = "handoff's ttl") -> int:
    """A handoff's ttl (or grace) in seconds (None: none) as the whole milliseconds the
    daemon takes (0: none)."""
    if ttl is None:
        return 0
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not _MIN_TTL_S <= ttl <= _MAX_TTL_S:
        raise InvalidArgument(
            f"a {what} is between {_MIN_TTL_S} and {_MAX_TTL_S} seconds, not {ttl!r}"
        )
    return int(ttl * 1000)


def _check_writable(writable: Any, device: Optional[int]) -> None:
    if not isinstance(writable, bool):
        raise InvalidArgument(f"writable is True or False, not {writable!r}")
    if writable and device is not None:
        raise InvalidArgument(
            "writable=True gives a private copy of a host value; a GPU copy cannot be one "
            "(leave out device=, or copy the DeviceArray)"
        )


def _check_host_options(writable: Any, populate: Any, device: Optional[int]) -> None:
    _check_writable(writable, device)
    if not isinstance(populate, bool):
        raise InvalidArgument(f"populate is True or False, not {populate!r}")
    if populate and device is not None:
        raise InvalidArgument(
            "populate=True maps a host value's pages into this process; a GPU copy has none "
            "(leave out device= or populate=)"
        )


def _decode(buffer: Any, writable: bool, populate: bool = False) -> Any:
    """The value in a StoreBuffer; with ``writable``, in a private copy of its bytes; with
    ``populate``, its pages mapped for reading first (StoreBuffer.populate)."""
    if writable:
        buffer = buffer.private_copy()
    if populate:
        buffer.populate()
    return _codec.decode(buffer)


def _writable_of(target: Any) -> Optional[Any]:
    """The WritableBuffer behind a view returned by create/create_array, if it is one."""
    seen = 0
    while target is not None and seen < 16:
        if isinstance(target, _depot.WritableBuffer):
            return target
        if isinstance(target, memoryview):
            target = target.obj
        else:
            target = getattr(target, "base", None)
        seen += 1
    return None


# What put_many stores one value at a time: GPU arrays, and arrays copied in place.
_ONE_BY_ONE = (_device.DLPackSource, _device.InterfaceSource, _codec.StridedArray)


# The longest time to live of a handoff: the protocol's milliseconds in 32 bits.
# A handoff's ttl as the daemon takes it: whole milliseconds in 32 bits.
_MIN_TTL_S = 0.001
_MAX_TTL_S = (2**32 - 1) / 1000


class Client:
    """A connection to the depot daemon on this host.

    ``socket`` is the daemon's Unix socket; by default ``$DEPOT_SOCKET``, else
    ``$XDG_RUNTIME_DIR/depot.sock``, else ``/tmp/depot-<uid>.sock`` (as depotd). Raises
    :class:`depot.ConnectionError` if no daemon listens there.

    Thread-safe: one Client may serve every thread of a process; each call releases the GIL
    while it waits for the daemon. Values returned by :meth:`get` view the store's shared
    memory and keep their object alive (and unevictable) until they, and every view of them,
    are garbage collected, even after the Client is closed. After ``fork()``, a child must
    connect its own Client.

    ``group`` (16 random bytes, the same in each process) joins a group of clients that hand
    values to one another: see :meth:`handoff`. A group belongs to the uid of its first
    client. ``handoff_grace`` (seconds, up to 49 days; None: none) bounds how long what this
    client hands off outlives it unclaimed: the group gives each such value back that long
    after this client has closed or its process has ended (or at the handoff's ttl, if
    sooner), for a sender whose receivers stop claiming once it is gone (a DataLoader's
    worker).
    """

    def __init__(
        self, socket: Union[str, "os.PathLike[str]", None] = None, *, name: str = "",
        group: Optional[bytes] = None, handoff_grace: Optional[float] = None,
    ) -> None:
        self._group = None if group is None else bytes(group)
        grace_ms = _ttl_ms(handoff_grace, "handoff grace")
        self._handoff_grace = None if handoff_grace is None else float(handoff_grace)
        # The C++ client (depot::Client) this one wraps.
        self._native = _depot.Client(
            "" if socket is None else os.fspath(socket), name, self._group or b"", grace_ms
        )
        # The depot.aio.AsyncClient this one serves, if any: answers are announced per
        # connection, so one AsyncClient takes them all.
        self._aio_client: Optional[Any] = None
        # Functions sent by value, and the refs they are stored under.
        self._functions: "weakref.WeakKeyDictionary[Any, ObjectRef]" = weakref.WeakKeyDictionary()

    @property
    def handoff_grace(self) -> Optional[float]:
        """How long what this client hands off outlives it unclaimed (seconds), or None."""
        return self._handoff_grace

    @property
    def socket(self) -> str:
        """The path of the daemon's socket."""
        return self._native.socket_path

    def close(self) -> None:
        """Closes the connection. Values already returned stay valid."""
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._native.closed else "connected"
        return f"<depot.Client {state} to {self._native.socket_path!r}>"

    # Writing.

    def put(
        self, value: Any, *, name: Optional[str] = None, pin: bool = False,
        device: Optional[int] = None, spill: bool = True,
    ) -> ObjectRef:
        """Stores ``value`` as a new immutable object and returns its reference.

        numpy arrays (of plain dtypes) and bytes-like values are stored as their raw bytes;
        anything else is pickled (protocol 5), with the data of arrays and other buffers
        inside it stored out of band, so they come back without copies. ``name`` gives the
        object a fixed id (the same in every process); without it the id is random.
        ``pin`` keeps the store from evicting the object. ``spill=False``, with a daemon that
        spills to disk (``depotd --spill-dir``), evicts the object for good under memory
        pressure instead of writing it to disk: for values cheaper to recompute than to read.

        A CUDA GPU array (any DLPack producer on a CUDA device: CuPy, PyTorch, JAX; or a
        ``__cuda_array_interface__`` producer) is copied into the store's pool on its own
        GPU, which must be C-contiguous; the copy is complete when put returns. ``device``
        is only for ``__cuda_array_interface__`` producers, which do not say which GPU their
        memory is on (default 0).

        Raises ObjectExists if the name is taken, StoreFull if the store cannot make room,
        InvalidArgument for a value that cannot be pickled, a non-contiguous GPU array, or a
        GPU the daemon does not serve, GpuNotSupported for an array on a device that is
        neither host memory nor a CUDA GPU.
        """
        ref = ObjectRef.from_name(name) if name is not None else ObjectRef(_depot.random_id())
        self._put(ref, value, pin, None if device is None else _device_ordinal(device), spill)
        return ref

    def put_many(
        self, values: Iterable[Any], *, names: Optional[Sequence[str]] = None, pin: bool = False
    ) -> List[ObjectRef]:
        """Stores each value as :meth:`put` does; returns their references in order.

        Small values (up to 32 KiB once encoded) travel to the daemon together, a few hundred
        to a write, so that a batch of them costs about one round trip rather than one each.
        Every value is encoded first: one that cannot be raises before anything is stored.
        Then every value is stored, in order, even after one fails. If any failed, the first
        failure is raised once all have been tried, with two attributes: ``refs``, every
        value's reference (as would have been returned), and ``failed``, a dict from the
        index of each value that was not stored to its exception.
        """
        values = list(values)
        if names is not None and len(names) != len(values):
            raise InvalidArgument(f"{len(values)} values but {len(names)} names")
        refs = [
            ObjectRef.from_name(names[i]) if names is not None else ObjectRef(_depot.random_id())
            for i in range(len(values))
        ]
        encoded = [_codec.encode(v) for v in values]
        failed: Dict[int, DepotError] = {}
        batch: List[tuple] = []
        positions: List[int] = []

        def put_batch() -> None:
            if batch:
                for i, error in zip(positions, self._native.put_many(batch, pin)):
                    if error is not None:
                        failed[i] = error
                batch.clear()
                positions.clear()

        for i, (ref, value, enc) in enumerate(zip(refs, values, encoded)):
            if isinstance(enc, _ONE_BY_ONE):
                put_batch()  # in order, as one put after another
                try:
                    self._put_encoded(ref, value, enc, pin)
                except DepotError as e:
                    failed[i] = e
                continue
            batch.append((ref.id, enc.parts, enc.offsets, enc.size, enc.metadata, ref.name or ""))
            positions.append(i)
        put_batch()
        if failed:
            first = failed[min(failed)]
            first.refs = refs
            first.failed = failed
            raise first
        return refs

    def _put(
        self, ref: ObjectRef, value: Any, pin: bool, device: Optional[int] = None,
        spill: bool = True,
    ) -> None:
        self._put_encoded(ref, value, _codec.encode(value), pin, device, spill=spill)

    def _put_encoded(
        self, ref: ObjectRef, value: Any, encoded: Any, pin: bool, device: Optional[int] = None,
        default_device: Optional[int] = None, spill: bool = True, handoff: bool = False,
        ttl_ms: int = 0,
    ) -> Tuple[Optional[int], Any]:
        """Stores an encoded value; returns the GPU it went to (None: host memory) and, for a
        handoff to host memory, the creator's reference (kept until dropped), else None.
        ``ttl_ms``: a handoff's, as :meth:`handoff` takes it (0: none)."""
        name = ref.name or ""
        if isinstance(encoded, (_device.DLPackSource, _device.InterfaceSource)):
            gpu = _device.put_device(
                self._native, ref, encoded, device, pin, default_device, handoff=handoff,
                ttl_ms=ttl_ms,
            )
            return gpu, None
        if device is not None:
            raise InvalidArgument(
                f"device= is for GPU arrays; a {type(value).__name__} is stored in host memory "
                "(get(..., device=k) copies it to a GPU)"
            )
        if isinstance(encoded, _codec.StridedArray):
            array = encoded.array
            writable = self._native.create(ref.id, array.nbytes, encoded.metadata, name, pin, spill)
            _copy_strided(writable, array)
            if handoff:  # while `writable` holds the creator's reference
                self._native.seal_and_handoff(ref.id, -1, ttl_ms)
                return None, writable
            self._native.seal(ref.id)
            return None, None
        held = self._native.put(
            ref.id, encoded.parts, encoded.offsets, encoded.size, encoded.metadata, name, pin,
            spill, handoff, ttl_ms,
        )
        return None, held

    # Handing values to another process of the group.

    def handoff(
        self, value: Any, *, device: Optional[int] = None, ttl: Optional[float] = None
    ) -> Tuple[ObjectRef, Optional[int]]:
        """Stores ``value`` as :meth:`put` does and hands it to this client's group, for
        another of its processes to take with :meth:`claim`, even after this one has exited.

        The group holds the object until it is claimed, or until every client of the group
        has closed, or (with ``ttl``, seconds, as for :meth:`handoff_again`) until ``ttl``
        has passed unclaimed; once claimed, it goes when the claimer lets go of it. It is deleted at
        once: :meth:`get` no longer finds it, only a claim does. Returns the object's ref and
        the GPU it is on (a GPU array stays on its GPU; None: host memory), which the
        receiver passes to :meth:`claim`. Raises InvalidArgument if this client joined no
        group, and fails as put does.
        """
        ref, gpu, _ = self._handoff(value, device, ttl=ttl)
        return ref, gpu

    def _handoff(
        self, value: Any, device: Optional[int] = None, encoded: Any = None,
        ttl: Optional[float] = None,
    ) -> Tuple[ObjectRef, Optional[int], Any]:
        """handoff, also returning what keeps the object for this client (None for a GPU
        array): while it lives, handoff_again works even after every claim. ``encoded``:
        ``value`` as _codec.encode made it already."""
        ttl_ms = _ttl_ms(ttl)
        if not self._group:
            raise InvalidArgument(
                "this client joined no group (depot.Client(..., group=key)): there is nobody "
                "to hand values to"
            )
        ref = ObjectRef(_depot.random_id())
        if encoded is None:
            encoded = _codec.encode(value)
        gpu, held = self._put_encoded(
            ref, value, encoded, False, device, handoff=True, ttl_ms=ttl_ms
        )
        return ref, gpu, held

    def handoff_again(
        self, ref: RefLike, *, device: Optional[int] = None, ttl: Optional[float] = None
    ) -> None:
        """Hands an object this client's group still holds (handed off and not yet claimed),
        or this client holds a reference to from the daemon (not through a lease: see
        docs/leases.md), to the group once more: one more claim of it, with no copy. Raises
        NotHeld if neither holds it (ObjectNotFound once it is gone).

        With ``ttl`` (seconds, up to 49 days), the group gives this claim back if nobody has
        made it by then, though the group lives on: for a receiver that may never come. A
        claim takes the group's reference that would expire first."""
        self._native.handoff(
            [_ref(ref).id], -1 if device is None else _device_ordinal(device), _ttl_ms(ttl)
        )

    def claim(
        self, ref: RefLike, *, device: Optional[int] = None, writable: bool = False
    ) -> Any:
        """Takes a value handed off in this client's group: as :meth:`get` returns it (with
        ``writable``, as ``get(..., writable=True)`` does), or with ``device=k`` (the GPU it
        was handed off on) a DeviceArray. Each handoff is claimed once. Never waits. Raises
        NotHeld if nothing handed off waits under this ref (claimed already, or its group
        ended), InvalidArgument without a group."""
        _check_writable(writable, device)
        if device is not None:
            buffer = self._native.claim_on_device([_ref(ref).id], _device_ordinal(device))[0]
            return DeviceArray._of(buffer)
        return _decode(self._native.claim([_ref(ref).id])[0], writable)

    def create(self, size: int, *, name: Optional[str] = None, pin: bool = False) -> memoryview:
        """Creates an object of ``size`` bytes for writing in place; returns its writable bytes.

        Only this client sees the object until :meth:`seal`; ``get`` returns it as bytes (a
        read-only memoryview). If the view (and every view of it) is collected before the
        object is sealed, the object is aborted. Do not write it after sealing.
        """
        ref = ObjectRef.from_name(name) if name is not None else ObjectRef(_depot.random_id())
        writable = self._native.create(ref.id, size, _codec.BYTES_METADATA, ref.name or "", pin)
        return memoryview(writable)

    def create_array(
        self, shape: Union[int, Sequence[int]], dtype: Any, *, name: Optional[str] = None,
        pin: bool = False,
    ) -> Any:
        """Creates an object holding a C-order numpy array to fill in place; returns it
        (writable). Seal it with :meth:`seal`; ``get`` then returns a read-only array."""
        ref = ObjectRef.from_name(name) if name is not None else ObjectRef(_depot.random_id())
        return self._create_array(ref, shape, dtype, pin)

    def _create_array(
        self, ref: ObjectRef, shape: Union[int, Sequence[int]], dtype: Any, pin: bool
    ) -> Any:
        layout = _array_layout(shape, dtype)
        writable = self._native.create(ref.id, layout.nbytes, layout.metadata, ref.name or "", pin)
        return layout.view(writable)

    def seal(self, target: Union[RefLike, memoryview, Any]) -> ObjectRef:
        """Seals an object made with :meth:`create` or :meth:`create_array`: it becomes
        immutable and visible to every process. ``target`` is the view they returned (or
        the object's ref or name). Returns the object's reference."""
        writable = _writable_of(target) if not isinstance(target, (ObjectRef, str)) else None
        ref = ObjectRef(writable.id) if writable is not None else _ref(target)
        self._native.seal(ref.id)
        return ref

    def abort(self, target: Union[RefLike, memoryview, Any]) -> None:
        """Drops an object being created (by its view, ref or name)."""
        writable = _writable_of(target) if not isinstance(target, (ObjectRef, str)) else None
        self._native.abort(writable.id if writable is not None else _ref(target).id)

    # Reading.

    def get(
        self, ref: RefLike, *, timeout: Optional[float] = None, device: Optional[int] = None,
        writable: bool = False, populate: bool = False,
    ) -> Any:
        """The value of an object, viewing the store's memory with no copy where it can.

        Waits up to ``timeout`` seconds for an object that is not sealed yet (``None``: for
        ever, interruptible with Ctrl-C; ``0``: not at all). Arrays and memoryviews returned
        are read-only. Raises ObjectNotFound (timeout 0), Timeout, or TaskFailed with the
        task's message for an output of a task that failed.

        With ``writable=True`` they are writable, and private: the value views a
        copy-on-write mapping of the object (StoreBuffer.private_copy), so a page is copied
        into this process's memory only when it is first written, and writes change nobody
        else's value nor the store's. (Host values only: not with ``device``.)

        With ``populate=True``, the value's pages are mapped into this process before it is
        returned, in one system call rather than a page fault per 4 KiB as they are first
        read (StoreBuffer.populate): for a large value that is then read whole, the first
        pass runs at nearly the speed of warm memory. (Host values only.)

        With ``device=k`` (this process's CUDA ordinal), returns a :class:`depot.DeviceArray`
        viewing the object's copy on GPU k, which the daemon makes if there is none yet
        (from another GPU or host memory): an array's shape and dtype, any other object's
        bytes (uint8). Without ``device``, an object put from a GPU comes back as a host
        ndarray (the daemon copies it to host memory). Raises InvalidArgument for a GPU the
        daemon does not serve.
        """
        _check_host_options(writable, populate, device)
        timeout_ms = _codec.parse_timeout(timeout)
        if device is not None:
            buffer = self._native.get_on_device(_ref(ref).id, _device_ordinal(device), timeout_ms)
            return DeviceArray._of(buffer)
        return _decode(self._native.get(_ref(ref).id, timeout_ms), writable, populate)

    def prefetch(self, refs: Iterable[RefLike], *, device: Optional[int] = None) -> None:
        """Copies objects ahead of the gets that will want them: onto GPU ``device`` (this
        process's CUDA ordinal), or into host memory for ``None``. Returns when the copies
        are ready, so a get there afterwards makes none; holds nothing (the copies stay
        until the daemon needs the room). Raises ObjectNotFound naming the first object that
        does not exist or is not sealed (the others are still copied), OutOfMemory when one
        finds no room, InvalidArgument for a GPU the daemon does not serve."""
        ids = [_ref(r).id for r in refs]
        self._native.prefetch(ids, -1 if device is None else _device_ordinal(device))

    def locate(self, refs: Iterable[RefLike]) -> List[_depot.ObjectPlacement]:
        """Where each object's bytes are, in order, as ObjectPlacement records: ``found``
        (sealed and not deleted), ``failed`` (an output of a task that failed: no bytes),
        ``on_host``, ``gpus`` (this process's CUDA ordinals),
        ``data_size`` and ``metadata_size``. Objects this client holds are answered from
        the shared header table with no round trip, the others with one request. Holds
        nothing, so an answer may be out of date by the time it is read."""
        return self._native.locate([_ref(r).id for r in refs])

    def get_many(
        self, refs: Iterable[RefLike], *, timeout: Optional[float] = None,
        device: Optional[int] = None, writable: bool = False, populate: bool = False,
    ) -> List[Any]:
        """The values of several objects, in order, in one request to the daemon. Waits
        and raises as :meth:`get`, naming the first object missing; ``writable`` and
        ``populate`` as there."""
        _check_host_options(writable, populate, device)
        ids = [_ref(r).id for r in refs]
        timeout_ms = _codec.parse_timeout(timeout)
        if device is not None:
            return _device.wrap(
                self._native.get_many_on_device(ids, _device_ordinal(device), timeout_ms)
            )
        buffers = self._native.get_many(ids, timeout_ms)
        return [_decode(b, writable, populate) for b in buffers]

    def _task_value(self, ref: ObjectRef, device: int) -> Any:
        """An input of a task that runs on GPU ``device``: an array as a DeviceArray there
        (the daemon copies it there if it is not yet), any other value from host memory.
        Only arrays are copied to the GPU: an object in host memory is looked at there
        first."""
        forever = _codec.parse_timeout(None)
        placed = self.locate([ref])[0]
        if placed.on_host and device not in placed.gpus:
            buffer = self._native.get(ref.id, forever)
            if not _device.is_array_metadata(buffer.metadata):
                return _codec.decode(buffer)
            del buffer
        on_gpu = self._native.get_on_device(ref.id, device, forever)
        if _device.is_array_metadata(on_gpu.metadata):
            return DeviceArray._of(on_gpu)
        del on_gpu
        return self.get(ref)

    def get_buffer(self, ref: RefLike, *, timeout: Optional[float] = None) -> Any:
        """The raw object: a StoreBuffer (read-only buffer protocol) with ``metadata``,
        ``address`` and ``size``. Holds the object until collected."""
        return self._native.get(_ref(ref).id, _codec.parse_timeout(timeout))

    # Tasks (depotd's scheduler runs them on attached workers: depot.Worker, or C++ ones).

    def submit(
        self,
        fn: Union[str, Callable],
        *args: Any,
        resources: Optional[Mapping[str, float]] = None,
        affinity: Optional[str] = None,
        priority: int = 0,
        retries: int = 1,
        num_outputs: int = 1,
        name: Optional[str] = None,
        raw_args: Optional[bytes] = None,
        detach: bool = False,
        variant: Optional[str] = None,
        label: Optional[str] = None,
        output_bytes: int = 0,
    ) -> Union[ObjectRef, Tuple[ObjectRef, ...]]:
        """Runs ``fn(*args)`` as a task on a worker; returns its output's ObjectRef at once
        (a tuple of ``num_outputs`` refs when it has several). :meth:`get` of it waits for
        the result, and raises :class:`TaskFailed` with the worker's traceback if it failed.

        ``fn`` is the name of a function a worker registered, or any picklable callable
        (stored once, and cached by the workers). An ObjectRef argument is a data
        dependency: the task runs once it is sealed, where its bytes already are if it can,
        and the function gets its value. Other arguments are pickled with the task (stored
        as an object of their own when large). ``raw_args`` passes bytes as they are, for
        functions of C++ workers (refs then are the only positional arguments).

        ``resources``: what the task holds while it runs, default ``{"CPU": 1}``;
        ``{"GPU": 1, "CPU": 0}`` takes a whole GPU and no CPU slot, ``"GPU": 0.25`` a
        quarter of one, other names are custom resources workers offer. ``affinity``:
        ``"soft"`` prefers, ``"hard"`` requires, the GPU holding most of its input bytes.
        Higher ``priority`` runs first; ``retries`` is how often it runs again if its worker
        dies. ``name`` names its output (``name/0``, ``name/1``... for several). A task is
        cancelled if this client disconnects before it starts, unless ``detach`` or another
        task of another client reads its outputs. For a function that workers registered
        with a CPU and a GPU variant, the scheduler chooses per task (``variant=None``,
        for a task that asks no GPU) or ``variant="cpu"``/``"gpu"`` pins one; the GPU
        variant holds one GPU and no CPU slot unless ``resources`` ask a GPU share.
        ``label`` is what :meth:`tasks` and ``depotctl tasks`` show of it: at most 256 bytes
        of UTF-8 without control characters. ``output_bytes``, when known, is what its
        outputs will take: the task then starts only where that much room is left beside
        what the tasks placed before it declared (0: unknown).

        Raises InvalidArgument for a function no worker runs, resources no worker offers or
        bad options, ObjectNotFound for a ref that neither exists nor is made by a task,
        ObjectExists for a taken name.
        """
        task = self._task(fn, args, resources, affinity, priority, retries, num_outputs, name,
                          raw_args, detach, variant, label, output_bytes)
        outputs = self._submit([task])[0]
        return outputs[0] if num_outputs == 1 else tuple(outputs)

    def map(
        self, fn: Union[str, Callable], *iterables: Iterable[Any], **options: Any
    ) -> List[Union[ObjectRef, Tuple[ObjectRef, ...]]]:
        """``submit(fn, *items)`` for each tuple of items of ``iterables`` (as the builtin
        map zips them), submitted in batches of 1,000 tasks; the refs in order. Takes
        submit's keyword options, but not ``name``; and ``memory``, a bound the tasks share
        (bytes, or a size such as ``"2GiB"``): a task starts only while the outputs of the
        group's tasks still stored, those declared by its tasks placed, and its own declared
        ``output_bytes`` (else the most a task of the group made so far) fit it. The others
        wait, however long, for results to be freed (each ref dropped or deleted): consume
        them as they come. A task whose output alone is larger than the bound fails, naming
        itself, its size and the bound."""
        if "name" in options:
            raise InvalidArgument("map names no outputs: give names with submit")
        memory = options.pop("memory", None)
        bound = None
        if memory is not None:
            bound = _tasks.new_bound(_codec.parse_size(memory))
        num_outputs = options.get("num_outputs", 1)
        tasks = [self._task(fn, items, **_task_options(options)) for items in zip(*iterables)]
        if bound is not None:
            for task in tasks:
                task["bound_id"], task["bound_bytes"] = bound
                task["bound_waits"] = True  # the caller frees results as it goes
                if "output_bytes" not in task:
                    # Undeclared: each is expected to make what the most of the group made.
                    task["kind"] = f"map/{bound[0]:x}"
        refs: List[Union[ObjectRef, Tuple[ObjectRef, ...]]] = []
        for start in range(0, len(tasks), 1000):
            for outputs in self._submit(tasks[start : start + 1000]):
                refs.append(outputs[0] if num_outputs == 1 else tuple(outputs))
        return refs

    def cancel(self, refs: Union[RefLike, Iterable[RefLike]]) -> List[str]:
        """Cancels the tasks making ``refs`` that have not started: their outputs become
        failed objects (``get`` raises TaskFailed "cancelled"). One outcome per ref:
        ``"cancelled"``, ``"running"`` (it will finish), ``"finished"`` or ``"unknown"``
        (no task of this daemon makes it)."""
        refs = [refs] if isinstance(refs, (ObjectRef, str)) else list(refs)
        return self._native.cancel([_ref(r).id for r in refs])

    def wait(
        self,
        refs: Iterable[RefLike],
        *,
        timeout: Optional[float] = None,
        return_when: str = "ALL_COMPLETED",
    ) -> Tuple[List[ObjectRef], List[ObjectRef]]:
        """Waits until every ref (``"ALL_COMPLETED"``) or one of them
        (``"FIRST_COMPLETED"``) is ready, or ``timeout`` seconds have passed; returns
        ``(done, not_done)``. Ready means sealed: a task's output whether the task succeeded
        or failed (get tells which). One request, which the daemon answers when enough are
        ready or the time is up (Ctrl-C cancels it); holds nothing."""
        wanted = [_ref(r) for r in refs]
        ids, count = _wait_request(wanted, return_when)
        sealed = self._native.wait(ids, count, _codec.parse_timeout(timeout))
        return _split_done(wanted, sealed)

    def _task(
        self, fn: Union[str, Callable], args: Sequence[Any], resources: Optional[Mapping[str, float]] = None,
        affinity: Optional[str] = None, priority: int = 0, retries: int = 1, num_outputs: int = 1,
        name: Optional[str] = None, raw_args: Optional[bytes] = None, detach: bool = False,
        variant: Optional[str] = None, label: Optional[str] = None, output_bytes: int = 0,
    ) -> Dict[str, Any]:
        """The fields of the task running ``fn(*args)``, as _depot.Client.submit takes."""
        if isinstance(output_bytes, bool) or not isinstance(output_bytes, int) or not (
            0 <= output_bytes < 1 << 64
        ):
            raise InvalidArgument(
                f"output_bytes is a number of bytes from 0 to 2**64 - 1, not {output_bytes!r}"
            )
        inputs: List[ObjectRef] = []
        host_inputs: List[int] = []  # read on host wherever the task runs
        function = _tasks.function_name(fn)
        if function is None:  # a callable, sent by value
            assert callable(fn)
            host_inputs.append(len(inputs))
            inputs.append(self._stored_function(fn))
            function = _tasks.CALL
        data, pickled = _tasks.encode_args(args)
        inputs += data
        if raw_args is not None:
            if pickled is not None:
                raise InvalidArgument(
                    "with raw_args, the positional arguments are refs only (the function of a "
                    "C++ worker gets its inputs and these bytes)"
                )
            inline = bytes(raw_args)
        else:
            inline, store = _tasks.inline_args(pickled)
            if store:
                host_inputs.append(len(inputs))
                inputs.append(self.put(pickled))
        r = dict(resources or {})
        task: Dict[str, Any] = {
            "function": function,
            "inputs": [i.id for i in inputs],
            "args": inline,
            "num_outputs": num_outputs,
            "cpu": float(r.pop("CPU", 1)),
            "gpu": float(r.pop("GPU", 0)),
            "resources": {k: float(v) for k, v in r.items()},
            "affinity": affinity or "none",
            "priority": priority,
            "retries": retries,
            "detach": detach,
            "variant": variant or "auto",
            "host_inputs": host_inputs,
        }
        if label:
            task["label"] = label
        if output_bytes:
            task["output_bytes"] = output_bytes
        if name is not None:
            names = [name] if num_outputs == 1 else [f"{name}/{k}" for k in range(num_outputs)]
            task["outputs"] = [ObjectRef.from_name(n).id for n in names]
            task["names"] = names
        return task

    def _stored_function(self, fn: Callable) -> ObjectRef:
        try:
            ref = self._functions.get(fn)
        except TypeError:  # not weakly referenceable: stored each time it is sent
            ref = None
        if ref is not None:
            return ref
        name, data = _tasks.pickled_function(fn)
        ref = ObjectRef.from_name(name)
        try:
            self.put(data, name=name)
        except ObjectExists:
            pass  # the same function, stored before
        try:
            self._functions[fn] = ref
        except TypeError:
            pass
        return ref

    def _submit(self, tasks: List[Dict[str, Any]]) -> List[List[ObjectRef]]:
        names = [t.pop("names", None) for t in tasks]
        try:
            ids = self._native.submit(tasks)
        except ObjectNotFound:
            # A function stored earlier may have been evicted since: store it again, once.
            if not self._restore_functions(tasks):
                raise
            ids = self._native.submit(tasks)
        return [
            [ObjectRef(i, n[k] if n else None) for k, i in enumerate(outputs)]
            for outputs, n in zip(ids, names)
        ]

    def _restore_functions(self, tasks: List[Dict[str, Any]]) -> bool:
        stored = {ref.id: (fn, ref) for fn, ref in list(self._functions.items())}
        restored = False
        for t in tasks:
            if t["function"] != _tasks.CALL or self.contains(ObjectRef(t["inputs"][0])):
                continue
            entry = stored.get(t["inputs"][0])
            if entry is None:
                continue
            name, data = _tasks.pickled_function(entry[0])
            try:
                self.put(data, name=name)
            except ObjectExists:
                pass
            restored = True
        return restored

    # Managing.

    def delete(
        self, refs: Union[RefLike, Iterable[RefLike]], *, after_tasks: bool = False
    ) -> None:
        """Deletes objects. One still referenced goes when its last reference is released;
        new gets no longer find it. Raises ObjectNotFound for an unknown one (the others
        are still deleted).

        With ``after_tasks``, each object goes once no pending task reads or makes it: how a
        graph's intermediate results are given up, once every task reading them has been
        submitted (an output of a task not run yet counts as found). Those no pending task
        reads or makes are deleted at once."""
        if isinstance(refs, (ObjectRef, str)):
            refs = [refs]
        self._native.delete([_ref(r).id for r in refs], after_tasks)

    def contains(self, ref: RefLike) -> bool:
        """Whether a sealed object with this reference (or name) exists."""
        return self._native.contains(_ref(ref).id)

    def __contains__(self, ref: RefLike) -> bool:
        return self.contains(ref)

    def list(self, prefix: str = "") -> List[Any]:
        """Every object in the store (depot.ObjectInfo), sealed or being created; with
        ``prefix``, those whose names start with it (the daemon leaves the others out).
        Raises InvalidArgument for a prefix longer than a name can be (4,096 bytes)."""
        return self._native.list_objects(prefix)

    def gpus(self) -> List[Any]:
        """The GPUs the daemon serves that this process can use (depot.GpuInfo), by ordinal:
        ``simulated`` is true for a daemon's ``--simulate-gpus`` devices."""
        return self._native.gpus()

    def status(self) -> Any:
        """The daemon's capacity, usage and counters (depot.StoreStatus). ``held_bytes``
        counts the bytes of objects some client holds a reference to."""
        return self._native.status()

    def metrics(self) -> str:
        """The daemon's request counters, latency histograms and gauges, in the Prometheus
        text format (as ``depotd --metrics-port`` serves them at /metrics)."""
        return self._native.metrics()

    def clients(self) -> List[Any]:
        """The connected clients (depot.ClientInfo), this one included."""
        return self._native.clients()

    def workers(self) -> List[Any]:
        """The workers attached to the scheduler (depot.WorkerInfo): what each offers, the
        functions it runs, its running, queued, done and failed tasks, whether it drains."""
        return self._native.workers()

    def tasks(self) -> List[Any]:
        """The tasks the scheduler holds (depot.TaskInfo): state ("waiting", "ready",
        "queued", "running", and for a while "done", "failed", "cancelled"), where each was
        placed and why (input bytes found there and moved there, the estimate's terms), or
        why it waits."""
        return self._native.tasks()


def _task_options(options: Dict[str, Any]) -> Dict[str, Any]:
    known = ("resources", "affinity", "priority", "retries", "num_outputs", "raw_args", "detach",
             "variant", "label", "output_bytes")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"unexpected option(s) {', '.join(unknown)}")
    return dict(options)


def _wait_request(refs: List[ObjectRef], return_when: str) -> Tuple[List[bytes], int]:
    """The ids and count of the wait request for :meth:`Client.wait`'s arguments."""
    if return_when not in ("ALL_COMPLETED", "FIRST_COMPLETED"):
        raise InvalidArgument("return_when is ALL_COMPLETED or FIRST_COMPLETED")
    ids = [r.id for r in refs]
    return ids, (1 if return_when == "FIRST_COMPLETED" and ids else 0)


def _split_done(refs: List[ObjectRef], sealed: List[bool]) -> Tuple[List[ObjectRef], List[ObjectRef]]:
    """(done, not_done) of a wait's answer."""
    return [r for r, s in zip(refs, sealed) if s], [r for r, s in zip(refs, sealed) if not s]


class _ArrayLayout(NamedTuple):
    """A C-order array's shape, dtype, size and metadata, for an object to make it in."""

    shape: Tuple[int, ...]
    dtype: Any
    nbytes: int
    metadata: bytes

    def view(self, writable: Any) -> Any:
        """The array over an object's writable bytes."""
        return _array_over(writable, self.dtype, self.shape)


def _array_layout(shape: Union[int, Sequence[int]], dtype: Any) -> _ArrayLayout:
    import numpy as np

    dtype = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if not _codec._plain_dtype(dtype):
        raise InvalidArgument(f"create_array needs a plain dtype, not {dtype}")
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    return _ArrayLayout(dims, dtype, nbytes, _codec.array_metadata(dtype, "C", dims))


def _array_over(writable: Any, dtype: Any, shape: Tuple[int, ...]) -> Any:
    """A C-order numpy array over an object's writable bytes."""
    import numpy as np

    # Through a memoryview: numpy's types take only built-in buffers before Python 3.12.
    return np.frombuffer(memoryview(writable), dtype=dtype).reshape(shape)


def _copy_strided(writable: Any, array: Any) -> None:
    """Copies a numpy array that is not contiguous into an object's bytes, in C order."""
    import numpy as np

    np.copyto(_array_over(writable, array.dtype, array.shape), array)
