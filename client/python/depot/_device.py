"""GPU objects: put of DLPack / __cuda_array_interface__ producers, and DeviceArray, what
``get(..., device=k)`` returns (see docs/python.md, "GPU objects").

Nothing here imports CuPy, PyTorch or numpy at import time: GPU arrays are read through the
DLPack capsule (parsed by the binding, ``depot._depot.DLPackImport``) or the CUDA array
interface dict, and handed out the same ways.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _depot
from ._errors import GpuNotSupported, InvalidArgument
from ._ref import ObjectRef

# DLPack device types (DLDeviceType).
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
_HOST_DEVICES = (KDL_CPU, KDL_CUDA_HOST)
_CUDA_DEVICES = (KDL_CUDA, KDL_CUDA_MANAGED)

# DLPack type codes (DLDataTypeCode) <-> numpy kinds, for the dtypes both have.
_KIND_OF_CODE = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_CODE_OF_KIND = {kind: code for code, kind in _KIND_OF_CODE.items()}
_SIZES = {"i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16), "b": (1,)}
_NATIVE = "<" if sys.byteorder == "little" else ">"
_TYPESTR = re.compile(r"^([<>|=])([a-zA-Z])(\d+)")

# The legacy default stream, as a DLPack consumer names it (__dlpack__(stream=1)): the binding
# copies on that stream, so the producer makes its writes visible there first.
_LEGACY_STREAM = 1

DEVARRAY = b"devarray"


def typestr_of_dlpack(code: int, bits: int, lanes: int) -> str:
    """The numpy-style type string of a DLPack dtype (``<f4``, ``|b1``), or
    ``dlpack:<code>:<bits>:<lanes>`` for one numpy has not (bfloat16, float8, vectors)."""
    kind = _KIND_OF_CODE.get(code)
    if kind is not None and lanes == 1 and bits % 8 == 0 and bits // 8 in _SIZES[kind]:
        size = bits // 8
        return ("|" if size == 1 else _NATIVE) + kind + str(size)
    return f"dlpack:{code}:{bits}:{lanes}"


def dlpack_of_typestr(typestr: str) -> Optional[Tuple[int, int, int]]:
    """(code, bits, lanes) of a type string, or None if DLPack has no such type (datetimes,
    strings, other byte order)."""
    if typestr.startswith("dlpack:"):
        code, bits, lanes = (int(x) for x in typestr[7:].split(":"))
        return code, bits, lanes
    m = _TYPESTR.match(typestr)
    if m is None or m.end() != len(typestr):
        return None
    order, kind, size = m.group(1), m.group(2), int(m.group(3))
    if kind not in _CODE_OF_KIND or size not in _SIZES[kind]:
        return None
    if size > 1 and order not in (_NATIVE, "="):
        return None
    return _CODE_OF_KIND[kind], size * 8, 1


def itemsize_of(typestr: str) -> int:
    """Bytes per element of a type string."""
    if typestr.startswith("dlpack:"):
        _, bits, lanes = dlpack_of_typestr(typestr)  # type: ignore[misc]
        return bits * lanes // 8
    m = _TYPESTR.match(typestr)
    if m is not None:
        return int(m.group(3))
    np = _numpy()
    if np is None:
        raise InvalidArgument(f"cannot tell the size of dtype {typestr!r} without numpy")
    return np.dtype(typestr).itemsize


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def numpy_dtype(typestr: str) -> Any:
    """The numpy dtype of a type string: ``V<n>`` (raw bytes) for DLPack-only types."""
    import numpy as np

    if typestr.startswith("dlpack:"):
        return np.dtype(f"V{itemsize_of(typestr)}")
    return np.dtype(typestr)


def devarray_metadata(typestr: str, shape: Sequence[int]) -> bytes:
    return b"depot-py/1 devarray %s %s" % (
        typestr.encode(),
        ",".join(str(int(d)) for d in shape).encode(),
    )


def c_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    strides = []
    step = itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def _f_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    strides = []
    step = itemsize
    for d in shape:
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(strides)


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int], unit: int) -> bool:
    """Whether ``strides`` (in units of ``unit``: 1 for elements, the itemsize for bytes)
    lay ``shape`` out in C order. Strides of dimensions of extent 1 do not matter."""
    if any(int(d) == 0 for d in shape):
        return True
    expected = unit
    for d, s in zip(reversed(shape), reversed(strides)):
        if int(d) != 1 and int(s) != expected:
            return False
        expected *= int(d)
    return True


def _product(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _not_contiguous(value: Any, shape: Sequence[int], strides: Sequence[int]) -> InvalidArgument:
    return InvalidArgument(
        f"cannot put a {type(value).__name__} of shape {tuple(shape)} with strides "
        f"{tuple(strides)}: GPU arrays are stored in C order, and this one is not "
        "C-contiguous; put a contiguous copy (x.contiguous() in PyTorch, "
        "cupy.ascontiguousarray(x) in CuPy)"
    )


# Writing.


class DLPackSource(NamedTuple):
    value: Any
    device: int


class InterfaceSource(NamedTuple):
    value: Any
    interface: Dict[str, Any]


def classify(value: Any) -> Any:
    """A DLPackSource or InterfaceSource for a GPU array, None for a host value. Raises
    GpuNotSupported for an array on a device that is neither host memory nor a CUDA GPU.

    The protocols are looked up on the value's type, where every producer defines them: on
    the value, a pandas object looks for a column of that name first, several microseconds
    for each output of each task."""
    kind = type(value)
    if kind.__module__ == "numpy":
        return None
    if hasattr(kind, "__dlpack_device__") and hasattr(kind, "__dlpack__"):
        device_of = value.__dlpack_device__
        try:
            device_type, device_id = (int(x) for x in device_of())
        except Exception:  # not a DLPack producer after all
            device_type = None
        if device_type is not None:
            if device_type in _HOST_DEVICES:
                return None
            if device_type in _CUDA_DEVICES:
                return DLPackSource(value, device_id)
            raise GpuNotSupported(
                f"cannot put a {type(value).__name__} on DLPack device type {device_type}: "
                "depot stores host memory and CUDA GPU memory only; copy it to one of them"
            )
    # The interface may be an attribute of the value itself (the spec allows it): looked up
    # in its __dict__, which costs no __getattr__.
    if not hasattr(kind, "__cuda_array_interface__") and "__cuda_array_interface__" not in (
        getattr(value, "__dict__", None) or ()
    ):
        return None
    try:
        interface = getattr(value, "__cuda_array_interface__", None)
    except Exception:  # e.g. a CPU tensor, whose property raises
        interface = None
    if isinstance(interface, dict):
        return InterfaceSource(value, interface)
    return None


def _capsule(value: Any) -> Any:
    """The value's DLPack capsule: versioned if the producer can, on the legacy stream."""
    try:
        return value.__dlpack__(stream=_LEGACY_STREAM, max_version=(1, 0))
    except TypeError:  # a producer from before DLPack 1.0: no max_version
        return value.__dlpack__(stream=_LEGACY_STREAM)


