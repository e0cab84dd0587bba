"""ObjectRef: the name of an object, to pass between processes."""

from __future__ import annotations

from typing import Optional

from . import _depot


class ObjectRef:
    """A reference to an object in the store: its 16-byte id, and the name it was made from.

    Cheap, immutable, hashable (by id) and picklable, so it can be sent to other processes
    and Dask tasks, which read the object with ``Client.get(ref)``. It does not keep the
    object alive: the store may evict it unless it was put with ``pin=True`` or someone holds
    it.
    """

    __slots__ = ("_id", "_name")

    def __init__(self, id: bytes, name: Optional[str] = None) -> None:
        if not isinstance(id, bytes) or len(id) != 16:
            raise ValueError("an object id is 16 bytes")
        self._id = id
        self._name = name

    @classmethod
    def from_name(cls, name: str) -> "ObjectRef":
        """The reference of the object named ``name`` (its id is XXH3-128 of the name)."""
        return cls(_depot.id_from_name(name), name)

    @classmethod
    def from_hex(cls, hex: str) -> "ObjectRef":
        """The reference of the id ``hex`` (32 hex digits, as depotctl prints them)."""
        return cls(_depot.id_from_hex(hex))

    @property
    def id(self) -> bytes:
        """The 16-byte id."""
        return self._id

    @property
    def name(self) -> Optional[str]:
        """The name the id was made from, if known."""
        return self._name

    @property
    def hex(self) -> str:
        """The id as 32 hex digits, as depotctl shows it."""
        return _depot.id_hex(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __reduce__(self):
        return (ObjectRef, (self._id, self._name))

    def __repr__(self) -> str:
        if self._name is not None:
            return f"ObjectRef({self.hex}, name={self._name!r})"
        return f"ObjectRef({self.hex})"
