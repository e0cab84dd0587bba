"""The queues, pipes and processes of depot.multiprocessing's contexts.

They are the standard module's, except that what they send is marked as depot's
(``_reductions.Sending``), so that arrays and tensors in it go through the store. Nothing
else is: the standard module's own queues, torch.multiprocessing's and other libraries'
pickle as they always do.

- ``Queue``, ``JoinableQueue``, ``SimpleQueue``: ``put`` marks the value. A SimpleQueue's
  ends are this module's connections too, since a Pool sends tasks on its writer directly.
- ``Pipe``: connections whose ``send`` marks the value. They stay this module's in the
  process they are sent to (a reducer of their own).
- Processes: ``start`` joins the store's group first, so that what the child sends outlives
  it; a spawned or forkserver child's process object (its target's arguments) is sent
  marked.
"""

from __future__ import annotations

from multiprocessing import connection, context, queues
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, Tuple

from . import _store
from ._reductions import Sending


def _send(send: Any, obj: Any) -> None:
    """``send(Sending(obj))``; a value that fails to pickle is let go at once."""
    sending = Sending(obj)
    try:
        send(sending)
    except BaseException:
        sending.release()
        raise


def _on_feeder_error(e: Exception, obj: Any) -> None:
    """A Queue's feeder thread failed to pickle ``obj``: let it go now (it stays bound in the
    feeder until the next item), then report as the standard module does."""
    if type(obj) is Sending:
        obj.release()
    queues.Queue._on_queue_feeder_error(e, obj)  # type: ignore[attr-defined]


class Connection(connection.Connection):
    def send(self, obj: Any) -> None:
        _send(super().send, obj)


def _own(conn: Any) -> Any:
    """A standard connection as this module's (same descriptor, same state)."""
    conn.__class__ = Connection
    return conn


def Pipe(duplex: bool = True) -> Tuple[Connection, Connection]:
    a, b = connection.Pipe(duplex)
    return _own(a), _own(b)


def _reduce_connection(conn: Connection) -> Any:
    _, args = connection.reduce_connection(conn)  # type: ignore[attr-defined]
    return _rebuild_connection, args


def _rebuild_connection(*args: Any) -> Connection:
    return _own(connection.rebuild_connection(*args))  # type: ignore[attr-defined]


ForkingPickler.register(Connection, _reduce_connection)


class Queue(queues.Queue):
    _on_queue_feeder_error = staticmethod(_on_feeder_error)

    def put(self, obj: Any, block: bool = True, timeout: Any = None) -> None:
        super().put(Sending(obj), block, timeout)


class JoinableQueue(queues.JoinableQueue):
    _on_queue_feeder_error = staticmethod(_on_feeder_error)

    def put(self, obj: Any, block: bool = True, timeout: Any = None) -> None:
        super().put(Sending(obj), block, timeout)


class SimpleQueue(queues.SimpleQueue):
    def __init__(self, *, ctx: Any) -> None:
        super().__init__(ctx=ctx)
        _own(self._reader)  # type: ignore[attr-defined]
        _own(self._writer)  # type: ignore[attr-defined]

    def put(self, obj: Any) -> None:
        _send(super().put, obj)


class SendsThroughStore:
    """A process class of depot.multiprocessing's (mixed into the standard ones)."""

    def start(self) -> None:
        _store.prepare_children()
        super().start()  # type: ignore[misc]

    def __getstate__(self) -> Any:
        return Sending(dict(self.__dict__))

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)


class ForkProcess(SendsThroughStore, context.ForkProcess):
    pass


class SpawnProcess(SendsThroughStore, context.SpawnProcess):
    pass


class ForkServerProcess(SendsThroughStore, context.ForkServerProcess):
    pass


class Channels:
    """A context's channels (mixed into depot.multiprocessing's contexts)."""

    def Pipe(self, duplex: bool = True) -> Tuple[Connection, Connection]:
        return Pipe(duplex)

    def Queue(self, maxsize: int = 0) -> Queue:
        return Queue(maxsize, ctx=self.get_context())  # type: ignore[attr-defined]

    def JoinableQueue(self, maxsize: int = 0) -> JoinableQueue:
        return JoinableQueue(maxsize, ctx=self.get_context())  # type: ignore[attr-defined]

    def SimpleQueue(self) -> SimpleQueue:
        return SimpleQueue(ctx=self.get_context())  # type: ignore[attr-defined]
