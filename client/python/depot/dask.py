"""depot.dask: Dask graphs run by depot's own scheduler on one host, and Dask distributed
workers that keep large results in the host's depotd.

    import depot.dask
    with depot.dask.Scheduler(workers=8):                 # or attach to a running depotd
        dask.compute(x, scheduler=depot.dask.get)

``get`` runs a graph's tasks on depotd's worker processes, which read each other's results
from the store with no copy (depot._dask_graphs says how). Across hosts, Dask distributed
with the plugin below:

    import depot.dask
    client.register_plugin(depot.dask.DepotPlugin())   # or: dask worker --preload depot.dask

A task result that is a numpy array of at least ``threshold`` bytes (1 MiB by default) is
copied once into the store, and its worker then keeps a read-only view of the store's copy
instead. When a worker on the same host, attached to the same daemon, needs such a result,
only its handle crosses Dask's comm, and the receiver maps the same memory: nothing is
pickled or copied again, and the host holds the result once however many workers read it.
Between hosts, and to anything without the plugin (the scheduler, the Dask client), Dask's
comms carry the bytes as before.

A pandas DataFrame, Series or Index is stored the same way, as a pickle whose arrays the
reader maps, if its columns and index hold numbers, booleans, datetimes, timedeltas or
periods (in numpy arrays, or masked as pandas' nullable types), Arrow arrays (pandas'
pyarrow-backed strings, its default with pyarrow installed, and ``ArrowDtype``), or
categories of those: it comes back with read-only columns viewing the store. Python objects
and strings, other values, and containers of arrays (a tuple a task returns) stay with Dask.

A CuPy array, PyTorch CUDA tensor or depot.DeviceArray goes to the store's pool on its GPU,
and comes back as the same library's array, viewing the pool; it is sent as a handle to a
peer that sees that GPU (by UUID: CUDA_VISIBLE_DEVICES may differ between workers). Other
CUDA arrays stay with Dask, which would otherwise get a DeviceArray back.

When a result is stored is the ``keep`` policy:

- ``"on-send"`` (the default): when it is first sent to a worker that shares the store. A
  result that never leaves its worker costs nothing more than with plain Dask, and one that
  does is copied once (where plain Dask copies it through a socket into the receiver's own
  memory).
- ``"always"``: as soon as the task returns it, so that every large array is in the store
  (shared, visible to ``depotctl``, not counted as the worker's memory), for one copy each.
  pandas values are stored when first sent, as with "on-send".

A slice of a stored result that a task returns (a view of its input: a rechunk's pieces) is
kept as it is, and sent as a handle to the stored object with the slice's place in it: it is
never copied.

How values are kept alive: every worker of a cluster on a host joins one group of the daemon
(depot.Client's ``group``). A worker stores a result by handing it off to the group and
claiming it back at once, so the daemon's object is deleted from the start and lives exactly
as long as some worker holds a view of it: a worker that exits, even killed, gives its views
back with its connection. To send a result, the sender hands the object off once more (no
copy) and the receiver claims it while unpickling the message. A handoff that nobody claims
(the receiver died in between) stays with the group until the last worker of the host leaves.

Dask's memory monitor measures each worker's private memory (resident set less its shared
memory mappings), so results in the store do not make workers spill, pause, or get
restarted by their nanny (``DepotNannyPlugin``, or ``dask worker --preload-nanny
depot.dask``). When the store is full, results stay in the worker and Dask spills them to
disk as usual.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import logging
import os
import sys
import threading
import warnings
import weakref
from collections.abc import MutableMapping
from typing import Any, Dict, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import dask
from dask.sizeof import sizeof
from distributed.comm.core import Comm
from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

from . import _codec, _depot, _gpus
from ._client import Client
from ._daemon import Daemon, _accepts, start_daemon
from ._dask_graphs import Scheduler, get, plan
from ._dask_gpu import offload, register_gpu, unregister_gpu
from ._dask_plan import Fused, GraphPlan, Stage
from ._errors import ConnectionError, DepotError, InvalidArgument, ProtocolMismatch, StoreFull
from ._identity import ByIdentity
from ._ref import ObjectRef

__all__ = [
    "DEFAULT_THRESHOLD",
    "Scheduler",
    "get",
    "plan",
    "GraphPlan",
    "Stage",
    "Fused",
    "offload",
    "register_gpu",
    "unregister_gpu",
    "DepotNannyPlugin",
    "DepotPlugin",
    "DepotUnavailableWarning",
    "attach",
    "dask_setup",
    "detach",
    "ensure_daemon",
    "private_memory",
]

logger = logging.getLogger("depot.dask")

DEFAULT_THRESHOLD = 1 << 20
"""Results of this many bytes or more go to the store (``DEPOT_DASK_THRESHOLD``)."""

THRESHOLD_ENV = "DEPOT_DASK_THRESHOLD"
KEEP_ENV = "DEPOT_DASK_KEEP"
START_ENV = "DEPOT_DASK_START_DAEMON"  # with --preload-nanny: its memory, e.g. "50%"
EVENT_TOPIC = "depot"
# How long the cluster's group keeps a sent handle that no receiver has claimed: a message
# whose receiver never deserializes it (a comm that broke mid-send, a worker gone) leaks
# nothing for longer than this, though the cluster lives on.
SEND_TTL = 600.0
# A pandas value is stored only if its pickle stream, read back as copies, is at most this
# many bytes or a sixteenth of the value (its columns are out of band, viewed as they are).
_MAX_PICKLE_STREAM = 64 * 1024


class DepotUnavailableWarning(RuntimeWarning):
    """A worker could not use depotd: it keeps its data as plain Dask does."""


def private_memory(pid: Union[int, str] = "self") -> int:
    """The bytes of a process's resident memory that are its own: its resident set less the
    shared memory it maps (``VmRSS - RssShmem`` in /proc/PID/status). What Dask's memory
    monitors measure on a worker with the plugin, so that views of the store, which every
    worker holding them maps, are not counted as each one's memory."""
    rss = shmem = 0
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"RssShmem:"):
                shmem = int(line.split()[1]) * 1024
    return max(0, rss - shmem)


