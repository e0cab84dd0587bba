"""Tasks as they travel: a Python call's arguments in a task's inputs and inline bytes, and
a function given by value stored once as an object. Client.submit encodes; depot.Worker
decodes and runs.

A call ``fn(a, ref, b)`` becomes a task whose inputs are the ObjectRefs among its positional
arguments, in order (the scheduler places the task by where their bytes are, and the worker
receives their values), and whose inline argument bytes are a pickle of the argument list
with each ref replaced by the index of its input. When that pickle is larger than
``INLINE_ARGS``, it is stored as an object of its own, the task's last input. A call whose
arguments are all refs has no argument bytes: the function gets its inputs' values in
order (so tasks submitted from C++ or depotctl run on Python workers too, and functions of
C++ workers get no bytes they cannot read). A function
given as a callable (not a name) is pickled (with cloudpickle when it is installed, so that
lambdas and closures travel) and stored once under a name derived from its bytes; the task
runs the worker's built-in ``CALL`` function with that object as its first input.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ._ref import ObjectRef

CALL = "depot.call"
"""The function every Python worker runs for callables sent by value."""

INLINE_ARGS = 32 << 10
"""Pickled arguments up to this many bytes travel in the task itself."""

# The first byte of a task's inline arguments: how the rest is to be read.
_ARGS_INLINE = b"P"  # a pickle of the argument list follows
_ARGS_STORED = b"O"  # the pickle is the task's last input


class Input:
    """Where an ObjectRef argument was: the index of the task input that replaces it."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):
        return (Input, (self.index,))


def _dumps(
    value: Any,
    plain: Optional[Callable[[io.BytesIO], pickle.Pickler]] = None,
    by_value: Optional[Callable[[io.BytesIO], pickle.Pickler]] = None,
) -> bytes:
    """``value`` pickled: by pickle when it can (fast, and what most arguments need), else by
    cloudpickle (lambdas, closures, functions of __main__). ``plain`` and ``by_value`` make
    the picklers to use instead (of the buffer they write), pickle's and cloudpickle's
    subclasses."""
    try:
        data = _pickled(value, plain) if plain else pickle.dumps(value, protocol=5)
        # What pickle names in __main__ a worker cannot import: that goes by value.
        if b"__main__" not in data:
            return data
    except (pickle.PicklingError, AttributeError, TypeError):
        pass  # a lambda, a closure, a local class...
    return _pickled(value, by_value) if by_value else _dumps_function(value)


def _pickled(value: Any, pickler: Callable[[io.BytesIO], pickle.Pickler]) -> bytes:
    out = io.BytesIO()
    pickler(out).dump(value)
    return out.getvalue()


def _dumps_function(fn: Callable) -> bytes:
    """A function by value where it must be (cloudpickle pickles lambdas, closures and
    functions of __main__ by value, module functions by name)."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(fn, protocol=5)
    return cloudpickle.dumps(fn, protocol=5)


def new_bound(bytes_: int) -> Tuple[int, int]:
    """A memory bound of its own for a group of tasks (TaskSpec.boundId, boundBytes): a
    random id above 0 (a submitter's bounds are its own) and ``bytes_``."""
    from . import _depot

    return int.from_bytes(_depot.random_id()[:8], "little") | 1, bytes_


def function_name(fn: Any) -> Optional[str]:
    """The registered name a task runs for ``fn``, or None for a callable sent by value."""
    if isinstance(fn, str):
        if not fn:
            raise ValueError("a function name is not empty")
        return fn
    if not callable(fn):
        raise TypeError(f"submit takes a function name or a callable, not {type(fn).__name__}")
    return None


def pickled_function(fn: Callable) -> Tuple[str, bytes]:
    """The name a callable is stored under (from its pickled bytes) and those bytes."""
    data = _dumps_function(fn)
    return "depot.function/" + hashlib.blake2b(data, digest_size=16).hexdigest(), data


def encode_args(args: Sequence[Any]) -> Tuple[List[ObjectRef], Optional[bytes]]:
    """The inputs of a call with ``args`` (its ObjectRefs), and the pickled argument list
    with each ref replaced by its Input, or None if every argument is a ref."""
    inputs: List[ObjectRef] = []
    template: List[Any] = []
    for a in args:
        if isinstance(a, ObjectRef):
            template.append(Input(len(inputs)))
            inputs.append(a)
        else:
            template.append(a)
    if len(inputs) == len(template):
        return inputs, None
    return inputs, _dumps(template)


def inline_args(pickled: Optional[bytes]) -> Tuple[bytes, bool]:
    """The task's inline argument bytes for ``pickled`` (see encode_args), and whether the
    pickle must be stored as the task's last input instead."""
    if pickled is None:
        return b"", False
    if len(pickled) <= INLINE_ARGS:
        return _ARGS_INLINE + pickled, False
    return _ARGS_STORED, True


def args_stored(args: bytes) -> bool:
    """Whether a task's arguments are stored as an object, its last input."""
    return args[:1] == _ARGS_STORED


def decode_args(args: bytes, values: Sequence[Any]) -> List[Any]:
    """The argument list of a task, given its inline bytes and its inputs' values (those of
    its data; the stored pickle of its arguments last, if there is one)."""
    if not args:
        return list(values)
    kind, rest = args[:1], args[1:]
    if kind == _ARGS_INLINE:
        template = pickle.loads(rest)
    elif kind == _ARGS_STORED:
        template = pickle.loads(values[-1])
    else:
        raise ValueError("these task arguments were not made by depot's Python client")
    return [values[a.index] if isinstance(a, Input) else a for a in template]
