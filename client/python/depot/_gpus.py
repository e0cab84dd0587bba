"""GPU values handed between processes (depot.multiprocessing, depot.dask).

A process names a GPU by its ordinal, which depends on its CUDA_VISIBLE_DEVICES; two processes
agree only on the GPU's UUID. Senders put the UUID in what they send, receivers claim on
whichever ordinal has it here.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, List, Optional, Tuple

from ._errors import DepotError
from ._ref import ObjectRef

_CUDA_DLPACK_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def on_cuda(value: Any) -> bool:
    """Whether ``value`` is a DLPack producer on a CUDA GPU."""
    device_of = getattr(value, "__dlpack_device__", None)
    if device_of is None or not hasattr(value, "__dlpack__"):
        return False
    try:
        return int(device_of()[0]) in _CUDA_DLPACK_DEVICES
    except Exception:
        return False


def nbytes(value: Any) -> Optional[int]:
    """The bytes of an array or tensor, None if it does not say."""
    n = getattr(value, "nbytes", None)
    if n is None and hasattr(value, "element_size"):
        n = value.element_size() * value.numel()
    return None if n is None else int(n)


# The daemon's GPUs as this process sees them, (ordinal, uuid) each, per client: asked once
# (a status round trip), since a daemon's GPUs do not change.
_tables: "weakref.WeakKeyDictionary[Any, List[Tuple[int, bytes]]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def table(client: Any) -> List[Tuple[int, bytes]]:
    with _lock:
        known = _tables.get(client)
    if known is None:
        known = [(info.ordinal, bytes(info.uuid)) for info in client.gpus()]
        with _lock:
            _tables[client] = known
    return known


def uuid_of(client: Any, gpu: Optional[int]) -> Optional[bytes]:
    """The UUID of this process's GPU ``gpu`` (None: host memory, or a GPU not known)."""
    if gpu is None:
        return None
    for ordinal, uuid in table(client):
        if ordinal == gpu:
            return uuid
    return None


def ordinal_of(client: Any, uuid: bytes) -> Optional[int]:
    """This process's ordinal of the GPU ``uuid``, None if it cannot see it."""
    for ordinal, known in table(client):
        if known == uuid:
            return ordinal
    return None


def claim(
    client: Any, ref_id: bytes, uuid: Optional[bytes], who: str, writable: bool = False
) -> Any:
    """The value handed off as ``ref_id``: as Client.claim returns it from host memory
    (``uuid`` None; ``writable`` as there), or a DeviceArray on this process's ordinal of
    the GPU ``uuid``. ``who`` names the caller in the error for a GPU this process cannot
    see."""
    if uuid is None:
        return client.claim(ObjectRef(ref_id), writable=writable)
    ordinal = ordinal_of(client, uuid)
    if ordinal is None:
        raise DepotError(
            f"{who} received a GPU array on a GPU this process cannot see (uuid "
            f"{uuid.hex()}); make it visible (CUDA_VISIBLE_DEVICES) or send it from the host"
        )
    return client.claim(ObjectRef(ref_id), device=ordinal)


def library(value: Any) -> str:
    """The array library a GPU value belongs to ("cupy", "torch", "depot" for a DeviceArray;
    else "")."""
    module = type(value).__module__.split(".")[0]
    return module if module in ("cupy", "torch", "depot") else ""


def as_library(array: Any, module: str) -> Any:
    """A claimed DeviceArray as an array of ``module`` (library()'s answer), with no copy; the
    DeviceArray itself (DLPack and __cuda_array_interface__) for anything else."""
    if module == "cupy":
        import cupy

        return cupy.from_dlpack(array)
    if module == "torch":
        import torch

        return torch.from_dlpack(array)
    return array
