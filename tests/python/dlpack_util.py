"""DLPack with ctypes, for tests without a GPU library: the DLPack structs, a producer that
exports host memory while claiming to be on a CUDA device (for daemons with simulated GPUs,
whose "device pointers" are host addresses), and a consumer that takes a capsule over.
"""

import ctypes

import numpy as np

KDL_CUDA = 2
FLAG_READ_ONLY = 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLManagedTensorVersioned(ctypes.Structure):
    pass


Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
VersionedDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))

DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", Deleter),
]
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", VersionedDeleter),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

# Capsule names: the capsule keeps a pointer to its name, so these must live for ever.
NAME = b"dltensor"
USED_NAME = b"used_dltensor"
VERSIONED_NAME = b"dltensor_versioned"
USED_VERSIONED_NAME = b"used_dltensor_versioned"

_api = ctypes.pythonapi
CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CapsuleDestructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))

_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


def dlpack_dtype(dtype):
    dtype = np.dtype(dtype)
    return _DTYPE_CODES[dtype.kind], dtype.itemsize * 8, 1


class FakeCudaArray:
    """A DLPack producer over a numpy array's memory that says it is on CUDA device
    `device_id`. Records what its consumer did: the stream it passed, whether it asked for a
    versioned capsule, and how many times the deleter ran.

    `versioned=False` makes an old producer (no max_version argument); `strides` (in
    elements) overrides the array's own; `dtype` overrides (code, bits, lanes).
    """

    def __init__(self, array, device_id=0, *, versioned=True, strides=None, dtype=None,
                 device_type=KDL_CUDA):
        self.array = array
        self.device_id = device_id
        self.device_type = device_type
        self.versioned = versioned
        self.strides = strides
        self.dtype = dtype or dlpack_dtype(array.dtype)
        self.streams = []
        self.versioned_exports = 0
        self.deleted = 0
        self._alive = {}  # address of a managed tensor -> what it points to
        self._destructors = []

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None, **kwargs):
        if not self.versioned and kwargs:
            raise TypeError(f"__dlpack__() got unexpected keyword arguments {list(kwargs)}")
        self.streams.append(stream)
        max_version = kwargs.get("max_version")
        versioned = max_version is not None and max_version[0] >= 1
        shape = (ctypes.c_int64 * max(self.array.ndim, 1))(*self.array.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * len(self.strides))(*self.strides)
        tensor = DLTensor(
            data=self.array.ctypes.data,
            device=DLDevice(self.device_type, self.device_id),
            ndim=self.array.ndim,
            dtype=DLDataType(*self.dtype),
            shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
            strides=ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides else None,
            byte_offset=0,
        )
        if versioned:
            self.versioned_exports += 1
            managed = DLManagedTensorVersioned(
                version=DLPackVersion(1, 0), manager_ctx=None, deleter=self._versioned_deleter,
                flags=0, dl_tensor=tensor)
            name = VERSIONED_NAME
        else:
            managed = DLManagedTensor(dl_tensor=tensor, manager_ctx=None, deleter=self._deleter)
            name = NAME
        address = ctypes.addressof(managed)
        self._alive[address] = (managed, shape, strides)
        kind = DLManagedTensorVersioned if versioned else DLManagedTensor

        def destructor(capsule):
            # Still under its unused name: nobody took it over, so it is ours to delete.
            if _raw_is_valid(capsule, name):
                pointer = _raw_get_pointer(capsule, name)
                m = ctypes.cast(pointer, ctypes.POINTER(kind))
                m.contents.deleter(m)

        callback = CapsuleDestructor(destructor)
        self._destructors.append(callback)
        return _api.PyCapsule_New(address, name, callback)

    def _delete(self, pointer):
        self.deleted += 1
        self._alive.pop(ctypes.addressof(pointer.contents), None)

    @property
    def _deleter(self):
        if not hasattr(self, "_deleter_cb"):
            self._deleter_cb = Deleter(self._delete)
        return self._deleter_cb

    @property
    def _versioned_deleter(self):
        if not hasattr(self, "_versioned_deleter_cb"):
            self._versioned_deleter_cb = VersionedDeleter(self._delete)
        return self._versioned_deleter_cb


class Consumed:
    """A capsule taken over by a consumer (renamed used_...): `managed` is the struct,
    `tensor` its DLTensor; `release()` calls the producer's deleter."""

    def __init__(self, capsule):
        if _api.PyCapsule_IsValid(capsule, VERSIONED_NAME):
            self.versioned = True
            pointer = _api.PyCapsule_GetPointer(capsule, VERSIONED_NAME)
            _api.PyCapsule_SetName(capsule, USED_VERSIONED_NAME)
            self.pointer = ctypes.cast(pointer, ctypes.POINTER(DLManagedTensorVersioned))
        elif _api.PyCapsule_IsValid(capsule, NAME):
            self.versioned = False
            pointer = _api.PyCapsule_GetPointer(capsule, NAME)
            _api.PyCapsule_SetName(capsule, USED_NAME)
            self.pointer = ctypes.cast(pointer, ctypes.POINTER(DLManagedTensor))
        else:
            raise ValueError("not an unused DLPack capsule")
        self.managed = self.pointer.contents
        self.tensor = self.managed.dl_tensor

    @property
    def shape(self):
        return tuple(self.tensor.shape[i] for i in range(self.tensor.ndim))

    @property
    def strides(self):
        if not self.tensor.strides:
            return None
        return tuple(self.tensor.strides[i] for i in range(self.tensor.ndim))

    @property
    def dtype(self):
        d = self.tensor.dtype
        return d.code, d.bits, d.lanes

    def release(self):
        self.managed.deleter(self.pointer)


def host_view(ptr, nbytes, dtype, shape):
    """A numpy array over `nbytes` at host address `ptr` (a simulated GPU's memory)."""
    raw = (ctypes.c_char * nbytes).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


class FakeInterfaceArray:
    """A __cuda_array_interface__ (v3) producer over a numpy array's host memory."""

    def __init__(self, array, strides=None, stream=None):
        self.array = array
        self.strides = strides
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.array.shape,
            "typestr": self.array.dtype.str,
            "data": (self.array.ctypes.data, False),
            "version": 3,
            "strides": self.strides,
            "stream": self.stream,
        }
