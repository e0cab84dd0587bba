"""How depot.multiprocessing pickles arrays and tensors: as store references.

multiprocessing pickles everything it sends (queues, pipes, pools, a spawned child's
arguments) with ``multiprocessing.reduction.ForkingPickler``. Importing depot.multiprocessing
gives that class a ``reducer_override`` (consulted before any other reducer, torch's
included), which acts only inside what depot.multiprocessing's own queues, pipes and
processes send: they wrap each value in a :class:`Sending` (``_channels``), and a pickler
that meets one sends these values inside it through the store instead of through the pipe,
when they are at least the threshold in bytes:

- numpy arrays of plain dtypes (and their subclasses are left to pickle);
- PyTorch tensors (``torch.Tensor`` and ``torch.nn.Parameter``), on the CPU or a CUDA GPU;
- Paddle CPU tensors (``paddle.Tensor`` and parameters, ``EagerParamBase``);
- CuPy arrays, and any other DLPack producer on a CUDA GPU.

Everything else the standard module, torch.multiprocessing or another library sends pickles
exactly as before (the hook returns NotImplemented), unless the user opts in with
``enable_everywhere()``.

The sender hands the value off to the tree's group (depot.Client.handoff): one copy into
shared memory (or, for a GPU array, into the store's pool on its GPU). The pickle carries
only the reference; the receiver claims it and gets a private, writable copy-on-write view
of the same memory (host values): pages are copied into the receiver only as it writes
them. The sender keeps its stored copy while its own value lives: the same value sent
again, unchanged (its bytes hash the same, XXH3-128), is handed off again with no copy, so
a Pool broadcasting an argument to its tasks stores it once.

Anything else pickles as before. So does a value the store cannot take (full, or not
reachable), with one warning.
"""

from __future__ import annotations

import atexit
import copy
import importlib.util
import os
import sys
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any, Optional, Tuple

from .. import _depot, _gpus
from .._client import _MAX_TTL_S, _MIN_TTL_S, Client
from .._errors import DepotError, NotHeld
from .._identity import ByIdentity
from .._ref import ObjectRef
from . import _store

THRESHOLD_ENV = "DEPOT_MP_THRESHOLD"
DEFAULT_THRESHOLD = 64 * 1024
EVERYWHERE_ENV = "DEPOT_MP_EVERYWHERE"
TTL_ENV = "DEPOT_MP_TTL"
# How long a DataLoader worker's batch waits to be received before the group lets it go,
# when its worker's client has no grace (_store.DATALOADER_GRACE: it connected before torch
# marked the process a worker, unpickling the dataset say) and set_handoff_ttl says nothing:
# a loader left early (a break, a killed worker, the loader collected) never receives the
# batches it prefetched, and the tree may live on. Long, because a training loop that pauses
# longer than this in the middle of an epoch (an evaluation, a checkpoint) loses the batches
# its workers prefetched. With a grace (the rule), a batch waits while its worker lives.
DATALOADER_TTL = 3600.0
STRATEGY_ENV = "DEPOT_MP_SHARING_STRATEGY"
# "depot": tensors through the store; torch's own strategies: tensors left to torch.
STRATEGIES = ("depot", "file_descriptor", "file_system")


class Sending:
    """A value that depot.multiprocessing's own queues, pipes or processes send: what it
    holds goes through the store. Unpickles as the value itself, whoever pickles it.

    From the moment a pickler meets it until it is gone, with the value it held, it counts
    as a send under way (see _wait_for_sends): a Queue's feeder thread drops it, and with
    it often a tensor's last reference, right after pickling it."""

    __slots__ = ("value", "counted")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.counted = False

    def __reduce__(self) -> Any:
        return _unwrap, (self.value,)

    def __del__(self) -> None:
        self.release()

    def release(self) -> None:
        """Lets the value go and stops counting it as under way (once)."""
        if self.counted:
            self.counted = False
            self.value = None  # the value's last reference may go here, in this thread
            _end_send()


