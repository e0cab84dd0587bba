"""depot: a per-host shared-memory object store, from Python.

    import depot, numpy as np

    with depot.start_daemon(memory="2GiB") as daemon, depot.Client(daemon.socket) as client:
        ref = client.put(np.arange(1_000_000))     # one copy, into shared memory
        array = client.get(ref)                    # read-only, no copy, in any process

GPU arrays (CuPy, PyTorch, any DLPack producer) are put the same way, onto their GPU;
``client.get(ref, device=0)`` returns a depot.DeviceArray for ``torch.from_dlpack`` or
``cupy.from_dlpack``. See docs/python.md for how values are stored and how long they live.
"""

from . import _depot
from ._client import Client, RefLike
from ._daemon import Daemon, find_depotd, start_daemon
from ._device import DeviceArray
from ._errors import (
    BY_CODE as _BY_CODE,
    ConnectionError,
    DepotError,
    Disconnected,
    GpuNotSupported,
    InternalError,
    InvalidArgument,
    IoError,
    LimitExceeded,
    NotHeld,
    ObjectAlreadySealed,
    ObjectExists,
    ObjectNotFound,
    ObjectNotSealed,
    PermissionDenied,
    ProtocolMismatch,
    StoreFull,
    TaskFailed,
    Timeout,
)
from ._ref import ObjectRef
from ._worker import Worker, get_client, output_array, task, task_device

_depot._register_errors(_BY_CODE)

ClientInfo = _depot.ClientInfo
GpuInfo = _depot.GpuInfo
ObjectInfo = _depot.ObjectInfo
ObjectPlacement = _depot.ObjectPlacement
SchedulerStatus = _depot.SchedulerStatus
Setting = _depot.Setting
DiskStatus = _depot.DiskStatus
StoreBuffer = _depot.StoreBuffer
StoreStatus = _depot.StoreStatus
TaskContext = _depot.TaskContext
TaskInfo = _depot.TaskInfo
WorkerInfo = _depot.WorkerInfo

__version__ = "0.1.0"

__all__ = [
    "Client",
    "ClientInfo",
    "ConnectionError",
    "Daemon",
    "DeviceArray",
    "DepotError",
    "Disconnected",
    "GpuInfo",
    "GpuNotSupported",
    "InternalError",
    "InvalidArgument",
    "IoError",
    "LimitExceeded",
    "NotHeld",
    "ObjectAlreadySealed",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectNotSealed",
    "ObjectPlacement",
    "ObjectRef",
    "PermissionDenied",
    "ProtocolMismatch",
    "RefLike",
    "SchedulerStatus",
    "Setting",
    "DiskStatus",
    "StoreBuffer",
    "StoreFull",
    "StoreStatus",
    "TaskContext",
    "TaskFailed",
    "TaskInfo",
    "Timeout",
    "Worker",
    "WorkerInfo",
    "find_depotd",
    "get_client",
    "output_array",
    "start_daemon",
    "task",
    "task_device",
]