def _parse_threshold(threshold: Union[int, str, None]) -> int:
    if threshold is None:
        threshold = os.environ.get(THRESHOLD_ENV) or DEFAULT_THRESHOLD
    try:
        value = dask.utils.parse_bytes(threshold) if isinstance(threshold, str) else int(threshold)
    except (ValueError, TypeError):
        value = -1
    if isinstance(threshold, bool) or value < 0:
        raise ValueError(
            f"depot.dask threshold must be a size in bytes (an int >= 0 or a string such as "
            f"'1MiB'), not {threshold!r}"
        )
    return value


KEEP_POLICIES = ("on-send", "always")


def _parse_keep(keep: Optional[str]) -> str:
    if keep is None:
        keep = os.environ.get(KEEP_ENV) or "on-send"
    if keep not in KEEP_POLICIES:
        raise ValueError(
            f"depot.dask keep must be one of {', '.join(map(repr, KEEP_POLICIES))}, not {keep!r}"
        )
    return keep


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# The process's store: one per worker process, whatever number of workers it runs.


class _Store:
    """This process's client of depotd, what it advertises to peers, and the values it holds
    that view the store (by identity), with the ref each was claimed under."""

    def __init__(self, client: Client, group: bytes, threshold: int, keep: str) -> None:
        self.client = client
        self.threshold = threshold
        self.eager = keep == "always"
        st = os.stat(client.socket)
        # Two processes reach the same daemon, in the same group, when these match.
        self.identity = {
            "daemon": f"{_boot_id()}:{st.st_dev}:{st.st_ino}",
            "uid": os.getuid(),
            "group": group.hex(),
        }
        # The GPUs of the daemon this process sees, for peers to know which GPU values
        # they can send it as handles.
        self.gpus = [uuid.hex() for _, uuid in _gpus.table(client)]
        # Values that view the store, and what each is.
        self._stored = ByIdentity()
        # The arrays of stored pandas values (not objects of their own: an array taken from
        # one is no view_of anything), for shares() to know what pandas makes of them.
        self._backing = ByIdentity()
        # One send stores a value at a time: two messages carrying it store it once.
        self._send_lock = threading.Lock()
        # Large results a worker keeps in its own memory (keep="on-send"): [the worker's
        # data, key, the store's copy once sent].
        self._private = ByIdentity()
        # Results the store did not take as their task returned them (keep="always").
        self.declined = ByIdentity()
        self._warned_full = False

    def stored_of(self, value: Any) -> Optional["_Stored"]:
        return self._stored.get(value)

    def remember(self, value: Any, stored: "_Stored") -> None:
        self._stored.put(value, stored)
        root = _root_array(value)
        if root is not value:  # what slices of it name as their base
            self._stored.put(root, stored)
        # What pandas values made of it hold.
        for array in _pandas_arrays(value, whole=False) or ():
            self._backing.put(_root_array(array), stored)

    def kind_of(self, value: Any) -> Optional[str]:
        """What of ``value`` the store could keep (_storable at this store's threshold): the
        methods below take it, so that a result is classified once."""
        return _storable(value, self.threshold)

    def stores_on_return(self, kind: Optional[str]) -> bool:
        """Whether a value of ``kind`` is stored as its task returns it: a large array with
        keep="always". A pandas value waits for its first send whatever the policy: a
        pipeline of frames makes several per partition that are never sent, and storing
        each as it is made raised the peak memory of a set_index by 40% (bench/README.md)."""
        return self.eager and kind in ("host", "gpu")

    def kept_as_is(self, value: Any, kind: Optional[str]) -> Optional[str]:
        """How ``value`` costs the worker nothing, if it does: "views" the store (stored_of,
        view_of), or "shares" it (shares(): stored if sent); else None."""
        if self.stored_of(value) is not None or self.view_of(value, kind) is not None:
            return "views"
        return "shares" if self.shares(value, kind) else None

    def shares(self, value: Any, kind: Optional[str]) -> bool:
        """Whether ``value`` is a pandas value of at least ``threshold`` bytes kept in numpy
        arrays (_pandas_arrays) that all view stored ones: what pandas makes of a stored
        value without a copy (a selection of columns, a rename, a slice of rows). It is kept
        as it is; sent to a peer, it is stored then, and the worker keeps the store's copy
        instead. (One with Arrow columns or a MultiIndex is the worker's own until it is
        sent.)"""
        if kind != "pandas":
            return False
        arrays = _pandas_arrays(value)
        if not arrays:
            return False
        return all(self._backing.get(_root_array(array)) is not None for array in arrays)

    def view_of(self, value: Any, kind: Optional[str]) -> Optional[Tuple["_Stored", list]]:
        """For a numpy array of at least ``threshold`` bytes that views part of a stored one
        (a slice a task returned): that object, and where in it the array lies, as
        [byte offset from the start of its memory, shape, strides, dtype]."""
        if kind != "host":
            return None
        root = _root_array(value)
        stored = None if root is value else self._stored.get(root)
        if stored is None or stored.gpu is not None:
            return None
        offset = value.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return stored, [offset, list(value.shape), list(value.strides), value.dtype.str]

    def track(self, value: Any, kind: Optional[str], data: "StoreBackedData", key: Any) -> None:
        """Notes a large result a worker keeps in its own memory, so that its first send to
        a peer of the store stores it (and the worker then keeps the store's copy)."""
        if kind is not None:
            self._private.put(value, [data, key, None])

    def copy(self, value: Any, kind: Optional[str]) -> Optional[Any]:
        """Stores a large result: a plain numpy array or pandas value in host memory, a GPU
        array in the pool of its GPU. Returns the store's read-only view of it (a GPU array
        as the same library's, a pandas value as one whose arrays view the store), or None
        (not storable, or the store refused it: Dask keeps the value)."""
        if kind is None:
            return None
        try:
            encoded = None
            if kind == "pandas":
                encoded = _codec.encode(value)
                stream = len(encoded.parts[0])
                if stream > max(_MAX_PICKLE_STREAM, encoded.size // 16):
                    # Arrays pickled in the stream (_plain_pandas lets none through that
                    # numpy 2, pandas 2-3 and pyarrow pickle so): a reader would unpickle
                    # copies.
                    logger.debug(
                        "depot.dask: keeping a %s in the worker: %d of its %d bytes would be "
                        "unpickled as copies", type(value).__name__, stream, encoded.size,
                    )
                    return None
            ref, gpu, _ = self.client._handoff(value, None, encoded)
            raw = self.client.claim(ref, device=gpu)
        except StoreFull as e:
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "depot.dask: the store is full (%s); results that do not fit stay in the "
                    "worker, which spills them to disk as plain Dask does", e,
                )
            return None
        except InvalidArgument as e:  # e.g. a GPU array that is not C-contiguous
            logger.debug("depot.dask: keeping a %s in the worker: %s", type(value).__name__, e)
            return None
        except DepotError as e:
            logger.warning("depot.dask: could not store a %s: %s", type(value).__name__, e)
            return None
        if gpu is None:
            view, stored = raw, _Stored(ref, None, "")
        else:
            module = _gpus.library(value)
            view = _gpus.as_library(raw, module)
            stored = _Stored(ref, _gpus.uuid_of(self.client, gpu), module)
        self.remember(view, stored)
        return view

    def handle(self, value: Any, context: Optional[dict]) -> Optional[dict]:
        """What to send instead of ``value``'s bytes to the comm's recipient: a handle if it
        reaches this daemon in this group (and sees the GPU a GPU value is on), and
        ``value`` views the store or is a large result the worker keeps that can be stored
        now; else None."""
        if not context:
            return None
        recipient = context.get("recipient")
        if not isinstance(recipient, dict) or recipient.get("depot") != self.identity:
            return None
        sees = recipient.get("depot-gpus") or ()
        stored, layout = self.stored_of(value), None
        if stored is None:
            kind = self.kind_of(value)
            stored, layout = self.view_of(value, kind) or (None, None)
            if stored is None:
                stored = self._store_on_send(value, kind, sees)
        if stored is None or (stored.gpu is not None and stored.gpu.hex() not in sees):
            return None
        try:
            device = None if stored.gpu is None else _gpus.ordinal_of(self.client, stored.gpu)
            self.client.handoff_again(stored.ref, device=device, ttl=SEND_TTL)
        except DepotError as e:  # e.g. the daemon is gone: send the bytes
            logger.warning("depot.dask: sending a result's bytes, not its handle: %s", e)
            return None
        handle: Dict[str, Any] = {"ref": stored.ref.id, "gpu": stored.gpu, "module": stored.module}
        if layout is not None:
            handle["view"] = layout
        return handle

    def _store_on_send(self, value: Any, kind: Optional[str], sees: Any) -> Optional["_Stored"]:
        entry = self._private.get(value)
        if entry is None:
            return None
        with self._send_lock:
            view = entry[2]  # sent before, and the worker has not swapped it in yet
            if view is None:
                if _gpus.on_cuda(value):  # stored only for a peer that sees its GPU
                    uuid = _gpus.uuid_of(self.client, int(value.__dlpack_device__()[1]))
                    if uuid is None or uuid.hex() not in sees:
                        return None
                view = entry[2] = self.copy(value, kind)
                if view is None:
                    return None
                entry[0].adopt_soon(entry[1], value, view)
        return self.stored_of(view)

    def claim(self, handle: Any) -> Any:
        """The value a peer sent as ``handle`` (what handle() made). Raises OSError for a
        handle that is not one or cannot be taken: to Dask, a failed transfer, fetched
        again (from this peer or another), not a failed task."""
        try:
            ref_id, gpu, module = handle["ref"], handle["gpu"], handle["module"]
            layout = handle.get("view")
            if (
                not isinstance(ref_id, bytes) or len(ref_id) != 16
                or not (gpu is None or (isinstance(gpu, bytes) and len(gpu) == 16))
                or not isinstance(module, str)
                or not (layout is None or _is_layout(layout))
            ):
                raise ValueError("fields of the wrong type or size")
        except Exception as e:
            raise OSError(f"depot.dask: a peer sent a malformed handle ({e!r})") from e
        ref = ObjectRef(ref_id)
        try:
            raw = _gpus.claim(self.client, ref.id, gpu, "depot.dask")
        except DepotError as e:
            raise OSError(f"depot.dask: could not claim {ref} from the store: {e}") from e
        try:
            value = raw if gpu is None else _gpus.as_library(raw, module)
        except Exception as e:  # e.g. a torch tensor sent to a worker without torch
            raise OSError(f"depot.dask: could not take {ref} as a {module} array: {e!r}") from e
        self.remember(value, _Stored(ref, gpu, module))
        if layout is None:
            return value
        if gpu is not None:
            raise OSError("depot.dask: a peer sent a view of a GPU array, which it never sends")
        return _view(value, *layout)