def _unwrap(value: Any) -> Any:
    return value


# Whether every ForkingPickler sends through the store (enable_everywhere), not only what
# this module's channels send. Inherited by children through DEPOT_MP_EVERYWHERE.
_everywhere = os.environ.get(EVERYWHERE_ENV) == "1"


def enable_everywhere() -> None:
    """Opts in: everything multiprocessing sends in this process and its children (the
    standard module's contexts, torch.multiprocessing's, concurrent.futures) goes through
    the store as depot.multiprocessing's own sends do."""
    global _everywhere
    _everywhere = True
    os.environ[EVERYWHERE_ENV] = "1"


def everywhere() -> bool:
    return _everywhere


def _initial_strategy() -> str:
    text = os.environ.get(STRATEGY_ENV, "depot")
    if text not in STRATEGIES:
        raise ValueError(f"{STRATEGY_ENV}={text!r}: expected one of {', '.join(STRATEGIES)}")
    return text


_strategy = _initial_strategy()
if _strategy != "depot" and importlib.util.find_spec("torch") is not None:
    # Inherited: torch's reducer sends tensors here too, with the strategy chosen.
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy(_strategy)


def set_sharing_strategy(strategy: str) -> None:
    """How tensors are sent (torch.multiprocessing's function of the same name, with depot's
    strategy besides): ``"depot"`` (the default) through the store; torch's
    ``"file_descriptor"`` or ``"file_system"`` by torch's own reducer, with that strategy
    set in torch.multiprocessing too (arrays still go through the store). Applies to this
    process; children inherit it through ``DEPOT_MP_SHARING_STRATEGY``."""
    global _strategy
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown sharing strategy {strategy!r}: depot.multiprocessing has "
            + ", ".join(repr(s) for s in STRATEGIES)
        )
    if strategy != "depot" and importlib.util.find_spec("torch") is not None:
        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy(strategy)
    _strategy = strategy
    os.environ[STRATEGY_ENV] = strategy


def get_sharing_strategy() -> str:
    return _strategy


def get_all_sharing_strategies() -> set:
    return set(STRATEGIES)


def _parse_ttl(text: str) -> Optional[float]:
    if text in ("", "none"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{TTL_ENV}={text!r}: expected seconds, such as 600, or none") from None
    if not _MIN_TTL_S <= seconds <= _MAX_TTL_S:
        raise ValueError(
            f"{TTL_ENV}={text!r}: expected seconds from {_MIN_TTL_S} to {_MAX_TTL_S:.0f}, "
            "or none"
        )
    return seconds


# Sends' ttl: None (unset) gives none, but DATALOADER_TTL to a DataLoader worker's sends
# through a client with no grace (see DATALOADER_TTL).
_ttl: Optional[float] = _parse_ttl(os.environ.get(TTL_ENV, ""))


def set_handoff_ttl(seconds: Optional[float]) -> None:
    """How long a value sent waits to be received, in seconds, before the store lets it go:
    its receiver then gets an error naming this setting. ``None`` (the default): a
    DataLoader worker's batches wait an hour, other values until the process tree ends (as
    the standard module's queues keep theirs). Applies to this process; children inherit it
    through ``DEPOT_MP_TTL``."""
    global _ttl
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, (int, float))
        or not _MIN_TTL_S <= seconds <= _MAX_TTL_S
    ):
        raise ValueError(
            f"a handoff ttl is seconds from {_MIN_TTL_S} to {_MAX_TTL_S:.0f}, or None, "
            f"not {seconds!r}"
        )
    _ttl = None if seconds is None else float(seconds)
    os.environ[TTL_ENV] = "none" if seconds is None else repr(float(seconds))


def get_handoff_ttl() -> Optional[float]:
    return _ttl


