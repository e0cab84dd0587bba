"""depot.zarr: a Zarr store (Zarr 3's ``zarr.abc.store.Store``) whose keys are objects in a
running depotd, so that the processes of a host share arrays with no copy and no disk.

    import zarr, depot.zarr
    store = depot.zarr.Store("experiments/run-7")   # keys named experiments/run-7/<key>
    z = zarr.create_array(store, shape=(10000, 10000), chunks=(1000, 1000), dtype="f8")
    z[:] = 1.0                         # each chunk: a pointer and its value in the store
    zarr.open_array(depot.zarr.Store("experiments/run-7"), mode="r")[:10]  # any process

Each key is an object named ``<prefix>/<key>`` (``depotctl ls`` shows them): a metadata
document's value itself, and for any other key (a chunk) a pointer, a few bytes naming the
object that holds the value, ``#<prefix>/<key>#<random>`` (so that a chunk can be replaced
while readers view its old value: below). Every object is pinned, so that the store never
evicts it: it leaves only when it is deleted (``Store.delete``, ``delete_dir``, ``clear``),
or the daemon stops. A store that cannot fit a value raises ``depot.StoreFull``; nothing is
dropped to make room.

Reads view the store's memory: ``get`` of a chunk returns a Buffer over the object's pages
in this process (a read-only mapping), and a byte range is a slice of it, with no copy.
Metadata documents (``zarr.json``, and Zarr 2's ``.zarray``, ``.zgroup``, ``.zattrs``,
``.zmetadata``) are read as copies instead, because Zarr rewrites them in place and a
document being read must not hold up its next version (below).

Objects are immutable, and the daemon gives a deleted object's name to no new object while a
reader still views it. So ``set`` of a chunk stores the value under a new name, then
replaces the key's pointer (delete, then put: pointers are read as copies, so nobody holds
one for longer than a read), then deletes the old value: a reader that views it keeps it
intact until it lets go, and Zarr's own partial writes (which view the old chunk while they
write the new one) never wait. A document is replaced the same way as a pointer: ``set``
retries while a raw reader of it holds it (up to ``replace_timeout`` seconds, then raises
``depot.ObjectExists`` saying why). Between a pointer's delete and its new seal a reader
finds no value for the key (Zarr reads a missing chunk as the fill value): a key written
while others read it is not replaced atomically; and two processes that replace one key at
once may leave the older value behind, unnamed by any pointer, until its directory is
deleted. ``set_if_not_exists`` is atomic (the daemon refuses a second object of one name).

The store is picklable (its socket, prefix and mode travel; each process connects its own
client, shared by all stores of the process on that socket), and two stores on the same
socket and prefix are equal. Calls are answered by the daemon at once: none waits for
another process. Puts of 1 MiB or more copy on a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import threading
import time
from typing import Any, AsyncIterator, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store as _ZarrStore,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from ._client import Client
from ._errors import LimitExceeded, ObjectExists, ObjectNotFound
from ._ref import ObjectRef

__all__ = ["Store"]

# A prefix: segments of letters, digits, '.', '_' and '-', joined by single slashes.
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_MAX_NAME_BYTES = 4096  # the daemon's limit on an object's name
# Keys Zarr keeps documents under (read as copies: see the module's docstring).
_DOCUMENTS = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
# Values this large are put from a worker thread, so that the copy does not hold the loop.
_OFF_LOOP_BYTES = 1 << 20
_DELETE_BATCH = 10_000  # names a delete request carries
# The metadata of a pointer: its bytes are the name of the object holding the key's value.
_POINTER = b"depot-zarr/1 pointer"
# Room in a name for a value's "#" before the prefix and "#<16 hex digits>" after the key.
_VALUE_NAME_EXTRA = 18
# How often a read follows a pointer whose value was replaced meanwhile before it gives up.
_RESOLVE_TRIES = 8


def _check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"depot.zarr.Store: prefix must be a str, not {type(prefix).__name__}")
    segments = prefix.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError(
                f"depot.zarr.Store: prefix {prefix!r} must be segments joined by single "
                "slashes, none empty, '.' or '..'"
            )
        if not _PREFIX_SEGMENT.fullmatch(segment):
            bad = next(c for c in segment if not _PREFIX_SEGMENT.fullmatch(c))
            raise ValueError(
                f"depot.zarr.Store: prefix {prefix!r} has the character {bad!r}; a prefix "
                "holds letters, digits, '.', '_', '-' and '/' between segments"
            )
    if len(prefix.encode()) > _MAX_NAME_BYTES // 2:
        raise ValueError(
            f"depot.zarr.Store: prefix of {len(prefix.encode())} bytes is longer than "
            f"{_MAX_NAME_BYTES // 2}"
        )
    return prefix


# One client per socket and process, shared by the stores of the process (pickled stores
# reconnect here: a forked child must not use its parent's connection).
_clients: Dict[Optional[str], Tuple[int, Client]] = {}
_clients_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


def _client_for(socket: Optional[str]) -> Client:
    with _clients_lock:
        entry = _clients.get(socket)
        if entry is None or entry[0] != os.getpid():
            entry = (os.getpid(), Client(socket, name="depot.zarr"))
            _clients[socket] = entry
        return entry[1]


def delete_names(client: Client, names: List[str]) -> None:
    """Deletes the named objects, 10,000 a request, or half as many again while the daemon
    finds that past its --max-batch (100,000 by default); those deleted meanwhile are passed
    over."""
    batch, start = _DELETE_BATCH, 0
    while start < len(names):
        part = names[start : start + batch]
        try:
            client.delete(part)
        except ObjectNotFound:  # the others of the batch are deleted all the same
            pass
        except LimitExceeded:
            if batch == 1:
                raise
            batch //= 2
            continue
        start += len(part)


def clear_prefix(client: Client, prefix: str, key_prefix: str = "") -> None:
    """Deletes the keys of the store ``prefix`` that start with ``key_prefix`` (empty, or
    ending with "/"): their pointers and documents, and the values they name."""
    names = [o.name for o in client.list(f"{prefix}/{key_prefix}")]
    names += [o.name for o in client.list(f"#{prefix}/{key_prefix}")]
    delete_names(client, names)


def _is_document(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in _DOCUMENTS


def _byte_range(size: int, byte_range: Optional[ByteRequest]) -> Tuple[int, int]:
    """[start, stop) of an object of ``size`` bytes that ``byte_range`` asks for."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        if byte_range.start < 0 or byte_range.end < byte_range.start:
            raise ValueError(f"Unexpected byte_range, got {byte_range}: a negative or reversed range")
        return min(byte_range.start, size), min(byte_range.end, size)
    if isinstance(byte_range, OffsetByteRequest):
        if byte_range.offset < 0:
            raise ValueError(f"Unexpected byte_range, got {byte_range}: a negative offset")
        return min(byte_range.offset, size), size
    if isinstance(byte_range, SuffixByteRequest):
        if byte_range.suffix < 0:
            raise ValueError(f"Unexpected byte_range, got {byte_range}: a negative suffix")
        return max(size - byte_range.suffix, 0), size
    raise TypeError(f"Unexpected byte_range, got {byte_range!r}")


