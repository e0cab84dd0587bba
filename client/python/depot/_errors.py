"""depot's exceptions: one class per kind of failure, all under :class:`DepotError`.

Each carries the message the daemon (or the client library) gave, unchanged, and the name
of the underlying ``depot::StatusCode`` as :attr:`DepotError.code`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class DepotError(Exception):
    """Base class of every error depot raises."""

    code: Optional[str]
    # Set on the error Client.put_many raises: every value's ref, and the exception of each
    # value not stored, by index.
    refs: List[Any]
    failed: Dict[int, "DepotError"]

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __reduce__(self):  # keeps code across pickling (multiprocessing)
        return (type(self), (self.message, self.code))


class InvalidArgument(DepotError, ValueError):
    """The request itself is wrong: bad size, id, name or option."""


class ObjectNotFound(DepotError, KeyError):
    """No such object (``get`` with ``timeout=0``, ``delete``, ``seal`` of an unknown id)."""

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return self.message


class ObjectExists(DepotError):
    """An object with this id (or name) exists already; objects are immutable."""


class ObjectNotSealed(DepotError):
    """The object is still being created."""


class ObjectAlreadySealed(DepotError):
    """The object was sealed already."""


class NotHeld(DepotError):
    """This client does not own the object (it is another client's object being created)."""


class StoreFull(DepotError, MemoryError):
    """The store cannot fit the object, even after evicting unreferenced objects."""


class Timeout(DepotError, TimeoutError):
    """The object was not sealed within the timeout."""


class LimitExceeded(DepotError):
    """A per-client limit of the daemon, or a message size bound, was hit."""


class ConnectionError(DepotError):  # noqa: A001 - depot.ConnectionError, by design
    """The daemon could not be reached, or the connection to it broke."""


class Disconnected(ConnectionError):
    """The connection broke while a request was in flight."""


class ProtocolMismatch(ConnectionError):
    """The client and the daemon speak different protocol versions."""


class IoError(DepotError, OSError):
    """A system call failed; the message names it and the error."""


class InternalError(DepotError):
    """A bug in depot; the message says where."""


class PermissionDenied(DepotError, PermissionError):
    """The caller's uid may not do this: another uid's object, or a daemon that does not
    share with it."""


class TaskFailed(DepotError):
    """The object is an output of a task that failed: the daemon's scheduler sealed it as
    failed, and :attr:`message` is the task's message (at most 4096 bytes)."""


class GpuNotSupported(DepotError):
    """An array on a device depot does not store (DLPack device types other than host memory
    and CUDA GPUs, e.g. ROCm)."""


# depot::StatusCode names (StatusCodeName) -> class; the C++ layer raises through this table.
BY_CODE = {
    "InvalidArgument": InvalidArgument,
    "NotFound": ObjectNotFound,
    "AlreadyExists": ObjectExists,
    "NotSealed": ObjectNotSealed,
    "AlreadySealed": ObjectAlreadySealed,
    "NotHeld": NotHeld,
    "OutOfMemory": StoreFull,
    "Timeout": Timeout,
    "LimitExceeded": LimitExceeded,
    "ProtocolMismatch": ProtocolMismatch,
    "ConnectionFailed": ConnectionError,
    "Disconnected": Disconnected,
    "IoError": IoError,
    "Internal": InternalError,
    "PermissionDenied": PermissionDenied,
    "TaskFailed": TaskFailed,
}