def _send_ttl(client: Client) -> Optional[float]:
    """The ttl of a send from this process now, through ``client``."""
    if _ttl is not None:
        return _ttl
    if client.handoff_grace is not None or not _store.in_dataloader_worker():
        return None
    return DATALOADER_TTL


def _initial_threshold() -> int:
    text = os.environ.get(THRESHOLD_ENV)
    if text is None:
        return DEFAULT_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"{THRESHOLD_ENV}={text!r}: expected a byte count, such as 65536"
        ) from None
    if value < 0:
        raise ValueError(f"{THRESHOLD_ENV}={text!r}: expected a byte count of 0 or more")
    return value


_threshold = _initial_threshold()


def set_threshold(nbytes: int) -> None:
    """Values of at least ``nbytes`` go through the store; smaller ones are pickled.
    Applies to this process; children inherit it through ``DEPOT_MP_THRESHOLD``."""
    global _threshold
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"the threshold is a byte count of 0 or more, not {nbytes!r}")
    _threshold = nbytes
    os.environ[THRESHOLD_ENV] = str(nbytes)


def get_threshold() -> int:
    return _threshold


# What this process sent, while the value lives: (its ref, the GPU it is on or None, the
# digest of its bytes, this client's reference to the object). The reference keeps the
# stored copy while the sender's value lives, so that the same value sent again is handed
# off again however fast the earlier sends were claimed.
_sent = ByIdentity()
_inherited: list = []


def _forget_after_fork() -> None:
    """In a forked child: the parent's references are its own (never dropped here), and so
    are the sends it had under way in its other threads."""
    global _sending, _sending_lock
    _inherited.append(_sent.take_all())
    _sending = 0
    _sending_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _remember(value: Any, ref: ObjectRef, gpu: Optional[int], digest: Any, held: Any) -> None:
    _sent.put(value, (ref, gpu, digest, held))  # nothing for a value without weak references


def _send_again(value: Any, digest: Any) -> Optional[Tuple[ObjectRef, Optional[int]]]:
    """The ref of an earlier send of this very value with these bytes and layout, handed off
    once more; else None."""
    entry = _sent.get(value)
    if entry is None or entry[2] != digest:
        return None
    client = _store.client()
    if client is None:
        return None
    ref, gpu = entry[0], entry[1]
    try:
        client.handoff_again(ref, device=gpu, ttl=_send_ttl(client))
    except DepotError:  # the store lost it (the daemon restarted, say): store it anew
        _sent.discard(value)
        return None
    return ref, gpu


def _hand_off(
    value: Any, payload: Any = None, raw: Any = None, layout: Any = None
) -> Optional[Tuple[ObjectRef, Optional[int]]]:
    """Hands ``payload`` (default: ``value``) to the group, as what was sent of ``value``;
    ``raw``, the bytes as a contiguous buffer, and ``layout`` (dtype, shape, ...: what the
    bytes mean) tell the same value sent again. None, having warned once, if the store
    cannot take it."""
    if payload is None:
        payload = value
    client = _store.client()
    if client is None:
        return None
    digest = (_depot.digest(raw), layout) if raw is not None else None
    if digest is not None:
        again = _send_again(value, digest)
        if again is not None:
            return again
    try:
        ref, gpu, held = client._handoff(payload, ttl=_send_ttl(client))
    except DepotError as e:  # full, too large, or the daemon gone: never a deadlock
        _store.warn_once(
            type(e).__name__,
            f"depot.multiprocessing: the store cannot take a {type(value).__name__} of "
            f"{_nbytes(value)} bytes ({e}); it, and others the store refuses so, are pickled "
            "and copied instead",
        )
        return None
    if digest is not None and held is not None:
        _remember(value, ref, gpu, digest, held)
    return ref, gpu


def _nbytes(value: Any) -> int:
    return _gpus.nbytes(value) or 0


def _gpu_uuid(gpu: Optional[int]) -> Optional[bytes]:
    return None if gpu is None else _gpus.uuid_of(_store.client(), gpu)