def _root_array(value: Any) -> Any:
    """The last numpy array in a chain of bases: the one whose memory every slice of the
    value views, or the value itself."""
    np = sys.modules.get("numpy")
    root = value
    while np is not None and isinstance(getattr(root, "base", None), np.ndarray):
        root = root.base
    return root


def _is_layout(layout: Any) -> bool:
    """Whether a handle's view is [offset, shape, strides, dtype] of sane types and sizes."""
    if not isinstance(layout, (list, tuple)) or len(layout) != 4:
        return False
    offset, shape, strides, dtype = layout

    def ints(xs: Any) -> bool:
        return isinstance(xs, (list, tuple)) and len(xs) <= 64 and all(
            type(x) is int and abs(x) < 1 << 62 for x in xs
        )

    return (
        type(offset) is int and 0 <= offset < 1 << 62 and ints(shape) and ints(strides)
        and len(shape) == len(strides) and isinstance(dtype, str) and len(dtype) <= 32
    )


def _view(value: Any, offset: int, shape: list, strides: list, dtype: str) -> Any:
    """The part of a claimed array a peer's view names (read-only, as the array)."""
    import numpy as np

    try:
        element = np.dtype(dtype)
        if not _codec._plain_dtype(element):
            raise ValueError(f"dtype {element} is not a plain one")
        # numpy checks that the view lies inside the buffer.
        return np.ndarray(
            tuple(shape), element, buffer=_root_array(value), offset=offset, strides=tuple(strides)
        )
    except Exception as e:
        raise OSError(f"depot.dask: a peer sent a view that is not in its object ({e})") from e


