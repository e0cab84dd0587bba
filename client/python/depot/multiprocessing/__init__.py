"""depot.multiprocessing: the standard multiprocessing, passing arrays through the store.

A drop-in for ``multiprocessing``: it exports everything the standard module does
(``Process``, ``Queue``, ``SimpleQueue``, ``Pipe``, ``Pool``, ``get_context``, ...). Numpy
arrays, PyTorch tensors (CPU and CUDA), Paddle CPU tensors and CuPy arrays of at least the
threshold
(:func:`set_threshold`, 64 KiB by default), alone or inside anything else sent, go through
the host's depotd instead of through a pipe: the sender copies the value into shared memory
once (a GPU value into the store's pool on its GPU), and the receiver maps the same memory,
with no copy and no pickling of the bytes.

    import depot.multiprocessing as mp
    import numpy as np

    def work(q):
        q.put(np.ones((4096, 4096)))       # 128 MiB: into the store once

    if __name__ == "__main__":
        q = mp.Queue()
        p = mp.Process(target=work, args=(q,))
        p.start()
        a = q.get()                        # read-only, viewing the store: no copy
        p.join()

How long a value lives:

- The sender may drop the value, or exit, once it has sent it: the tree's group (see
  depot.Client.handoff) holds it until a receiver unpickles it.
- A received array or CPU tensor is writable, and private to its receiver: it views a
  copy-on-write mapping of the store's pages, so reading it copies nothing, and writing it
  copies the pages written into the receiver's own memory. The sender's value, the store's
  object and other receivers' values never change. The object goes from the store when the
  receiver's last view of it is gone. (A CUDA tensor or CuPy array views the store's GPU
  memory itself: clone it before writing.)
- Values sent but never received (a queue dropped with items in it, a receiver killed before
  taking them) go when the last process of the tree has exited, or once they have waited
  their ttl (``set_handoff_ttl``). A DataLoader worker's batches wait while it lives and go
  10 seconds after it has exited, so that a loader left early, by a break, a killed worker
  or being collected, leaves nothing behind while the program goes on. A killed process
  gives back everything it held.
- The sender's stored copy stays while the sender's own value lives: the same value sent
  again, unchanged, is not copied again (a Pool broadcasting an argument stores it once).

The store is the depotd at ``$DEPOT_SOCKET``, or one this module starts for the process tree
(``$DEPOT_MP_MEMORY`` big, default half of RAM, used only as objects need it), stopped when
the process that started it exits, even if killed. Without a store, or when it is full,
values are pickled as by the standard module, with one warning
(:class:`StoreUnavailableWarning`).

Every start method works (fork, spawn, forkserver): ``get_context("spawn")``, or
``torch.utils.data.DataLoader(...,
multiprocessing_context=depot.multiprocessing.get_context("spawn"))``. Only what goes
through this module's own queues, pipes, pools and processes goes through the store:
importing it changes nothing that the standard module, torch.multiprocessing or another
library sends. ``enable_everywhere()`` opts in to more: everything multiprocessing sends in
the process tree, through any context (concurrent.futures' queues included). CPU tensors in
torch's shared memory (``share_memory_()``, as for Hogwild training) are left to torch, so
that they stay shared.

torch.multiprocessing's functions are here too: ``set_sharing_strategy``,
``get_sharing_strategy`` and ``get_all_sharing_strategies``, with depot's strategy
(``"depot"``, the default: tensors through the store) beside torch's, which leave tensors
to torch's own reducer. A program written for torch.multiprocessing's queues, pipes, pools,
processes and sharing strategies runs with its import changed; torch's ``spawn`` and
``start_processes`` are not here (they start processes of the standard module's contexts).
"""

from __future__ import annotations

import multiprocessing as _mp
import multiprocessing.context as _context
import multiprocessing.process as _process
from typing import Dict

from . import _channels, _reductions, _store
from ._reductions import (
    get_all_sharing_strategies,
    get_handoff_ttl,
    get_sharing_strategy,
    get_threshold,
    set_handoff_ttl,
    set_sharing_strategy,
    set_threshold,
)
from ._store import StoreUnavailableWarning

_reductions.install()


def enable_everywhere() -> None:
    """Sends arrays and tensors through the store from everything multiprocessing sends, not
    only from this module's queues, pipes and processes: the standard module's contexts,
    torch.multiprocessing's and concurrent.futures' too, in this process and the children it
    starts after. Every process then joins the store's group before it starts a child."""
    _reductions.enable_everywhere()
    _store.prepare_every_child()


if _reductions.everywhere():  # inherited from the parent that enabled it
    _store.prepare_every_child()


def store():
    """This process's depot.Client of the tree's store (connected on first use), or None
    if the store cannot be reached. Objects it sees include values in flight."""
    return _store.client()


# This module's contexts, so that its get_context and set_start_method are its own, and
# its queues, pipes and processes send through the store (_channels).


class Process(_channels.SendsThroughStore, _process.BaseProcess):
    _start_method = None

    @staticmethod
    def _Popen(process_obj):
        return _default_context.get_context().Process._Popen(process_obj)

    @staticmethod
    def _after_fork():
        return _default_context.get_context().Process._after_fork()


class _Concrete:
    """get_context(method) of a concrete context: this module's contexts, too."""

    def get_context(self, method=None):
        return self if method is None else _concrete(method)


class ForkContext(_Concrete, _channels.Channels, _context.ForkContext):
    Process = _channels.ForkProcess


class SpawnContext(_Concrete, _channels.Channels, _context.SpawnContext):
    Process = _channels.SpawnProcess


class ForkServerContext(_Concrete, _channels.Channels, _context.ForkServerContext):
    Process = _channels.ForkServerProcess


_concrete_contexts: Dict[str, _context.BaseContext] = {
    "fork": ForkContext(),
    "spawn": SpawnContext(),
    "forkserver": ForkServerContext(),
}


def _concrete(method):
    try:
        ctx = _concrete_contexts[method]
    except KeyError:
        raise ValueError(f"cannot find context for {method!r}") from None
    ctx._check_available()
    return ctx


class DefaultContext(_channels.Channels, _context.DefaultContext):
    # This module's Process, which starts as the chosen context's does (typeshed has the
    # standard one here, not a BaseProcess).
    Process = Process  # type: ignore[assignment]

    def get_context(self, method=None):
        if method is None:
            if self._actual_context is None:
                self._actual_context = self._default_context
            return self._actual_context
        return _concrete(method)


# The standard module's start method: the one set already, else its default (fork on Linux
# up to Python 3.13). Read without fixing it, so that set_start_method still works there.
_standard = _context._default_context
# Attributes of the standard module's own, which typeshed does not list.
_chosen = _standard._actual_context or _standard._default_context  # type: ignore[attr-defined]
_default_context = DefaultContext(_concrete_contexts[_chosen._name])

__all__ = [x for x in dir(_default_context) if not x.startswith("_")]
globals().update((name, getattr(_default_context, name)) for name in __all__)
__all__ += [
    "Process",
    "StoreUnavailableWarning",
    "enable_everywhere",
    "get_all_sharing_strategies",
    "get_handoff_ttl",
    "get_sharing_strategy",
    "get_threshold",
    "set_handoff_ttl",
    "set_sharing_strategy",
    "set_threshold",
    "store",
]
# The standard module's other names (SUBDEBUG, SUBWARNING, ...), and its submodules.
for _name in dir(_mp):
    if not _name.startswith("_") and _name not in globals():
        globals()[_name] = getattr(_mp, _name)
        __all__.append(_name)
del _name