def _claim(ref_id: bytes, uuid: Optional[bytes]) -> Any:
    """The value handed off as ``ref_id``: on the GPU of ``uuid``, or (None) from host
    memory, writable and private (a copy-on-write view of the store's pages)."""
    client = _store.client()
    if client is None:
        raise DepotError(
            "depot.multiprocessing received a value sent through the depot store, but this "
            f"process cannot reach the store: {_store.unavailable()}"
        )
    try:
        return _gpus.claim(client, ref_id, uuid, "depot.multiprocessing", writable=uuid is None)
    except NotHeld as e:
        raise NotHeld(
            "depot.multiprocessing received a value the store no longer holds for this tree: "
            "it was received already, or it waited longer than its ttl (set_handoff_ttl, "
            f"DEPOT_MP_TTL), or it came from a DataLoader worker that exited over "
            f"{_store.DATALOADER_GRACE:g} s ago, or the tree's first process has exited ({e})"
        ) from e


# numpy.


def _reduce_ndarray(array: Any) -> Any:
    from .._codec import _plain_dtype

    if array.nbytes < _threshold or not _plain_dtype(array.dtype):
        return NotImplemented
    contiguous = array.flags.c_contiguous or array.flags.f_contiguous
    raw = array.ravel(order="K").view("u1") if contiguous else None
    layout = (array.dtype.str, array.shape, array.strides)
    sent = _hand_off(array, raw=raw, layout=layout)
    if sent is None:
        return NotImplemented
    return _rebuild_ndarray, (sent[0].id,)


def _rebuild_ndarray(ref_id: bytes) -> Any:
    return _claim(ref_id, None)


# PyTorch.


def _reduce_tensor(tensor: Any) -> Any:
    import torch

    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta:
        return NotImplemented
    if tensor.requires_grad and not tensor.is_leaf:
        # Cannot be sent detached: pickled as before (which raises, as torch's does).
        return NotImplemented
    if tensor.device.type not in ("cpu", "cuda") or _strategy != "depot":
        return NotImplemented
    if tensor.device.type == "cpu" and tensor.is_shared() and not _store.in_dataloader_worker():
        # In torch's shared memory (share_memory_(), Hogwild training): torch's reducer keeps
        # it shared, writable by every process. (A DataLoader worker's batches are there too,
        # put there by its collate to save a copy: those go through the store.)
        return NotImplemented
    data = tensor.detach().resolve_conj().resolve_neg()
    sent = None
    if data.element_size() * data.numel() >= _threshold:
        if data.is_cuda:
            sent = _hand_off(tensor, data.contiguous())
        else:
            # As bytes: every dtype (bfloat16 too) goes, and comes back viewed as itself.
            flat = data.contiguous().reshape(-1).view(torch.uint8).numpy()
            sent = _hand_off(tensor, flat, flat, (str(data.dtype), tuple(data.shape)))
    layout = (
        str(data.dtype).removeprefix("torch."),
        tuple(data.shape),
        bool(tensor.requires_grad),
        type(tensor) is torch.nn.Parameter,
    )
    if sent is None:
        # Small, or refused by the store: its bytes in the pickle, as plain pickling does
        # (not torch's reducer, which needs the sender alive until the receiver takes it).
        raw = data.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
        return _rebuild_inline_tensor, (raw, str(data.device)) + layout
    ref, gpu = sent
    kind = "cuda" if data.is_cuda else "cpu"
    return _rebuild_tensor, (ref.id, _gpu_uuid(gpu), kind) + layout


def _as_sent(tensor: Any, requires_grad: bool, parameter: bool) -> Any:
    import torch

    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _rebuild_inline_tensor(
    raw: bytes, device: str, dtype: str, shape: Tuple[int, ...], requires_grad: bool,
    parameter: bool,
) -> Any:
    import torch

    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    tensor = tensor.view(getattr(torch, dtype)).reshape(shape).to(device)
    return _as_sent(tensor, requires_grad, parameter)


