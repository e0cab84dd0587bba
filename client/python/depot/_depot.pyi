"""
depot's C++ client, the low-level layer of the depot package (use depot.Client).
"""

from collections.abc import Mapping, Sequence

from typing_extensions import Buffer


class StoreBuffer(Buffer):
    """
    A sealed object's bytes in shared memory (read-only buffer protocol). Holds one store reference until collected.
    """

    @property
    def id(self) -> bytes:
        """The object's 16-byte id."""

    @property
    def size(self) -> int:
        """Bytes of data."""

    @property
    def address(self) -> int:
        """
        Address of the data in this process (inside a mapping of an arena segment).
        """

    @property
    def metadata(self) -> bytes:
        """The object's metadata blob."""

    def __len__(self) -> int: ...

    @property
    def segment(self) -> int:
        """Arena segment holding the data."""

    @property
    def offset(self) -> int:
        """Offset of the data in its segment."""

    def populate(self) -> None:
        """
        Maps the bytes' pages into this process now, in one system call, instead of a page fault per 4 KiB as they are first read: a first full pass over a large object then runs at nearly the speed of warm memory. For objects read whole; costs a walk of the page tables when they are mapped already. Does nothing on Linux before 5.14.
        """

    def private_copy(self) -> PrivateBuffer:
        """
        A copy of the bytes that this process may write (a PrivateBuffer), made lazily: a copy-on-write mapping of the object's pages, which copies a page into this process's memory when it is first written. Writes never reach the store or other processes.
        """

class PrivateBuffer(Buffer):
    """
    A private copy of a sealed object's bytes (writable buffer protocol; StoreBuffer.private_copy). Holds one store reference until collected.
    """

    @property
    def id(self) -> bytes:
        """The object's 16-byte id."""

    @property
    def size(self) -> int:
        """Bytes of data."""

    @property
    def address(self) -> int:
        """
        Address of the data in this process (inside a mapping of an arena segment).
        """

    @property
    def metadata(self) -> bytes:
        """The object's metadata blob."""

    def __len__(self) -> int: ...

    def populate(self) -> None:
        """
        Maps the bytes' pages into this process now, in one system call, instead of a page fault per 4 KiB as they are first read: a first full pass over a large object then runs at nearly the speed of warm memory. For objects read whole; costs a walk of the page tables when they are mapped already. Does nothing on Linux before 5.14.
        """

class WritableBuffer(Buffer):
    """
    The writable bytes of an object being created. Dropping it before the object is sealed aborts the object.
    """

    @property
    def id(self) -> bytes:
        """The object's 16-byte id."""

    @property
    def size(self) -> int:
        """Bytes of data."""

    @property
    def address(self) -> int:
        """
        Address of the data in this process (inside a mapping of an arena segment).
        """

    @property
    def metadata(self) -> bytes:
        """The object's metadata blob."""

    def __len__(self) -> int: ...

    @property
    def segment(self) -> int:
        """Arena segment holding the data."""

    @property
    def offset(self) -> int:
        """Offset of the data in its segment."""

class DeviceBuffer:
    """
    A sealed object's bytes on a GPU, in the store's pool there. Holds one store reference until it and every DLPack capsule made from it are gone.
    """

    @property
    def id(self) -> bytes: ...

    @property
    def ptr(self) -> int:
        """
        The data's device pointer in this process (a host address on a simulated GPU).
        """

    @property
    def size(self) -> int: ...

    @property
    def device(self) -> int: ...

    @property
    def simulated(self) -> bool: ...

    @property
    def metadata(self) -> bytes: ...

    def dlpack(self, versioned: bool, device_type: int, shape: Sequence[int], strides: Sequence[int] | None, code: int, bits: int, lanes: int) -> object:
        """
        A new DLPack capsule of these bytes: "dltensor_versioned" (version 1.0, read-only flag set) or "dltensor"; strides in elements, None for C order.
        """