def put_device(
    native: Any, ref: ObjectRef, source: Any, device: Optional[int], pin: bool,
    default_device: Optional[int] = None, handoff: bool = False, ttl_ms: int = 0,
) -> int:
    """Stores a GPU array (classify's result) as a new object on its GPU, and returns that
    GPU's ordinal. ``device`` is what the caller says it is on (an error if the array says
    otherwise); ``default_device`` where a ``__cuda_array_interface__`` array whose pointer
    the driver does not know (a simulated GPU's) is taken to be, when ``device`` is None
    (else 0). ``handoff``: hands the object to the client's group (Client.handoff), for
    ``ttl_ms`` (0: until claimed or the group ends)."""
    name = ref.name or ""
    if isinstance(source, DLPackSource):
        value = source.value
        if device is not None and int(device) != source.device:
            raise InvalidArgument(
                f"this {type(value).__name__} is on GPU {source.device}, not {device}: a GPU "
                "array is stored on its own GPU (get(..., device=k) copies it elsewhere)"
            )
        tensor = _depot.DLPackImport(_capsule(value))
        try:
            if tensor.device_type not in _CUDA_DEVICES:
                raise InvalidArgument(
                    f"the {type(value).__name__}'s DLPack capsule is on device type "
                    f"{tensor.device_type}, though __dlpack_device__ said CUDA"
                )
            shape: Sequence[int] = tensor.shape
            strides = tensor.strides
            if strides is not None and not is_c_contiguous(shape, strides, 1):
                raise _not_contiguous(value, shape, strides)
            bits = tensor.bits * tensor.lanes
            if bits % 8:
                raise InvalidArgument(
                    f"cannot put a {type(value).__name__} of {tensor.bits}-bit elements: only "
                    "whole bytes per element"
                )
            typestr = typestr_of_dlpack(tensor.code, tensor.bits, tensor.lanes)
            nbytes = _product(shape) * (bits // 8)
            target = source.device if device is None else int(device)
            native.put_device(
                ref.id, tensor.data, nbytes, target, None, devarray_metadata(typestr, shape),
                name, pin, handoff, ttl_ms,
            )
        finally:
            tensor.close()  # the producer's deleter: the copy is complete
        return target
    value, cai = source.value, source.interface
    if cai.get("mask") is not None:
        raise InvalidArgument("cannot put a masked array (__cuda_array_interface__ mask)")
    shape = tuple(int(d) for d in cai["shape"])
    typestr = str(cai["typestr"])
    itemsize = itemsize_of(typestr)
    strides = cai.get("strides")
    if strides is not None and not is_c_contiguous(shape, strides, itemsize):
        raise _not_contiguous(value, shape, strides)
    pointer = int(cai["data"][0])
    # The interface does not say which GPU the data is on; the driver does. The copy, and the
    # wait for the producer's stream, then run in that GPU's context. (Unknown to the driver:
    # a simulated GPU's pointer; `device`, default 0, names the GPU.)
    on = _depot.pointer_device(pointer)
    if on is not None and device is not None and int(device) != on:
        raise InvalidArgument(
            f"this {type(value).__name__} is on GPU {on}, not {device}: a GPU array is stored "
            "on its own GPU (get(..., device=k) copies it elsewhere)"
        )
    if on is not None:
        target = on
    elif device is not None:
        target = int(device)
    else:
        target = 0 if default_device is None else int(default_device)
    stream = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    native.put_device(
        ref.id, pointer, _product(shape) * itemsize, target,
        None if stream is None else int(stream), devarray_metadata(typestr, shape), name, pin,
        handoff, ttl_ms,
    )
    return target


# Reading.


def is_array_metadata(metadata: bytes) -> bool:
    """Whether an object's metadata says it is an array (a numpy or a GPU one)."""
    return metadata.startswith(b"depot-py/1 ndarray ") or metadata.startswith(
        b"depot-py/1 " + DEVARRAY + b" "
    )


def _layout(metadata: bytes, size: int) -> Tuple[Tuple[int, ...], str, Optional[Tuple[int, ...]]]:
    """(shape, typestr, byte strides or None for C order) of an object's data."""
    fields = metadata.split(b" ")
    if metadata.startswith(b"depot-py/1 ") and len(fields) >= 3:
        kind = fields[1]
        if kind == DEVARRAY and len(fields) == 4:
            shape = tuple(int(d) for d in fields[3].split(b",")) if fields[3] else ()
            return shape, fields[2].decode(), None
        if kind == b"ndarray" and len(fields) == 5:
            shape = tuple(int(d) for d in fields[4].split(b",")) if fields[4] else ()
            typestr = fields[2].decode()
            if fields[3] == b"F" and len(shape) > 1:
                return shape, typestr, _f_strides(shape, itemsize_of(typestr))
            return shape, typestr, None
    return (size,), "|u1", None  # bytes, pickles, other writers' objects: their bytes


class DeviceArray:
    """A read-only array in the store's pool on a GPU: what ``Client.get(ref, device=k)``
    returns. No copy: its memory is the store's.

    Hand it to any CUDA library: ``torch.from_dlpack(a)`` / ``cupy.from_dlpack(a)`` (DLPack:
    ``__dlpack__``, ``__dlpack_device__``), or ``cupy.asarray(a)`` and Numba
    (``__cuda_array_interface__`` v3). They view the same memory, which they must not write.
    The store reference is held until this object, and every array made from it, is gone.

    The store's copy is complete when ``get`` returns, so consumers need not synchronise
    with any stream. On a daemon with simulated GPUs (``--simulate-gpus``), :attr:`ptr` is a
    host address (:attr:`simulated` is true) though ``__dlpack_device__`` still says CUDA:
    only depot-aware code (tests) can read it.
    """

    __slots__ = ("_buffer", "_shape", "_typestr", "_strides", "__weakref__")

    def __init__(self, buffer: Any, shape: Tuple[int, ...], typestr: str,
                 strides: Optional[Tuple[int, ...]] = None) -> None:
        self._buffer = buffer
        self._shape = shape
        self._typestr = typestr
        self._strides = strides

    @classmethod
    def _of(cls, buffer: Any) -> "DeviceArray":
        shape, typestr, strides = _layout(buffer.metadata, buffer.size)
        return cls(buffer, shape, typestr, strides)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return _product(self._shape)

    @property
    def typestr(self) -> str:
        """The element type as a numpy type string (``<f4``), or ``dlpack:<code>:<bits>:<lanes>``
        for types numpy has not (bfloat16)."""
        return self._typestr

    @property
    def dtype(self) -> Any:
        """The numpy dtype (raw ``V<n>`` for types numpy has not); the type string if numpy is
        not installed."""
        try:
            return numpy_dtype(self._typestr)
        except ImportError:
            return self._typestr

    @property
    def strides(self) -> Optional[Tuple[int, ...]]:
        """Byte strides, or None for C order (every array put from a GPU)."""
        return self._strides

    @property
    def nbytes(self) -> int:
        return self._buffer.size

    @property
    def ptr(self) -> int:
        """The data's device pointer in this process (a host address on a simulated GPU)."""
        return self._buffer.ptr

    @property
    def device(self) -> int:
        """This process's CUDA ordinal of the GPU."""
        return self._buffer.device

    @property
    def simulated(self) -> bool:
        """Whether the GPU is one of a daemon's simulated GPUs (memory is host memory)."""
        return self._buffer.simulated

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self._buffer.id)

    @property
    def metadata(self) -> bytes:
        return self._buffer.metadata

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        return self._shape[0]

    def __repr__(self) -> str:
        where = "simulated GPU" if self.simulated else "GPU"
        return (f"<depot.DeviceArray shape={self._shape} dtype={self._typestr} on {where} "
                f"{self.device} ptr=0x{self.ptr:x}>")

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (KDL_CUDA, self._buffer.device)

    def __dlpack__(self, stream: Any = None, *, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule viewing the store's memory: ``dltensor_versioned`` (DLPack 1.0,
        read-only flag set) when the consumer passes ``max_version`` >= (1, 0), else a
        ``dltensor``. ``stream`` needs no synchronisation: the data is complete."""
        if copy:
            raise BufferError("depot's DeviceArray cannot export a copy; it exports the "
                              "store's memory only (copy=False or None)")
        if dl_device is not None and tuple(int(x) for x in dl_device) != self.__dlpack_device__():
            raise BufferError(f"this array is on DLPack device {self.__dlpack_device__()}, "
                              f"not {tuple(dl_device)}; it cannot be exported there")
        dtype = dlpack_of_typestr(self._typestr)
        if dtype is None:
            raise BufferError(f"dtype {self._typestr} has no DLPack equivalent")
        versioned = max_version is not None and int(max_version[0]) >= 1
        strides = None
        itemsize = itemsize_of(self._typestr)
        if self._strides is not None and not is_c_contiguous(self._shape, self._strides, itemsize):
            strides = [s // itemsize for s in self._strides]
        code, bits, lanes = dtype
        return self._buffer.dlpack(versioned, KDL_CUDA, list(self._shape), strides, code, bits,
                                   lanes)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """Version 3, read-only; no stream (the data is complete)."""
        typestr = self._typestr
        if typestr.startswith("dlpack:"):
            typestr = f"|V{itemsize_of(typestr)}"
        return {
            "shape": self._shape,
            "typestr": typestr,
            "data": (self._buffer.ptr, True),
            "version": 3,
            "strides": self._strides,
            "stream": None,
        }


def wrap(buffers: List[Any]) -> List[DeviceArray]:
    return [DeviceArray._of(b) for b in buffers]