def _rebuild_tensor(
    ref_id: bytes, uuid: Optional[bytes], kind: str, dtype: str, shape: Tuple[int, ...],
    requires_grad: bool, parameter: bool,
) -> Any:
    import torch

    value = _claim(ref_id, uuid)
    if kind == "cuda":
        # CUDA IPC maps the store's GPU memory writable, with no copy-on-write: a private
        # copy on the same GPU (one device-to-device copy), so that writing the tensor, as
        # a CPU one may be written, changes neither the sender's nor another receiver's.
        tensor = torch.from_dlpack(value).clone()
    else:
        # The array is a private, writable view: so is the tensor.
        tensor = torch.from_numpy(value).view(getattr(torch, dtype)).reshape(shape)
    return _as_sent(tensor, requires_grad, parameter)


# Paddle.


def _reduce_paddle(tensor: Any) -> Any:
    import numpy
    import paddle

    if not tensor.place.is_cpu_place():
        return NotImplemented  # GPU tensors: paddle's own reducer (not built here yet)
    if not tensor.stop_gradient and not tensor.is_leaf:
        return NotImplemented  # cannot be sent detached: paddle's reducer refuses it too
    data = tensor.detach()
    if not data.is_contiguous():
        data = data.contiguous()
    # Its bytes, viewed with no copy (DLPack), whatever the dtype (bfloat16 too).
    flat = numpy.from_dlpack(data.flatten().view(paddle.uint8)) if data.size else None
    dtype = str(data.dtype).removeprefix("paddle.")
    shape = tuple(data.shape)
    parameter = None
    if type(tensor) is paddle.base.framework.EagerParamBase:
        parameter = (copy.deepcopy(tensor.__dict__), tensor.name, tensor.trainable)
    layout = (dtype, shape, bool(tensor.stop_gradient), parameter)
    sent = None
    if flat is not None and flat.nbytes >= _threshold:
        sent = _hand_off(tensor, flat, flat, (dtype, shape))
    if sent is None:
        raw = b"" if flat is None else flat.tobytes()
        return _rebuild_inline_paddle, (raw,) + layout
    return _rebuild_paddle, (sent[0].id,) + layout


def _as_paddle(
    flat: Any, dtype: str, shape: Tuple[int, ...], stop_gradient: bool, parameter: Any
) -> Any:
    """A paddle tensor viewing ``flat`` (writable uint8 bytes, or None: empty), as sent."""
    import paddle

    kind = getattr(paddle, dtype)
    if flat is None or flat.size == 0:
        tensor = paddle.zeros(shape, dtype=kind)
    else:
        tensor = paddle.utils.dlpack.from_dlpack(flat.__dlpack__()).view(kind).reshape(shape)
    if parameter is not None:
        attributes, name, trainable = parameter
        param = paddle.base.framework.EagerParamBase(
            list(shape), kind, name=name, trainable=trainable, **attributes
        )
        param.value().get_tensor()._share_data_with(tensor.get_tensor())
        param.__dict__.update(attributes)  # those the constructor does not take, too
        param.stop_gradient = stop_gradient
        return param
    tensor.stop_gradient = stop_gradient
    return tensor


def _rebuild_paddle(
    ref_id: bytes, dtype: str, shape: Tuple[int, ...], stop_gradient: bool, parameter: Any
) -> Any:
    return _as_paddle(_claim(ref_id, None), dtype, shape, stop_gradient, parameter)


def _rebuild_inline_paddle(
    raw: bytes, dtype: str, shape: Tuple[int, ...], stop_gradient: bool, parameter: Any
) -> Any:
    import numpy

    flat = numpy.frombuffer(bytearray(raw), dtype=numpy.uint8) if raw else None
    return _as_paddle(flat, dtype, shape, stop_gradient, parameter)


# CuPy and other CUDA arrays (DLPack producers).


