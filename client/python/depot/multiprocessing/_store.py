"""The store a process tree of depot.multiprocessing shares, and this process's client of it.

Every process of the tree joins one group (depot.Client's ``group``): a value one process
sends is handed off to the group, so that it outlives its sender, and the process that
unpickles it claims it. The group's key (16 random bytes) and the daemon's socket pass from
parent to child in the environment, which every start method hands down:

- ``DEPOT_MP_GROUP``: the key, in hex, made when the tree's first process imports
  depot.multiprocessing.
- ``DEPOT_MP_SOCKET``: the daemon, if the first process started a private one; else the
  daemon is ``DEPOT_SOCKET``'s. Only the first process starts a private daemon (of
  ``DEPOT_MP_MEMORY``, default half of RAM, claimed only as objects need it), which stops
  when that process exits, even if it is killed (``depotd --exit-with-pid``).

Before a process starts a child through depot.multiprocessing (its processes' ``start``;
with ``enable_everywhere()``, every ``BaseProcess.start``), it joins the group, so that what
the child sends outlives the child. A process that cannot reach the daemon sends its values
pickled, as the standard module does, and says why once.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from multiprocessing import process, util
from typing import Optional

from .._client import Client
from .._daemon import Daemon, start_daemon
from .._errors import DepotError

GROUP_ENV = "DEPOT_MP_GROUP"
PRIVATE_SOCKET_ENV = "DEPOT_MP_SOCKET"
SOCKET_ENV = "DEPOT_SOCKET"
MEMORY_ENV = "DEPOT_MP_MEMORY"


# How long a DataLoader worker's unclaimed batches outlive it (Client's handoff_grace). A
# worker ends when its loader is done with it: after the last batch of an epoch was received,
# or when the loop was left early (a break, the loader collected), when the batches it
# prefetched will never be; or it was killed, and the loader fails. Seconds are plenty for
# what was on its way.
DATALOADER_GRACE = 10.0


def in_dataloader_worker() -> bool:
    """Whether this process is a torch DataLoader's worker (torch imported, worker info set)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


class StoreUnavailableWarning(RuntimeWarning):
    """depot.multiprocessing could not use the store: values are pickled instead."""


_lock = threading.RLock()
_client: Optional[Client] = None
_daemon: Optional[Daemon] = None  # the private daemon this process started, if any
_unavailable: Optional[str] = None  # why this process cannot use the store
_warned: set = set()


def warn_once(key: str, message: str) -> None:
    """A StoreUnavailableWarning, once per process for each ``key``."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, StoreUnavailableWarning, stacklevel=3)


def _inherited_key() -> Optional[bytes]:
    try:
        key = bytes.fromhex(os.environ.get(GROUP_ENV, ""))
    except ValueError:
        return None
    return key if len(key) == 16 else None


# The tree's group key: inherited, or made here by the tree's first process, which alone may
# start a private daemon.
_inherited_group = _inherited_key()
_first = _inherited_group is None
_key = os.urandom(16) if _inherited_group is None else _inherited_group
if _first:
    os.environ[GROUP_ENV] = _key.hex()


def group_key() -> bytes:
    return _key


def _start_private() -> str:
    """Starts this tree's private daemon; returns its socket."""
    global _daemon
    if util._exiting:  # type: ignore[attr-defined]  # multiprocessing's flag, set at exit
        raise DepotError("the process is exiting: no private depot daemon is started now")
    memory = os.environ.get(MEMORY_ENV, "50%")
    # Pages allocated as objects use them (--no-prefault), not 64 MiB ahead in each segment
    # (and one more kept ready): the tree's own processes need that memory more.
    daemon = start_daemon(memory=memory, prefault=False, log_level="warn", stop_with_parent=True)
    # Stopped after multiprocessing has joined the children at exit (finalizers of negative
    # priority run after that), not by the Daemon's own exit hook, which could run first.
    daemon._finalizer.atexit = False
    util.Finalize(None, _stop_private, args=(daemon, os.getpid()), exitpriority=-100)
    _daemon = daemon
    os.environ[PRIVATE_SOCKET_ENV] = daemon.socket
    return daemon.socket


def _stop_private(daemon: Daemon, owner: int) -> None:
    if os.getpid() != owner:  # a child forked without multiprocessing's clean-up
        return
    # The Daemon's own finalizer, taken over: at interpreter exit, weakref.finalize no longer
    # runs one that is called.
    detached = daemon._finalizer.detach()
    if detached is not None:
        _, stop, args, kwargs = detached
        stop(*args, **kwargs)


def _socket() -> str:
    socket = os.environ.get(PRIVATE_SOCKET_ENV) or os.environ.get(SOCKET_ENV)
    if socket:
        return socket
    if not _first:
        raise DepotError(
            "this process's tree has no depot daemon: its first process could not start one, "
            f"and {SOCKET_ENV} is not set"
        )
    return _start_private()


def client() -> Optional[Client]:
    """This process's client of the tree's store, connected on first use; None (having
    warned once) if the store cannot be reached."""
    global _client, _unavailable
    current = _client
    if current is not None:
        return current
    with _lock:
        if _client is not None:
            return _client
        if _unavailable is not None:
            return None
        try:
            # A DataLoader's worker: what it sends and nobody claims goes back a little after
            # it has gone (its loader was left early, or it was killed), not with the tree.
            grace = DATALOADER_GRACE if in_dataloader_worker() else None
            _client = Client(
                _socket(), name="depot.multiprocessing", group=_key, handoff_grace=grace
            )
        except (DepotError, OSError) as e:
            _unavailable = str(e)
            warn_once(
                "unavailable",
                f"depot.multiprocessing cannot use the depot store ({e}); values are pickled "
                "and copied as by the standard multiprocessing module",
            )
            return None
        return _client


def unavailable() -> Optional[str]:
    return _unavailable


def prepare_children() -> None:
    """Before a child process starts: this process has joined the group (and the daemon is
    in the environment), so that whatever the child sends outlives it."""
    client()


def _wrap_start(start):
    @functools.wraps(start)
    def wrapped(self, *args, **kwargs):
        prepare_children()
        return start(self, *args, **kwargs)

    wrapped._depot_prepares = True
    return wrapped


def prepare_every_child() -> None:
    """Every child's start prepares it, whatever its context (enable_everywhere: the
    standard class's method, replaced on purpose)."""
    if not getattr(process.BaseProcess.start, "_depot_prepares", False):
        process.BaseProcess.start = _wrap_start(  # type: ignore[method-assign]
            process.BaseProcess.start
        )


_inherited: list = []


def _forget_after_fork() -> None:
    """In a forked child: the parent's client and daemon are not this process's. The
    parent's client is kept, never used nor closed here (its socket is the parent's
    session)."""
    global _client, _daemon, _lock, _first
    _lock = threading.RLock()
    _first = False
    if _client is not None:
        _inherited.append(_client)
    if _daemon is not None:
        _daemon._finalizer.detach()  # the parent's to stop
    _client = None
    _daemon = None


os.register_at_fork(after_in_child=_forget_after_fork)
