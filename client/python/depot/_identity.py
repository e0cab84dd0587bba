"""ByIdentity: entries for live Python objects, found by the object itself.

depot.dask and depot.multiprocessing both remember what they stored for a value (a numpy
array, a tensor) while that value lives, and must find it again from the value alone: such
values are not hashable, and two equal arrays are different values.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Tuple


class ByIdentity:
    """Entries for live objects, keyed by the object's identity (which need not be hashable)
    and dropped when it is collected. Thread-safe."""

    def __init__(self) -> None:
        # Reentrant: a weakref callback may run in a garbage collection inside put(). An
        # entry removed is let go after the lock is released, as collecting what it holds may
        # run another ByIdentity's callbacks, which take that one's lock.
        self._lock = threading.RLock()
        self._entries: Dict[int, Tuple[Any, Any]] = {}  # id(value) -> (weakref, entry)

    def get(self, value: Any) -> Any:
        """The entry for ``value``, or None."""
        found = self._entries.get(id(value))
        if found is None or found[0]() is not value:
            return None
        return found[1]

    def put(self, value: Any, entry: Any) -> bool:
        """Adds an entry, or replaces the one ``value`` had. Returns False, adding nothing,
        for a value that takes no weak references (an int, a tuple)."""
        key = id(value)

        def forget(dead: Any) -> None:
            with self._lock:
                found = self._entries.get(key)
                if found is not None and found[0] is dead:
                    del self._entries[key]

        try:
            ref = weakref.ref(value, forget)
        except TypeError:
            return False
        with self._lock:
            replaced = self._entries.get(key)
            self._entries[key] = (ref, entry)
        del replaced  # what an entry holds goes out of the lock (its collection may take others')
        return True

    def discard(self, value: Any) -> None:
        """Drops ``value``'s entry, if it has one."""
        with self._lock:
            found = self._entries.get(id(value))
            if found is not None and found[0]() is value:
                del self._entries[id(value)]

    def take_all(self) -> Dict[int, Tuple[Any, Any]]:
        """Drops every entry, returning them (by id, with their weak references): what a
        forked child does with its parent's, which it must keep but never finds again. The
        lock is new, as another thread of the parent may have held it at the fork."""
        self._lock = threading.RLock()
        entries, self._entries = self._entries, {}
        return entries
