"""depot.zarr: a Zarr store (Zarr 3's ``zarr.abc.store.Store``) whose keys are objects in a
running depotd, so that the processes of a host share arrays with no copy and no disk.

    import zarr, depot.zarr
    store = depot.zarr.Store("experiments/run-7")          # objects named run-7/<key>
    z = zarr.create_array(store, shape=(10000, 10000), chunks=(1000, 1000), dtype="f8")
    z[:] = 1.0                         # each chunk is one object in the store
    zarr.open_array(depot.zarr.Store("experiments/run-7"), mode="r")[:10]  # any process

Each key is one object named ``<prefix>/<key>`` (``depotctl ls`` shows them), pinned so that
the store never evicts it: an object leaves only when it is deleted (``Store.delete``,
``delete_dir``, ``clear``, ``depotctl rm``), or the daemon stops. A store that cannot fit a
value raises ``depot.StoreFull``; nothing is dropped to make room.

Reads view the store's memory: ``get`` of a chunk returns a Buffer over the object's pages
in this process (a read-only mapping), and a byte range is a slice of it, with no copy.
Metadata documents (``zarr.json``, and Zarr 2's ``.zarray``, ``.zgroup``, ``.zattrs``,
``.zmetadata``) are read as copies instead, because Zarr rewrites them in place and a
document being read must not hold up its next version (below).

Objects are immutable, so ``set`` of a key that exists deletes the old object and stores a
new one under the same name. A reader that still holds a view of the old value keeps it
intact (the old object goes when its last view does); until then its name cannot be given
to the new value, and ``set`` waits for that (up to ``replace_timeout`` seconds, then raises
``depot.ObjectExists`` saying why). Zarr writes each chunk of a computation once, and reads
documents as copies, so this wait arises only when a program rewrites a chunk that it, or
another process, is still viewing. Between the delete and the new object's seal a reader
finds no value for the key (Zarr reads a missing chunk as the fill value): a key written
while others read it is not replaced atomically. ``set_if_not_exists`` is atomic (the
daemon refuses a second object of the same name).

The store is picklable (its socket, prefix and mode travel; each process connects its own
client, shared by all stores of the process on that socket), and two stores on the same
socket and prefix are equal. Calls are answered by the daemon at once: none waits for
another process. Puts of 1 MiB or more copy on a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Tuple, Union

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

__all__ = ["Store"]

# A prefix: segments of letters, digits, '.', '_' and '-', joined by single slashes.
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_MAX_NAME_BYTES = 4096  # the daemon's limit on an object's name
# Keys Zarr keeps documents under (read as copies: see the module's docstring).
_DOCUMENTS = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
# Values this large are put from a worker thread, so that the copy does not hold the loop.
_OFF_LOOP_BYTES = 1 << 20
_DELETE_BATCH = 10_000  # names a delete request carries


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
    """A Zarr store keeping each key as an object ``<prefix>/<key>`` of the depotd at
    ``socket`` (default: ``$DEPOT_SOCKET``, else the default socket), pinned until deleted.

    ``replace_timeout``: how long ``set`` of an existing key waits for readers to let go
    of its old value before raising ``depot.ObjectExists`` (module docstring)."""

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
        if len(name.encode()) > _MAX_NAME_BYTES:
            raise ValueError(
                f"depot.zarr.Store: key {key[:64]!r}... makes an object name of "
                f"{len(name.encode())} bytes, longer than depot's limit of {_MAX_NAME_BYTES}"
            )
        return name

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
        name = self._name(key)
        if byte_range is not None and not isinstance(
            byte_range, (RangeByteRequest, OffsetByteRequest, SuffixByteRequest)
        ):
            raise TypeError(f"Unexpected byte_range, got {byte_range!r}")
        try:
            value = memoryview(self._client.get_buffer(name, timeout=0))
        except ObjectNotFound:
            return None
        start, stop = _byte_range(len(value), byte_range)
        view = value[start:stop]
        if key.rsplit("/", 1)[-1] in _DOCUMENTS:
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
        placement = self._client.locate([self._name(key)])[0]
        if not placement.found:
            raise FileNotFoundError(key)
        return placement.data_size

    async def getsize_prefix(self, prefix: str) -> int:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return sum(info.data_size for _, info in self._objects(prefix))

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
        self._check_writable()
        if len(value) >= _OFF_LOOP_BYTES:
            await asyncio.to_thread(self._set, key, value, True)
        else:
            self._set(key, value, replace=True)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        self._check_writable()
        if len(value) >= _OFF_LOOP_BYTES:
            await asyncio.to_thread(self._set, key, value, False)
        else:
            self._set(key, value, replace=False)

    def _set(self, key: str, value: Buffer, replace: bool) -> None:
        if not isinstance(value, Buffer):
            raise TypeError(
                f"depot.zarr.Store.set: value must be a zarr Buffer, not {type(value).__name__}"
            )
        name = self._name(key)
        data = value.as_numpy_array().data.cast("B")
        client = self._client
        try:
            client.put(data, name=name, pin=True)
            return
        except ObjectExists:
            if not replace:
                return
        # Replace: delete the old object, then store the new one under its name, which the
        # daemon gives back once the old object's last reader lets go of it.
        deadline = time.monotonic() + self._replace_timeout
        pause = 0.0005
        while True:
            try:
                client.delete(name)
            except ObjectNotFound:
                pass
            try:
                client.put(data, name=name, pin=True)
                return
            except ObjectExists as e:
                if time.monotonic() + pause > deadline:
                    raise ObjectExists(
                        f"depot.zarr.Store: key {key!r} ({name!r}) could not be replaced in "
                        f"{self._replace_timeout:g} s: a reader still holds its old value "
                        f"({e})"
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def delete_sync(self, key: str) -> None:
        """``delete`` without the event loop (zarr.abc.store.SupportsDeleteSync)."""
        self._check_writable()
        try:
            self._client.delete(self._name(key))
        except ObjectNotFound:
            pass

    async def delete(self, key: str) -> None:
        self.delete_sync(key)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        delete_names(self._client, [info.name for _, info in self._objects(prefix)])

    async def clear(self) -> None:
        await self.delete_dir("")