class _Stored(NamedTuple):
    """A value that views the store: its object, and for a GPU value the GPU's UUID and the
    library its array belongs to (_gpus.library)."""

    ref: ObjectRef
    gpu: Optional[bytes]
    module: str


def _storable(value: Any, threshold: int) -> Optional[str]:
    """"host" for a plain numpy array of at least ``threshold`` bytes, "pandas" for a pandas
    DataFrame, Series or Index of as many whose data all pickle out of band (_plain_pandas),
    "gpu" for a CuPy array, PyTorch tensor or depot.DeviceArray on a CUDA GPU of as many (or
    of a size it does not say), else None."""
    least = max(threshold, 1)
    np = sys.modules.get("numpy")
    if np is not None and type(value) is np.ndarray:
        if value.nbytes >= least and _codec._plain_dtype(value.dtype):
            return "host"
        return None
    pd = sys.modules.get("pandas")
    if pd is not None and type(value) in (pd.DataFrame, pd.Series, pd.Index):
        if _plain_pandas(value, pd) and sizeof(value) >= least:
            return "pandas"
        return None
    if type(value).__module__.split(".")[0] in ("builtins", "numpy", "pandas"):
        return None
    # GPU arrays of the libraries a claimed DeviceArray converts back to, so that the
    # worker's value keeps its type (what other producers hold stays with Dask).
    if _gpus.library(value) and _gpus.on_cuda(value):
        size = _gpus.nbytes(value)
        return "gpu" if size is None or size >= least else None
    return None


def _plain_pandas(value: Any, pd: Any) -> bool:
    """Whether a pandas DataFrame, Series or Index keeps its rows only in arrays that pickle
    out of band and unpickle as views of those buffers: its columns' and index's dtypes are
    all _flat_dtype, and its index is a RangeIndex, an Index of such a dtype (datetimes,
    periods and categories included) or a MultiIndex of such levels. Pickled with the
    client's codec (protocol 5, datetimes as int64 views), such a value is a few hundred
    bytes of stream and its arrays' buffers, out of band (the codec makes a contiguous copy
    of an array that is not), which the store keeps as they are and a reader views without a
    copy. Anything else (objects, Python strings, intervals, sparse arrays) would be copied
    out of the store by unpickling it, and is left to Dask. (_Store.copy checks the stream's
    size all the same.)"""
    if isinstance(value, pd.Index):
        return _flat_index(value, pd)
    if not _flat_index(value.index, pd):
        return False
    if isinstance(value, pd.Series):
        return _flat_dtype(value.dtype, pd)
    return all(_flat_dtype(dtype, pd) for dtype in value.dtypes)


