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
    locates one of its out-of-band buffers in the data, in order, each 64-byte aligned. Two
    fields locate the same bytes where the value held the same memory twice (pandas pickles
    a Series' index twice). ``get`` unpickles with those buffers as read-only views of the
    store's memory, so arrays inside come back without a copy. (numpy pickles arrays of
    datetimes or timedeltas, and arrays that are not contiguous, in the stream: the writer
    pickles the first as int64 views, the others as contiguous copies, out of band, and the
    call, ``depot._codec._retyped``, that makes each the array it was: a reader whose depot
    predates it cannot unpickle such an object.)

Objects with any other metadata (written by depotctl or the C++ client) read back as
read-only ``memoryview``.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import re
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import _device
from ._errors import InvalidArgument

MAGIC = b"depot-py/1 "
ALIGN = 64
BYTES_METADATA = MAGIC + b"bytes"

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(size: Any) -> int:
    """A size above 0 as depotd reads one: bytes, or a number with K, M, G or T (optionally
    followed by i and B, any case; powers of 1024): ``"512MiB"``, ``"1.5 GiB"``."""
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size < 1 << 64:
        return size
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(I?B?)\s*", size, re.IGNORECASE) if (
        isinstance(size, str)) else None
    if found and (found[2] or found[3].upper() in ("", "B")):
        value = int(float(found[1]) * _UNITS[found[2].upper()])
        if 0 < value < 1 << 64:
            return value
    raise InvalidArgument(f"a size is a number of bytes above 0, or such as '2GiB', not {size!r}")


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


class _Pickler(pickle.Pickler):
    """Protocol 5, with every array of plain elements out of band, which numpy would pickle
    in the stream (a reader would unpickle a private copy): an array of datetimes or
    timedeltas goes as its int64 view, one that is not contiguous as a contiguous copy. Only
    ``np.ndarray`` gets a reducer of its own (the dispatch table, which pickle consults by
    exact type): other objects pickle as they would, at no cost."""

    def __init__(self, file: Any, buffer_callback: Any) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        np = _numpy()
        if np is not None:
            self.dispatch_table = {**copyreg.dispatch_table, np.ndarray: _reduce_array}


def _reduce_array(array: Any) -> Any:
    np = _numpy()
    if _plain_dtype(array.dtype):
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            return _retyped, (np.ascontiguousarray(array), array.dtype)
        if array.dtype.kind in "mM":
            return _retyped, (array.view(array.dtype.byteorder + "i8"), array.dtype)
    return array.__reduce_ex__(5)


def _retyped(array: Any, dtype: Any) -> Any:
    """What _Pickler pickles an array as: a view of the array it stored instead."""
    return array.view(dtype)


def _address(buffer: memoryview) -> Optional[int]:
    """Where a non-empty buffer's bytes start, if numpy (which exports nearly every buffer
    pickled out of band) can say."""
    np = _numpy()
    if np is None or buffer.nbytes == 0:
        return None
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


def _encode_pickle(value: Any) -> Encoded:
    buffers: List[memoryview] = []  # the distinct out-of-band buffers, as first met
    order: List[int] = []  # each out-of-band buffer of the stream, as its index in buffers
    # Memory the value holds twice is stored once. Each buffer stays referenced (buffers)
    # until the value is written, so no two of them can be at one address in turn.
    index_of: Dict[Tuple[int, int], int] = {}

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        try:
            raw = pb.raw()
        except BufferError:  # not contiguous: pickle it in-band
            return True
        address = _address(raw)
        index = None if address is None else index_of.get((address, raw.nbytes))
        if index is None:
            index = len(buffers)
            buffers.append(raw)
            if address is not None:
                index_of[(address, raw.nbytes)] = index
        order.append(index)
        return False

    out = io.BytesIO()
    try:
        _Pickler(out, out_of_band).dump(value)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise InvalidArgument(
            f"cannot store a {type(value).__name__}: it cannot be pickled ({e})"
        ) from e
    stream = out.getvalue()
    parts: List[Any] = [stream]
    offsets = [0]
    located = []
    end = len(stream)
    for b in buffers:
        offset = _align(end)
        parts.append(b)
        offsets.append(offset)
        located.append(b"%d:%d" % (offset, b.nbytes))
        end = offset + b.nbytes
    fields = [b"%spickle %d" % (MAGIC, len(stream))] + [located[i] for i in order]
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
