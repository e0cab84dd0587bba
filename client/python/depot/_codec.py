"""How Python values are laid out in objects, and read back (see docs/python.md).

Every object the Python client writes has a metadata blob that starts with ``depot-py/1 ``
and names its kind; the other fields are ASCII, separated by single spaces:

``depot-py/1 bytes``
    The data is the bytes themselves. ``get`` returns a read-only ``memoryview``.
``depot-py/1 ndarray <dtype> <C|F> <shape>``
    The data is the array's elements in C or Fortran order; ``<dtype>`` is
    ``numpy.dtype.str`` (``<f8``, ``|b1``, ``<M8[ns]``) and ``<shape>`` the dimensions,
    comma-separated (empty for a 0-d array). ``get`` returns a read-only ndarray on the
    store's memory.
``depot-py/1 devarray <dtype> <shape>``
    A GPU array put from a DLPack or CUDA array interface producer: its elements in C
    order; ``<dtype>`` is a numpy type string, or ``dlpack:<code>:<bits>:<lanes>`` for a
    type numpy has not (bfloat16). ``get`` returns a read-only ndarray on the store's memory
    (the daemon copies the object to host memory), of dtype ``V<n>`` for the latter;
    ``get(..., device=k)`` a depot.DeviceArray.
``depot-py/1 pickle <n> <offset>:<length> ...``
    The data starts with a pickle (protocol 5) stream of ``<n>`` bytes; each following field
    locates one of its out-of-band buffers in the data, in order, each 64-byte aligned.
    ``get`` unpickles with those buffers as read-only views of the store's memory, so arrays
    inside come back without a copy.

Objects with any other metadata (written by depotctl or the C++ client) read back as
read-only ``memoryview``.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, List, NamedTuple, Optional, Tuple

from . import _device
from ._errors import InvalidArgument

MAGIC = b"depot-py/1 "
ALIGN = 64
BYTES_METADATA = MAGIC + b"bytes"

def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Encoded(NamedTuple):
    """A value as the parts of one object: each part is copied at its offset."""

    parts: List[Any]
    offsets: List[int]
    size: int
    metadata: bytes


class StridedArray(NamedTuple):
    """A numpy array that is not contiguous: copied straight into the object, in C order."""

    array: Any
    metadata: bytes


def _numpy():
    return sys.modules.get("numpy")


def _plain_dtype(dtype) -> bool:
    """Whether an array of this dtype is stored as raw elements (else it is pickled)."""
    return (
        not dtype.hasobject
        and dtype.fields is None
        and dtype.subdtype is None
        and dtype.itemsize > 0
    )


def array_metadata(dtype, order: str, shape: Tuple[int, ...]) -> bytes:
    return b"%sndarray %s %s %s" % (
        MAGIC,
        dtype.str.encode(),
        order.encode(),
        ",".join(str(d) for d in shape).encode(),
    )


def encode(value: Any):
    """Returns Encoded, StridedArray for a non-contiguous array, or for a GPU array the
    source _device.put_device takes (_device.DLPackSource, _device.InterfaceSource)."""
    if isinstance(value, (bytes, bytearray)):
        return Encoded([value], [0], len(value), BYTES_METADATA)
    if isinstance(value, memoryview):
        if not value.contiguous:
            value = memoryview(value.tobytes())
        return Encoded([value], [0], value.nbytes, BYTES_METADATA)
    np = _numpy()
    if np is not None and type(value) is np.ndarray and _plain_dtype(value.dtype):
        if value.flags.c_contiguous:
            order = "C"
        elif value.flags.f_contiguous:
            order = "F"
        else:
            return StridedArray(value, array_metadata(value.dtype, "C", value.shape))
        # A byte view: numpy cannot export some dtypes (datetime64) through the buffer protocol.
        raw = value.ravel(order="K").view(np.uint8)
        return Encoded([raw], [0], value.nbytes, array_metadata(value.dtype, order, value.shape))
    source = _device.classify(value)
    if source is not None:
        return source
    return _encode_pickle(value)


def _encode_pickle(value: Any) -> Encoded:
    buffers: List[memoryview] = []

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(pb.raw())
        except BufferError:  # not contiguous: pickle it in-band
            return True
        return False

    try:
        stream = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise InvalidArgument(
            f"cannot store a {type(value).__name__}: it cannot be pickled ({e})"
        ) from e
    parts: List[Any] = [stream]
    offsets = [0]
    fields = [b"%spickle %d" % (MAGIC, len(stream))]
    end = len(stream)
    for b in buffers:
        offset = _align(end)
        parts.append(b)
        offsets.append(offset)
        fields.append(b"%d:%d" % (offset, b.nbytes))
        end = offset + b.nbytes
    return Encoded(parts, offsets, end, b" ".join(fields))


def decode(buffer: Any) -> Any:
    """The value stored in a StoreBuffer, viewing its memory wherever the kind allows."""
    metadata: bytes = buffer.metadata
    if not metadata.startswith(MAGIC):
        return memoryview(buffer)
    fields = metadata.split(b" ")
    kind = fields[1]
    if kind == b"ndarray":
        return _decode_array(buffer, fields)
    if kind == b"pickle":
        return _decode_pickle(buffer, fields)
    if kind == _device.DEVARRAY:
        return _decode_devarray(buffer, fields)
    return memoryview(buffer)


def _decode_array(buffer: Any, fields: List[bytes]) -> Any:
    np = _numpy()
    if np is None:
        try:
            import numpy as np  # noqa: F811 - only needed for objects that hold arrays
        except ImportError as e:
            raise InvalidArgument("this object is a numpy array: install numpy to read it") from e
    dtype = np.dtype(fields[2].decode())
    shape = tuple(int(d) for d in fields[4].split(b",")) if fields[4] else ()
    count = buffer.size // dtype.itemsize
    flat = np.frombuffer(buffer, dtype=dtype, count=count)
    return flat.reshape(shape, order=fields[3].decode())


def _decode_devarray(buffer: Any, fields: List[bytes]) -> Any:
    _numpy_or_raise()
    dtype = _device.numpy_dtype(fields[2].decode())
    shape = tuple(int(d) for d in fields[3].split(b",")) if fields[3] else ()
    count = buffer.size // dtype.itemsize
    import numpy as np

    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def _numpy_or_raise() -> None:
    if _numpy() is None:
        try:
            import numpy  # noqa: F401 - only needed for objects that hold arrays
        except ImportError as e:
            raise InvalidArgument("this object is an array: install numpy to read it") from e


def _decode_pickle(buffer: Any, fields: List[bytes]) -> Any:
    view = memoryview(buffer)
    length = int(fields[2])
    buffers = []
    for f in fields[3:]:
        offset, n = f.split(b":")
        start = int(offset)
        buffers.append(view[start : start + int(n)])
    return pickle.loads(view[:length], buffers=buffers)


def parse_timeout(timeout: Optional[float]) -> int:
    """Seconds (None: for ever) as the milliseconds the C++ layer takes (-1: for ever)."""
    if timeout is None:
        return -1
    if timeout < 0:
        raise InvalidArgument(f"timeout must be None or >= 0 seconds, not {timeout}")
    ms = int(timeout * 1000)
    return ms + 1 if ms < timeout * 1000 else ms