def _flat_index(index: Any, pd: Any) -> bool:
    if type(index) is pd.RangeIndex:
        return True
    if type(index) is pd.MultiIndex:
        return all(_flat_index(level, pd) for level in index.levels)
    return type(index) in _index_types(pd) and _flat_dtype(index.dtype, pd)


@functools.lru_cache(maxsize=1)
def _index_types(pd: Any) -> tuple:
    return (pd.Index, pd.DatetimeIndex, pd.TimedeltaIndex, pd.PeriodIndex, pd.CategoricalIndex)


def _flat_dtype(dtype: Any, pd: Any) -> bool:
    """Whether a pandas column of ``dtype`` keeps its data in numpy arrays of numbers,
    booleans, datetimes or timedeltas (with a time zone or as periods too; or with a mask, as
    pandas' nullable Int64, Float64 and boolean), in Arrow arrays (pandas' "str" with
    pyarrow storage, its default when pyarrow is installed, and ``ArrowDtype``), or in codes
    into categories of those."""
    import numpy as np  # loaded already, with pandas

    if isinstance(dtype, np.dtype):
        return dtype.kind in "biufcmM"
    if isinstance(dtype, pd.CategoricalDtype):
        categories = dtype.categories
        return categories is not None and not isinstance(
            categories.dtype, pd.CategoricalDtype
        ) and _flat_index(categories, pd)
    if isinstance(dtype, pd.StringDtype):
        return dtype.storage == "pyarrow"
    return isinstance(dtype, _flat_extension_dtypes(pd))


@functools.lru_cache(maxsize=1)
def _flat_extension_dtypes(pd: Any) -> tuple:
    names = (
        "DatetimeTZDtype", "PeriodDtype", "ArrowDtype", "BooleanDtype", "Float32Dtype",
        "Float64Dtype", "Int8Dtype", "Int16Dtype", "Int32Dtype", "Int64Dtype", "UInt8Dtype",
        "UInt16Dtype", "UInt32Dtype", "UInt64Dtype",
    )
    return tuple(getattr(pd, name) for name in names if hasattr(pd, name))


def _pandas_arrays(value: Any, whole: bool = True) -> Optional[list]:
    """The numpy arrays a pandas value keeps its rows in: its columns' blocks and its rows'
    index (none for a RangeIndex), the values and masks of nullable columns, datetime-likes'
    int64 arrays, categories' codes and categories. If ``whole``, None unless it keeps them
    in nothing else (no Arrow columns or categories, no MultiIndex); else those it has.
    None too if pandas does not say (its block manager, ``_mgr``, is not part of its
    public interface)."""
    pd = sys.modules.get("pandas")
    if pd is None or type(value) not in (pd.DataFrame, pd.Series, pd.Index):
        return None
    if isinstance(value, pd.Index):
        return _index_arrays(value, pd)
    arrays = _index_arrays(value.index, pd)
    if arrays is None:
        if whole:
            return None
        arrays = []
    blocks = getattr(getattr(value, "_mgr", None), "arrays", None)
    if not isinstance(blocks, list):
        return None
    for block in blocks:
        backing = _numpy_backing(block, pd)
        if backing is None and whole:
            return None
        arrays += backing or []
    return arrays


def _index_arrays(index: Any, pd: Any) -> Optional[list]:
    if type(index) is pd.RangeIndex:
        return []
    if type(index) not in _index_types(pd):  # a MultiIndex
        return None
    return _numpy_backing(index.array, pd)


def _numpy_backing(array: Any, pd: Any) -> Optional[list]:
    """The numpy arrays a column's or an index's array is made of, or None if not only numpy
    arrays (Arrow ones)."""
    import numpy as np  # loaded already, with pandas

    if type(array) is np.ndarray:
        return [array]
    if isinstance(array, pd.Categorical):
        categories = _index_arrays(array.categories, pd)
        return None if categories is None else [array.codes] + categories
    if isinstance(array, (pd.arrays.IntegerArray, pd.arrays.FloatingArray, pd.arrays.BooleanArray)):
        return [array._data, array._mask]
    if isinstance(array, (
        pd.arrays.NumpyExtensionArray, pd.arrays.DatetimeArray, pd.arrays.TimedeltaArray,
        pd.arrays.PeriodArray,
    )):
        backing = getattr(array, "_ndarray", None)
        return [backing] if type(backing) is np.ndarray else None
    return None


_lock = threading.RLock()
_store: Optional[_Store] = None
_attached: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the workers whose data is wrapped
_installed = False
_warned: set = set()


def _current() -> Optional[_Store]:
    return _store


# What a worker keeps.