class DLPackImport:
    """
    A producer's DLPack tensor, taken from its capsule (which is renamed used_...); close() calls the producer's deleter.
    """

    def __init__(self, capsule: object) -> None: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def versioned(self) -> bool: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def data(self) -> int:
        """The data pointer, byte_offset included."""

    @property
    def device_type(self) -> int: ...

    @property
    def device_id(self) -> int: ...

    @property
    def code(self) -> int: ...

    @property
    def bits(self) -> int: ...

    @property
    def lanes(self) -> int: ...

    @property
    def shape(self) -> list[int]: ...

    @property
    def strides(self) -> list[int] | None:
        """In elements; None: C order."""

def pointer_device(pointer: int) -> int | None:
    """
    The ordinal of the CUDA GPU whose memory `pointer` is, or None if the driver does not know it as device memory (no driver, host memory, a simulated GPU's pointer).
    """

HAVE_CUDA: bool

class GpuInfo:
    """A GPU the daemon serves, and its pool."""

    @property
    def ordinal(self) -> int: ...

    @property
    def uuid(self) -> bytes: ...

    @property
    def name(self) -> str: ...

    @property
    def simulated(self) -> bool: ...

    @property
    def total_bytes(self) -> int: ...

    @property
    def limit_bytes(self) -> int: ...

    @property
    def reserved_bytes(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...

    @property
    def held_bytes(self) -> int: ...

    @property
    def chunks(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class ObjectInfo:
    """What the daemon knows of one object (Client.list)."""

    @property
    def id(self) -> bytes: ...

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def data_size(self) -> int: ...

    @property
    def metadata_size(self) -> int: ...

    @property
    def ref_count(self) -> int: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def delete_pending(self) -> bool: ...

    @property
    def has_checksum(self) -> bool: ...

    @property
    def checksum(self) -> int: ...

    @property
    def create_time_ns(self) -> int: ...

    @property
    def access_time_ns(self) -> int: ...

    @property
    def segment(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def on_host(self) -> bool: ...

    @property
    def gpus(self) -> list[int]: ...

    @property
    def owner_uid(self) -> int: ...

    @property
    def failed(self) -> bool: ...

    @property
    def on_disk(self) -> bool: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

    @property
    def sealed(self) -> bool: ...

class SchedulerStatus:
    """The scheduler's totals (StoreStatus.scheduler)."""

    @property
    def workers(self) -> int: ...

    @property
    def tasks_pending(self) -> int: ...

    @property
    def submitted(self) -> int: ...

    @property
    def completed(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def cancelled(self) -> int: ...

    @property
    def retried(self) -> int: ...

    @property
    def placements(self) -> int: ...

    @property
    def local_bytes(self) -> int: ...

    @property
    def moved_bytes(self) -> int: ...

    @property
    def prefetches(self) -> int: ...

    @property
    def steals(self) -> int: ...

    @property
    def preemptions(self) -> int: ...

    @property
    def host_to_gpu(self) -> float: ...

    @property
    def gpu_to_host(self) -> float: ...

    @property
    def gpu_to_gpu(self) -> float: ...

    @property
    def bandwidths_measured(self) -> bool: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class Setting:
    """A setting the daemon runs with (StoreStatus.settings)."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> str: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ('name', 'value')

class DiskStatus:
    """The disk tier: spilled objects and their I/O (StoreStatus.disk)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def dir(self) -> str: ...

    @property
    def limit_bytes(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...

    @property
    def file_bytes(self) -> int: ...

    @property
    def files(self) -> int: ...

    @property
    def objects(self) -> int: ...

    @property
    def spills(self) -> int: ...

    @property
    def spilled_bytes(self) -> int: ...

    @property
    def spill_seconds(self) -> float: ...

    @property
    def restores(self) -> int: ...

    @property
    def restored_bytes(self) -> int: ...

    @property
    def restore_seconds(self) -> float: ...

    @property
    def drops(self) -> int: ...

    @property
    def dropped_bytes(self) -> int: ...

    @property
    def spill_failures(self) -> int: ...

    @property
    def restore_failures(self) -> int: ...

    @property
    def copies_in_flight(self) -> int: ...

    @property
    def direct_io(self) -> bool: ...

    @property
    def writes(self) -> int: ...

    @property
    def reads(self) -> int: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class StoreStatus:
    """The daemon's capacity, usage and counters."""

    @property
    def daemon_version(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def uptime_ns(self) -> int: ...

    @property
    def socket_path(self) -> str: ...

    @property
    def arena_backend(self) -> str: ...

    @property
    def capacity_bytes(self) -> int: ...

    @property
    def mapped_bytes(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...

    @property
    def held_bytes(self) -> int: ...

    @property
    def pinned_bytes(self) -> int: ...

    @property
    def largest_free_block(self) -> int: ...

    @property
    def kept_bytes(self) -> int: ...

    @property
    def arena_page_bytes(self) -> int: ...

    @property
    def arena_pages(self) -> str: ...

    @property
    def segments(self) -> int: ...

    @property
    def objects_sealed(self) -> int: ...

    @property
    def objects_creating(self) -> int: ...

    @property
    def clients(self) -> int: ...

    @property
    def evictions(self) -> int: ...

    @property
    def evicted_bytes(self) -> int: ...

    @property
    def eviction_enabled(self) -> bool: ...

    @property
    def header_slots(self) -> int: ...

    @property
    def requests(self) -> int: ...

    @property
    def gpus(self) -> list[GpuInfo]: ...

    @property
    def gpu_backend(self) -> str: ...

    @property
    def spills(self) -> int: ...

    @property
    def spilled_bytes(self) -> int: ...

    @property
    def replicas_made(self) -> int: ...

    @property
    def replicas_dropped(self) -> int: ...

    @property
    def arena_page_locked_bytes(self) -> int: ...

    @property
    def objects_on_host(self) -> int: ...

    @property
    def metadata_bytes(self) -> int: ...

    @property
    def metadata_budget_bytes(self) -> int: ...

    @property
    def request_bytes(self) -> int: ...

    @property
    def scheduler(self) -> SchedulerStatus: ...

    @property
    def disk(self) -> DiskStatus: ...

    @property
    def config_file(self) -> str: ...

    @property
    def settings(self) -> list[Setting]: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class ClientInfo:
    """A client connected to the daemon."""

    @property
    def session_id(self) -> int: ...

    @property
    def pid(self) -> int: ...

    @property
    def uid(self) -> int: ...

    @property
    def command(self) -> str: ...

    @property
    def client_name(self) -> str: ...

    @property
    def objects_held(self) -> int: ...

    @property
    def references(self) -> int: ...

    @property
    def bytes_held(self) -> int: ...

    @property
    def requests(self) -> int: ...

    @property
    def connected_time_ns(self) -> int: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class ObjectPlacement:
    """Where an object's bytes are (Client.locate)."""

    @property
    def id(self) -> bytes: ...

    @property
    def found(self) -> bool: ...

    @property
    def failed(self) -> bool: ...

    @property
    def on_host(self) -> bool: ...

    @property
    def gpus(self) -> list[int]: ...

    @property
    def data_size(self) -> int: ...

    @property
    def metadata_size(self) -> int: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class WorkerInfo:
    """A worker attached to the daemon's scheduler (Client.workers)."""

    @property
    def session_id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def cpus(self) -> float: ...

    @property
    def free_cpus(self) -> float: ...

    @property
    def gpus(self) -> list[int]: ...

    @property
    def free_gpu_shares(self) -> list[float]: ...

    @property
    def resources(self) -> dict[str, float]: ...

    @property
    def functions(self) -> list[str]: ...

    @property
    def running(self) -> int: ...

    @property
    def queued(self) -> int: ...

    @property
    def done(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def draining(self) -> bool: ...

    @property
    def attached_s(self) -> float: ...

    @property
    def gpu_functions(self) -> list[str]: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class TaskInfo:
    """
    A task the daemon's scheduler holds, and why it runs where it does (Client.tasks).
    """

    @property
    def task(self) -> int: ...

    @property
    def function(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def submitter(self) -> int: ...

    @property
    def worker(self) -> int: ...

    @property
    def device(self) -> int: ...

    @property
    def outputs(self) -> list[bytes]: ...

    @property
    def priority(self) -> int: ...

    @property
    def attempts(self) -> int: ...

    @property
    def inputs_missing(self) -> int: ...

    @property
    def local_bytes(self) -> int: ...

    @property
    def moved_bytes(self) -> int: ...

    @property
    def wait_s(self) -> float: ...

    @property
    def transfer_s(self) -> float: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def reason(self) -> str: ...

    @property
    def variant(self) -> str: ...

    @property
    def variant_reason(self) -> str: ...

    @property
    def label(self) -> str: ...

    def __repr__(self) -> str: ...

    def to_dict(self) -> dict:
        """
        Every field, as plain values (ids and GPU uuids as hex strings, nested records as dicts), ready for json.dumps.
        """

    _fields: tuple = ...

class TaskContext:
    """A task while its function runs (depot.Worker)."""

    @property
    def task(self) -> int: ...

    @property
    def attempt(self) -> int: ...

    @property
    def device(self) -> int: ...

    @property
    def inputs(self) -> list: ...

    @property
    def outputs(self) -> list: ...

    @property
    def args(self) -> bytes: ...

    def sealed(self, output: int) -> bool: ...

    def put(self, output: int, data: object, metadata: bytes) -> None: ...

    def put_parts(self, output: int, parts: list, offsets: Sequence[int], size: int, metadata: bytes) -> None: ...

    def put_parts_many(self, outputs: list) -> None: ...

    def create(self, output: int, size: int, metadata: bytes) -> WritableBuffer: ...

    def abort(self, output: int) -> None: ...

class Worker:
    """A worker process's attachment to depotd's scheduler."""

    def __init__(self, socket_path: str, name: str, cpus: float, gpus: Sequence[int], resources: Mapping[str, float]) -> None: ...

    def register(self, name: str, cpu: object | None, gpu: object | None = None) -> None: ...

    def run(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def session_id(self) -> int: ...

class PendingGet:
    """A get an event loop awaits (Client.start_get)."""

    @property
    def id(self) -> int:
        """
        The request's id, as Client.take_completed names it (0: answered without a request).
        """

    def ready(self) -> bool:
        """Whether the answer is in (take then does not block)."""

    def cancel(self) -> None:
        """
        Asks the daemon to answer now, as if the timeout had passed (one round trip).
        """

    def take(self) -> list:
        """The StoreBuffers, in order; raises as Client.get_many does. Once."""

class PendingDeviceGet:
    """A get on a GPU an event loop awaits (Client.start_get_on_device)."""

    @property
    def id(self) -> int:
        """
        The request's id, as Client.take_completed names it (0: answered without a request).
        """

    def ready(self) -> bool:
        """Whether the answer is in (take then does not block)."""

    def cancel(self) -> None:
        """
        Asks the daemon to answer now, as if the timeout had passed (one round trip).
        """

    def take(self) -> list:
        """
        The DeviceStoreBuffers, in order; raises as Client.get_many_on_device does. Once.
        """

class PendingWait:
    """A wait an event loop awaits (Client.start_wait)."""

    @property
    def id(self) -> int:
        """
        The request's id, as Client.take_completed names it (0: answered without a request).
        """

    def ready(self) -> bool:
        """Whether the answer is in (take then does not block)."""

    def cancel(self) -> None:
        """
        Asks the daemon to answer now, as if the timeout had passed (one round trip).
        """

    def take(self) -> list[bool]:
        """Per id, whether it was sealed when the daemon answered. Once."""

def _register_errors(types: dict) -> None: ...

def id_from_name(name: str) -> bytes:
    """
    The id of a name: XXH3-128 of its UTF-8 bytes, as in every depot client.
    """

def random_id() -> bytes:
    """A fresh random id."""

def default_socket_path() -> str:
    """
    The socket a Client connects to when given none: $DEPOT_SOCKET, else $XDG_RUNTIME_DIR/depot.sock, else /tmp/depot-<uid>.sock.
    """

def digest(buffer: object) -> bytes:
    """
    XXH3-128 of a contiguous buffer's bytes (16 bytes), computed with the GIL released.
    """

def id_hex(id: bytes) -> str:
    """The 32-character hex form depotctl shows."""

def id_from_hex(hex: str) -> bytes: ...

class Held:
    """
    A reference to an object this client handed off: it stays in the store, and may be handed off again, until this is dropped.
    """

class Client:
    """
    A client of depotd (depot::Client), which depot.Client wraps. Thread-safe.
    """

    def __init__(self, socket_path: str, client_name: str, group: bytes = ..., handoff_grace_ms: int = 0) -> None: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def socket_path(self) -> str: ...

    @property
    def session_id(self) -> int: ...

    def put(self, id: bytes, parts: list, offsets: Sequence[int], size: int, metadata: bytes, name: str, pin: bool, spill: bool = True, handoff: bool = False, ttl_ms: int = 0) -> object: ...

    def handoff(self, ids: Sequence[bytes], device: int, ttl_ms: int = 0) -> None: ...

    def claim(self, ids: Sequence[bytes]) -> list: ...

    def claim_on_device(self, ids: Sequence[bytes], device: int) -> list: ...

    def put_many(self, items: list, pin: bool) -> list: ...

    def create(self, id: bytes, size: int, metadata: bytes, name: str, pin: bool, spill: bool = True) -> WritableBuffer: ...

    def put_device(self, id: bytes, source: int, size: int, device: int, wait_stream: int | None, metadata: bytes, name: str, pin: bool, handoff: bool = False, ttl_ms: int = 0) -> None: ...

    def gpus(self) -> list[GpuInfo]: ...

    def get_on_device(self, id: bytes, device: int, timeout_ms: int) -> DeviceBuffer: ...

    def get_many_on_device(self, ids: Sequence[bytes], device: int, timeout_ms: int) -> list: ...

    def seal(self, id: bytes) -> None: ...

    def abort(self, id: bytes) -> None: ...

    def seal_and_handoff(self, id: bytes, device: int = -1, ttl_ms: int = 0) -> None: ...

    def get(self, id: bytes, timeout_ms: int) -> StoreBuffer: ...

    def get_many(self, ids: Sequence[bytes], timeout_ms: int) -> list: ...

    def wait(self, ids: Sequence[bytes], count: int, timeout_ms: int) -> list[bool]: ...

    def start_get(self, ids: Sequence[bytes], timeout_ms: int) -> PendingGet: ...

    def start_get_on_device(self, ids: Sequence[bytes], device: int, timeout_ms: int) -> PendingDeviceGet: ...

    def start_wait(self, ids: Sequence[bytes], count: int, timeout_ms: int) -> PendingWait: ...

    @property
    def fd(self) -> int: ...

    def pump(self) -> None: ...

    def completion_fd(self) -> int: ...

    def take_completed(self) -> list[int]: ...

    def delete(self, ids: Sequence[bytes], after_tasks: bool = False) -> None: ...

    def prefetch(self, ids: Sequence[bytes], device: int) -> None: ...

    def locate(self, ids: Sequence[bytes]) -> list[ObjectPlacement]: ...

    def contains(self, id: bytes) -> bool: ...

    def list_objects(self, prefix: str = '') -> list[ObjectInfo]: ...

    def status(self) -> StoreStatus: ...

    def metrics(self) -> str: ...

    def clients(self) -> list[ClientInfo]: ...

    def workers(self) -> list[WorkerInfo]: ...

    def tasks(self) -> list[TaskInfo]: ...

    def submit(self, tasks: list) -> list[list[bytes]]: ...

    def cancel(self, outputs: Sequence[bytes]) -> list[str]: ...