def _reduce_gpu_array(value: Any) -> Any:
    nbytes = getattr(value, "nbytes", None)  # unknown: sent through the store
    if nbytes is not None and int(nbytes) < _threshold:
        return NotImplemented
    sent = _hand_off(value)
    if sent is None:
        return NotImplemented
    ref, gpu = sent
    module = type(value).__module__.split(".")[0]
    return _rebuild_gpu_array, (ref.id, _gpu_uuid(gpu), module)


def _rebuild_gpu_array(ref_id: bytes, uuid: Optional[bytes], module: str) -> Any:
    # CuPy's, a private copy as a received CUDA tensor is; or a depot.DeviceArray (DLPack
    # and __cuda_array_interface__, read-only) for any other.
    if module == "cupy":
        return _gpus.as_library(_claim(ref_id, uuid), "cupy").copy()
    return _claim(ref_id, uuid)


def reducer_override(self: Any, obj: Any) -> Any:
    """ForkingPickler's hook. Inside what this module's channels send (a :class:`Sending`
    marks the pickler) or everywhere once enabled: a store reference for the values above;
    NotImplemented (pickle as usual) for anything else, and for a value this module fails
    on (once warned: raising here would drop the item in a Queue's feeder thread, and its
    receiver would wait for ever)."""
    if type(obj) is Sending:
        self._depot_sends = True
        if not obj.counted:
            obj.counted = True
            _begin_send()
        return _unwrap, (obj.value,)
    if not (_everywhere or getattr(self, "_depot_sends", False)):
        return NotImplemented
    _begin_send()
    try:
        return _reduce(obj)
    except Exception as e:
        _store.warn_once(
            "error:" + type(e).__name__,
            f"depot.multiprocessing could not send a {type(obj).__name__} through the store "
            f"({type(e).__name__}: {e}); it, and others failing so, are pickled instead",
        )
        return NotImplemented
    finally:
        _end_send()


# Sends under way in this process, in any thread (a Queue's feeder thread, say): values
# being pickled, and sent values being let go after. At exit the interpreter ends daemon
# threads that ask for the GIL back, and one inside a library's C++ call then (a torch
# tensor's copy, or its deallocation, with the GIL released by a guard whose destructor
# takes it back) aborts the whole process: as DataLoader workers told to stop in the middle
# of a send did, which their loader reported as "killed by signal: Aborted". So a process
# waits at exit, at most _EXIT_WAIT_S, for the sends under way (not for values still queued
# behind them: the receiver is gone or going, and the store lets values go with their ttl
# or the tree).
_sending = 0
_sending_lock = threading.Lock()
_EXIT_WAIT_S = 10.0


def _begin_send() -> None:
    global _sending
    with _sending_lock:
        _sending += 1


def _end_send() -> None:
    global _sending
    with _sending_lock:
        _sending -= 1


def _wait_for_sends() -> None:
    deadline = time.monotonic() + _EXIT_WAIT_S
    while _sending and time.monotonic() < deadline:
        time.sleep(0.002)


atexit.register(_wait_for_sends)


def _reduce(obj: Any) -> Any:
    cls = type(obj)
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.ndarray:
        return _reduce_ndarray(obj)
    torch = sys.modules.get("torch")
    if torch is not None and (cls is torch.Tensor or cls is torch.nn.Parameter):
        return _reduce_tensor(obj)
    paddle = sys.modules.get("paddle")
    if paddle is not None and (
        cls is paddle.Tensor or cls is paddle.base.framework.EagerParamBase
    ):
        return _reduce_paddle(obj)
    if cls.__module__.split(".")[0] in ("builtins", "numpy"):
        return NotImplemented
    if _gpus.on_cuda(obj):
        return _reduce_gpu_array(obj)
    return NotImplemented


def install() -> None:
    """Gives ForkingPickler the hook (once)."""
    ForkingPickler.reducer_override = reducer_override  # type: ignore[method-assign]