class StoreBackedData(MutableMapping):
    """A worker's data: results that view the store, and Dask's own mapping (a SpillBuffer,
    or a dict without a memory limit) for everything else. The memory manager spills from
    the latter only (``fast`` and ``evict`` are its)."""

    def __init__(self, inner: MutableMapping, store: _Store, loop: Any) -> None:
        self.inner = inner
        self.stored: Dict[Any, Any] = {}
        self.detached = False
        self._store = store
        self._loop = loop

    def __setitem__(self, key: Any, value: Any) -> None:
        store = self._store
        kind = store.kind_of(value)
        how = store.kept_as_is(value, kind)
        kept = value if how else None
        now = kept is None and store.stores_on_return(kind)
        if now and store.declined.get(value) is None:
            kept = store.copy(value, kind)
        if kept is None:
            self.stored.pop(key, None)
            self.inner[key] = value
            if not now:  # stored when first sent (not again once the store refused it)
                store.track(value, kind, self, key)
        else:
            if key in self.inner:
                del self.inner[key]
            self.stored[key] = kept
            if how == "shares":
                store.track(value, kind, self, key)

    def adopt_soon(self, key: Any, value: Any, view: Any) -> None:
        """Keeps ``view`` (the store's copy of ``value``) for ``key`` instead of ``value``,
        on the worker's event loop (sends are serialized on other threads too), so that the
        worker's own copy goes."""
        self._loop.add_callback(self._adopt, key, value, view)

    def _adopt(self, key: Any, value: Any, view: Any) -> None:
        if self.detached:
            return
        if self.stored.get(key) is value:  # a pandas value that shared stored arrays
            self.stored[key] = view
            return
        fast = getattr(self.inner, "fast", self.inner)  # never unspill: a SpillBuffer's RAM
        try:
            current = fast[key]
        except KeyError:
            return  # released, or spilled to disk meanwhile
        if current is value:
            del self.inner[key]
            self.stored[key] = view

    def __getitem__(self, key: Any) -> Any:
        try:
            return self.stored[key]
        except KeyError:
            return self.inner[key]

    def __delitem__(self, key: Any) -> None:
        if self.stored.pop(key, _MISSING) is _MISSING:
            del self.inner[key]

    def __contains__(self, key: object) -> bool:
        return key in self.stored or key in self.inner

    def __iter__(self) -> Iterator[Any]:
        yield from self.stored
        yield from self.inner

    def __len__(self) -> int:
        return len(self.stored) + len(self.inner)

    def __getattr__(self, name: str) -> Any:
        # SpillBuffer's fast, slow, evict, spilled_total: absent (AttributeError) on a dict,
        # as Dask expects.
        if name in ("inner", "stored", "detached", "_store", "_loop"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<StoreBackedData: {len(self.stored)} in depot, {len(self.inner)} in {self.inner!r}>"


_MISSING = object()


# Serialization: values that view the store travel as handles to peers that share it.


def _install_serialization() -> None:
    """Wraps Dask's "dask" serialization family (the first every comm tries): a value that
    views the store (or will, once stored) travels to a peer that shares the store as a
    handle, anything else as Dask serializes it. And adds what identifies this process's
    store to the comm handshake, for peers to compare with theirs."""
    global _installed
    if _installed:
        return
    # The module, which distributed.protocol's `serialize` function hides.
    serialization = importlib.import_module("distributed.protocol.serialize")
    base_dumps, base_loads, _ = serialization.families["dask"]

    def dumps(x: Any, context: Optional[dict] = None) -> Tuple[dict, list]:
        store = _current()
        handle = store.handle(x, context) if store is not None else None
        if handle is not None:
            return {"depot": handle, "type": dask.utils.typename(type(x))}, []
        return base_dumps(x, context=context)

    def loads(header: dict, frames: list) -> Any:
        handle = header.get("depot")
        if handle is None:
            return base_loads(header, frames)
        store = _current()
        if store is None:
            raise OSError("depot.dask: a peer sent a depot handle, but this process has no store")
        return store.claim(handle)

    serialization.register_serialization_family("dask", dumps, loads)

    base_handshake = Comm.handshake_info

    def handshake_info(self: Comm) -> dict:
        info = base_handshake(self)
        store = _current()
        if store is not None:
            info["depot"] = store.identity
            info["depot-gpus"] = store.gpus
        return info

    Comm.handshake_info = handshake_info  # type: ignore[method-assign]
    _installed = True


# keep="always": results are stored on the thread that ran their task.


def _install_eager_copies() -> None:
    """Wraps the function a worker's thread pool runs each task through (distributed.worker's
    _run_task, looked up at each call, and called only for thread pools) so that a large
    result of a worker attached with keep="always" is copied into the store on the task's
    thread, before the worker's event loop gets it: the loop, which serves the worker's
    comms and heartbeats, never waits for a copy. Results that come some other way (an async
    task, a scatter, a fetch from another host) are stored as the loop keeps them. Does
    nothing on a version of distributed without that function."""
    global _eager_installed
    if _eager_installed:
        return
    worker_module = importlib.import_module("distributed.worker")
    base = getattr(worker_module, "_run_task", None)
    if base is None:
        return

    def run_task(*args: Any, **kwargs: Any) -> Any:
        msg = base(*args, **kwargs)
        state = kwargs.get("execution_state", args[2] if len(args) > 2 else None)
        worker = state.get("worker") if isinstance(state, dict) else None
        store = _current()
        if (
            store is None or not store.eager or worker not in _attached
            or not isinstance(msg, dict) or msg.get("op") != "task-finished"
        ):
            return msg
        value = msg.get("result")
        kind = store.kind_of(value)
        if not store.stores_on_return(kind) or store.kept_as_is(value, kind):
            return msg
        view = store.copy(value, kind)
        if view is None:  # not storable, or the store is full: the loop need not try
            store.declined.put(value, True)
        else:
            msg["result"] = view
        return msg

    setattr(worker_module, "_run_task", run_task)  # looked up as getattr found it
    _eager_installed = True


_eager_installed = False


# Attaching a worker.


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message)
    warnings.warn(message, DepotUnavailableWarning, stacklevel=3)