class Store(_ZarrStore):
    """A Zarr store keeping each key as an object ``<prefix>/<key>`` (a chunk's: a pointer
    to its value) of the depotd at ``socket`` (default: ``$DEPOT_SOCKET``, else the default
    socket), pinned until deleted.

    ``replace_timeout``: how long ``set`` of an existing document (or a chunk's pointer)
    waits for a raw reader to let go of it before raising ``depot.ObjectExists`` (module
    docstring)."""

    supports_writes = True
    supports_deletes = True
    supports_listing = True

    def __init__(
        self,
        prefix: str = "zarr",
        *,
        socket: Union[str, "os.PathLike[str]", None] = None,
        read_only: bool = False,
        replace_timeout: float = 10.0,
    ) -> None:
        super().__init__(read_only=read_only)
        self._prefix = _check_prefix(prefix)
        self._socket = None if socket is None else os.fspath(socket)
        if not isinstance(replace_timeout, (int, float)) or not replace_timeout >= 0:
            raise ValueError(
                f"depot.zarr.Store: replace_timeout must be a number of seconds >= 0, "
                f"not {replace_timeout!r}"
            )
        self._replace_timeout = float(replace_timeout)

    @property
    def prefix(self) -> str:
        """The prefix of this store's object names."""
        return self._prefix

    @property
    def socket(self) -> Optional[str]:
        """The daemon's socket as given (None: the default)."""
        return self._socket

    @property
    def _client(self) -> Client:
        return _client_for(self._socket)

    def with_read_only(self, read_only: bool = False) -> "Store":
        return Store(
            self._prefix, socket=self._socket, read_only=read_only,
            replace_timeout=self._replace_timeout,
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Store)
            and self._prefix == other._prefix
            and self._socket == other._socket
        )

    def __hash__(self) -> int:
        return hash((self._prefix, self._socket))

    def __repr__(self) -> str:
        where = "" if self._socket is None else f", socket={self._socket!r}"
        mode = ", read_only=True" if self.read_only else ""
        return f"depot.zarr.Store({self._prefix!r}{where}{mode})"

    def __getstate__(self) -> Dict[str, Any]:
        return {
            "prefix": self._prefix, "socket": self._socket, "read_only": self._read_only,
            "replace_timeout": self._replace_timeout,
        }

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["prefix"], socket=state["socket"], read_only=state["read_only"],
            replace_timeout=state["replace_timeout"],
        )

    # Names.

    def _name(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise ValueError(f"depot.zarr.Store: a key is a non-empty str, not {key!r}")
        name = f"{self._prefix}/{key}"
        longest = len(name.encode()) + (0 if _is_document(key) else _VALUE_NAME_EXTRA)
        if longest > _MAX_NAME_BYTES:
            raise ValueError(
                f"depot.zarr.Store: key {key[:64]!r}... makes an object name of "
                f"{longest} bytes, longer than depot's limit of {_MAX_NAME_BYTES}"
            )
        return name

    def _value_name(self, key: str) -> str:
        """A new name for a value of ``key`` (a chunk's), unique to this write."""
        return f"#{self._prefix}/{key}#{secrets.token_hex(8)}"

    def _target(self, found: Any, key: str) -> Optional[str]:
        """The name a pointer names; None for an object that is a value itself."""
        if bytes(found.metadata) != _POINTER:
            return None
        try:
            return bytes(memoryview(found)).decode()
        except UnicodeDecodeError:
            raise ValueError(
                f"depot.zarr.Store: the pointer of key {key!r} names no object (not UTF-8): "
                "something other than depot.zarr wrote it"
            ) from None

    def _value(self, key: str) -> Any:
        """The StoreBuffer holding ``key``'s value (following its pointer); None if there is
        no such key."""
        client, name = self._client, self._name(key)
        for _ in range(_RESOLVE_TRIES):
            try:
                found = client.get_buffer(name, timeout=0)
            except ObjectNotFound:
                return None
            target = self._target(found, key)
            if target is None:
                return found
            del found
            try:
                return client.get_buffer(target, timeout=0)
            except ObjectNotFound:
                continue  # replaced since the pointer was read: read it again
        return None

    def _objects(self, prefix: str = "") -> List[Any]:
        """The sealed objects of this store whose keys start with ``prefix``, as
        (key, ObjectInfo)."""
        root = f"{self._prefix}/{prefix}"
        if len(root.encode()) > _MAX_NAME_BYTES:
            return []  # longer than any name
        return [
            (info.name[len(self._prefix) + 1:], info)
            for info in self._client.list(root)
            if info.state == "sealed" and not info.delete_pending
        ]

    # Reading.

    def get_sync(
        self, key: str, *, prototype: Optional[BufferPrototype] = None,
        byte_range: Optional[ByteRequest] = None,
    ) -> Optional[Buffer]:
        """``get`` without the event loop (zarr.abc.store.SupportsGetSync)."""
        if prototype is None:
            prototype = default_buffer_prototype()
        if byte_range is not None and not isinstance(
            byte_range, (RangeByteRequest, OffsetByteRequest, SuffixByteRequest)
        ):
            raise TypeError(f"Unexpected byte_range, got {byte_range!r}")
        found = self._value(key)
        if found is None:
            return None
        value = memoryview(found)
        start, stop = _byte_range(len(value), byte_range)
        view = value[start:stop]
        if _is_document(key):
            return prototype.buffer.from_bytes(bytes(view))
        return prototype.buffer.from_array_like(np.frombuffer(view, dtype=np.uint8))

    async def get(
        self, key: str, prototype: BufferPrototype,
        byte_range: Optional[ByteRequest] = None,
    ) -> Optional[Buffer]:
        return self.get_sync(key, prototype=prototype, byte_range=byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype,
        key_ranges: Iterable[Tuple[str, Optional[ByteRequest]]],
    ) -> List[Optional[Buffer]]:
        return [self.get_sync(k, prototype=prototype, byte_range=r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        return self._client.contains(self._name(key))

    async def getsize(self, key: str) -> int:
        found = self._value(key)
        if found is None:
            raise FileNotFoundError(key)
        return int(found.size)

    async def getsize_prefix(self, prefix: str) -> int:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        sizes = (self._value(key) for key, _ in self._objects(prefix))
        return sum(int(found.size) for found in sizes if found is not None)

    async def list(self) -> AsyncIterator[str]:
        for key, _ in self._objects():
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key, _ in self._objects(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = prefix.rstrip("/")
        if prefix:
            prefix += "/"
        seen = set()
        for key, _ in self._objects(prefix):
            child = key[len(prefix):].split("/", 1)[0]
            if child not in seen:
                seen.add(child)
                yield child

    # Writing.

    def set_sync(self, key: str, value: Buffer) -> None:
        """``set`` without the event loop (zarr.abc.store.SupportsSetSync)."""
        self._check_writable()
        self._set(key, value, replace=True)

    async def set(self, key: str, value: Buffer) -> None:
        await self._set_off_loop(key, value, replace=True)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        await self._set_off_loop(key, value, replace=False)

    async def _set_off_loop(self, key: str, value: Buffer, replace: bool) -> None:
        """_set, on a worker thread for a value large enough that its copy would hold the
        event loop."""
        self._check_writable()
        if len(value) >= _OFF_LOOP_BYTES:
            await asyncio.to_thread(self._set, key, value, replace)
        else:
            self._set(key, value, replace)

    def _set(self, key: str, value: Buffer, replace: bool) -> None:
        if not isinstance(value, Buffer):
            raise TypeError(
                f"depot.zarr.Store.set: value must be a zarr Buffer, not {type(value).__name__}"
            )
        name = self._name(key)
        data = value.as_numpy_array().data.cast("B")
        if _is_document(key):
            self._put(key, name, lambda: self._client.put(data, name=name, pin=True), replace)
            return
        target = self._value_name(key)
        self._client.put(data, name=target, pin=True)
        try:
            stored = self._put(key, name, lambda: self._put_pointer(name, target), replace)
        except BaseException:
            self._client.delete(target)
            raise
        if not stored:  # set_if_not_exists of a key that exists
            self._client.delete(target)

    def _put_pointer(self, name: str, target: str) -> None:
        encoded = target.encode()
        ref = ObjectRef.from_name(name)
        native = self._client._native
        writable = native.create(ref.id, len(encoded), _POINTER, name, True)
        memoryview(writable)[:] = encoded
        native.seal(ref.id)  # before `writable` goes: collected unsealed, it is aborted

    def _put(self, key: str, name: str, put: Callable[[], Any], replace: bool) -> bool:
        """Puts the object ``name`` (``put``); if one exists, replaces it when ``replace``,
        then deletes the value an old pointer named. Whether it stored anything."""
        client = self._client
        try:
            put()
            return True
        except ObjectExists:
            if not replace:
                return False
        old = self._old_target(name, key)
        # Delete, then put anew under the name, which the daemon gives back once the old
        # object's last reader lets go of it (a pointer or document is read as a copy).
        deadline = time.monotonic() + self._replace_timeout
        pause = 0.0005
        while True:
            try:
                client.delete(name)
            except ObjectNotFound:
                pass
            try:
                put()
                break
            except ObjectExists as e:
                if time.monotonic() + pause > deadline:
                    raise ObjectExists(
                        f"depot.zarr.Store: key {key!r} ({name!r}) could not be replaced in "
                        f"{self._replace_timeout:g} s: a reader still holds its old value "
                        f"({e})"
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        if old is not None:
            delete_names(client, [old])  # readers viewing it keep it until they let go
        return True

    def _old_target(self, name: str, key: str) -> Optional[str]:
        """The value the object ``name`` points to, if it is a pointer."""
        try:
            found = self._client.get_buffer(name, timeout=0)
        except ObjectNotFound:
            return None
        try:
            return self._target(found, key)
        except ValueError:
            return None  # a damaged pointer: replaced all the same

    def delete_sync(self, key: str) -> None:
        """``delete`` without the event loop (zarr.abc.store.SupportsDeleteSync)."""
        self._check_writable()
        name = self._name(key)
        old = self._old_target(name, key)
        delete_names(self._client, [name] + ([old] if old is not None else []))

    async def delete(self, key: str) -> None:
        self.delete_sync(key)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        clear_prefix(self._client, self._prefix, prefix)

    async def clear(self) -> None:
        await self.delete_dir("")