def _socket_path(socket: Optional[str]) -> str:
    return os.fspath(socket) if socket else _depot.default_socket_path()


def _connect(
    socket: Optional[str], group: bytes, name: str, required: bool
) -> Tuple[Optional[Client], str]:
    """A client of the daemon, or None and why not (after warning once) if no daemon listens
    at the socket. A daemon that listens but cannot be used (another user's, another
    version) is an error, as is a missing one if ``required``."""
    try:
        return Client(socket, name=name, group=group), ""
    except ConnectionError as e:
        if required or isinstance(e, ProtocolMismatch) or _accepts(_socket_path(socket)):
            raise
        message = (
            f"depot.dask: no depotd to attach to ({e}); this worker keeps its data as plain "
            "Dask does. Start depotd on this host (see the README, 'depot with Dask')."
        )
        _warn_once("connect", message)
        return None, message


def attach(
    worker: Any, *, socket: Optional[str] = None, threshold: Union[int, str, None] = None,
    keep: Optional[str] = None, group: Optional[bytes] = None, required: bool = False,
) -> bool:
    """Attaches a running ``distributed.Worker`` to the host's depotd: what DepotPlugin and
    ``--preload depot.dask`` do. Returns False (after one warning, and a ``depot`` event on
    the worker) if no daemon listens at ``socket``, unless ``required``; raises if one does
    but cannot be used (another user's, or another version)."""
    global _store
    limit = _parse_threshold(threshold)
    policy = _parse_keep(keep)
    if group is None:
        group = hashlib.blake2b(
            f"depot.dask {worker.scheduler.address}".encode(), digest_size=16
        ).digest()
    with _lock:
        if worker in _attached:
            return True
        if _store is None:
            client, why = _connect(socket, group, f"dask {worker.address}", required)
            if client is None:
                worker.log_event(
                    EVENT_TOPIC, {"worker": worker.address, "attached": False, "message": why}
                )
                return False
            _store = _Store(client, group, limit, policy)
        _install_serialization()
        if _store.eager:
            _install_eager_copies()
        data = StoreBackedData(worker.memory_manager.data, _store, worker.loop)
        worker.memory_manager.data = data
        worker.state.data = data
        worker.monitor.get_process_memory = private_memory
        _attached.add(worker)
    worker.log_event(
        EVENT_TOPIC,
        {"worker": worker.address, "attached": True, "socket": _store.client.socket,
         "threshold": limit, "keep": policy},
    )
    return True


def detach(worker: Any) -> None:
    """Undoes :func:`attach`: results already stored stay with the worker (as views of the
    store), new ones stay in its memory."""
    with _lock:
        if worker not in _attached:
            return
        data = worker.memory_manager.data
        if isinstance(data, StoreBackedData):
            data.detached = True  # swaps queued by sends in flight no longer apply
            for key, value in data.stored.items():
                data.inner[key] = value
            worker.memory_manager.data = data.inner
            worker.state.data = data.inner
        worker.monitor.__dict__.pop("get_process_memory", None)
        _attached.discard(worker)
        # The process keeps its store: its comms already opened told peers it has one, and
        # they may still send it handles, which it must be able to take.


class DepotPlugin(WorkerPlugin):
    """Attaches each worker to its host's depotd (``client.register_plugin(DepotPlugin())``).

    ``socket``: the daemon's socket, by default as depot.Client finds it (``$DEPOT_SOCKET``,
    ...). ``threshold``: the smallest result kept in the store, in bytes or as a string
    ("1MiB"; default ``$DEPOT_DASK_THRESHOLD``, else 1 MiB). ``keep``: when results go to the
    store, "on-send" or "always" (default ``$DEPOT_DASK_KEEP``, else "on-send"; see the
    module's documentation). ``required``: fail the plugin's setup, instead of warning, when
    no daemon listens there.
    """

    name = "depot"
    idempotent = True

    def __init__(
        self, socket: Optional[str] = None, threshold: Union[int, str, None] = None,
        keep: Optional[str] = None, required: bool = False,
    ) -> None:
        _parse_threshold(threshold)  # a bad value fails here, in the caller's process
        if keep is not None:
            _parse_keep(keep)
        self.socket = None if socket is None else os.fspath(socket)
        self.threshold = threshold
        self.keep = keep
        self.required = required
        # One group per cluster: the workers of a host that share it pass handles.
        self.group = os.urandom(16)

    def setup(self, worker: Any) -> None:
        attach(
            worker, socket=self.socket, threshold=self.threshold, keep=self.keep,
            group=self.group, required=self.required,
        )

    def teardown(self, worker: Any) -> None:
        detach(worker)


class DepotNannyPlugin(NannyPlugin):
    """Makes each nanny restart its worker on the worker's private memory (see
    :func:`private_memory`), not its resident set, which counts the store's pages the
    worker maps (``client.register_plugin(DepotNannyPlugin())``, before DepotPlugin).

    With ``start_daemon=True``, it also makes sure a depotd listens at ``socket`` (as
    depot.Client finds it by default) on each host: the first nanny of a host to find none
    starts one, of ``memory`` (``args``: more depotd flags; ``prefault``: see
    :func:`ensure_daemon`), which stops when the last nanny of that process closes, or with
    the process. It fails the plugin's setup, saying why,
    if depotd cannot be found or does not start (its log is in the message), or if the
    daemon listening there cannot be used (another user's, another version).
    """

    name = "depot-nanny"
    idempotent = True

    def __init__(
        self, start_daemon: bool = False, memory: Union[str, int] = "50%",
        socket: Optional[str] = None, args: Sequence[str] = (), prefault: bool = False,
    ) -> None:
        self.start_daemon = start_daemon
        self.memory = memory
        self.prefault = prefault
        self.socket = None if socket is None else os.fspath(socket)
        self.args = tuple(args)

    def setup(self, nanny: Any) -> None:
        _measure_private_memory(nanny)
        if self.start_daemon:
            ensure_daemon(
                nanny, socket=self.socket, memory=self.memory, args=self.args,
                prefault=self.prefault,
            )

    def teardown(self, nanny: Any) -> None:
        monitor = nanny.periodic_callbacks.get("memory_monitor")
        original = getattr(getattr(monitor, "callback", None), "_depot_original", None)
        if original is not None:
            monitor.callback = original
        _release_daemon(nanny)


# Daemons this process started for its nannies: socket -> (daemon, the nannies using it).
_daemons: Dict[str, Tuple[Daemon, "weakref.WeakSet[Any]"]] = {}


def ensure_daemon(
    nanny: Any, *, socket: Optional[str] = None, memory: Union[str, int] = "50%",
    args: Sequence[str] = (), prefault: bool = False,
) -> str:
    """Makes sure a usable depotd listens at ``socket``, starting one if none does (what
    ``DepotNannyPlugin(start_daemon=True)`` does for each nanny); returns its socket.
    Nannies of several processes on one host take turns through a lock file beside the
    socket, so that one daemon starts. The daemon allocates its pages as results first use
    them (``--no-prefault``) unless ``prefault``: pre-allocating 64 MiB ahead in each
    segment in use and in one more kept ready would take memory the workers may need."""
    path = _socket_path(socket)
    with _lock, open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = _daemons.get(path)
        if started is not None and started[0].running:
            started[1].add(nanny)
            return path
        if _accepts(path):
            Client(path, name="depot.dask check").close()  # raises if it cannot be used
            return path
        try:
            daemon = start_daemon(
                memory, socket=path, args=args, prefault=prefault, stop_with_parent=True
            )
        except (DepotError, OSError) as e:
            raise DepotError(f"depot.dask could not start depotd for this host's workers: {e}") from e
        users: "weakref.WeakSet[Any]" = weakref.WeakSet([nanny])
        _daemons[path] = (daemon, users)
    logger.info("depot.dask: started depotd (pid %d) on %s", daemon.pid, path)
    return path


def _release_daemon(nanny: Any) -> None:
    with _lock:
        for path, (daemon, users) in list(_daemons.items()):
            users.discard(nanny)
            if not users:
                del _daemons[path]
                daemon.close()


def _measure_private_memory(nanny: Any) -> None:
    """Wraps the nanny's memory monitor (a PeriodicCallback of NannyMemoryManager, which
    reads ``psutil.Process(pid).memory_info().rss``) so that, while it runs, that module's
    psutil answers the worker's private memory. Other nannies of the process (a
    LocalCluster's share one) keep theirs: the callback is synchronous, on the event loop."""
    monitor = nanny.periodic_callbacks.get("memory_monitor")
    if monitor is None or hasattr(monitor.callback, "_depot_original"):
        return  # no memory limit, or wrapped already
    from distributed import worker_memory

    original = monitor.callback

    def measure_private_memory() -> Any:
        measured_by = worker_memory.psutil
        worker_memory.psutil = _PrivateMemoryPsutil(measured_by)
        try:
            return original()
        finally:
            worker_memory.psutil = measured_by

    measure_private_memory._depot_original = original  # type: ignore[attr-defined]
    monitor.callback = measure_private_memory


class _PrivateMemoryPsutil:
    def __init__(self, psutil: Any) -> None:
        self._psutil = psutil

    def __getattr__(self, name: str) -> Any:
        return getattr(self._psutil, name)

    def Process(self, pid: Optional[int] = None) -> Any:  # noqa: N802 - psutil's name
        return _PrivateMemoryProcess(self._psutil.Process(pid))


class _PrivateMemoryProcess:
    def __init__(self, process: Any) -> None:
        self._process = process

    def __getattr__(self, name: str) -> Any:
        return getattr(self._process, name)

    def memory_info(self) -> Any:
        info = self._process.memory_info()
        try:
            return info._replace(rss=private_memory(self._process.pid))
        except OSError:
            return info


# `dask worker --preload depot.dask` and `dask worker --preload-nanny depot.dask`.


def dask_setup(server: Any) -> None:
    """Preload entry point: attaches a worker (``--preload depot.dask``), or makes a nanny
    measure its worker's private memory (``--preload-nanny depot.dask``), and, if
    ``$DEPOT_DASK_START_DAEMON`` is set (to the daemon's memory, e.g. "50%"), start depotd
    if none listens. Other settings come from ``$DEPOT_SOCKET``, ``$DEPOT_DASK_THRESHOLD``
    and ``$DEPOT_DASK_KEEP``."""
    from distributed import Nanny

    # No socket: depot.Client, and the default path, take $DEPOT_SOCKET.
    if isinstance(server, Nanny):
        _measure_private_memory(server)
        memory = os.environ.get(START_ENV)
        if memory:
            ensure_daemon(server, memory=memory)
    else:
        attach(server)
