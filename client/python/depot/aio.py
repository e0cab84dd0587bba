"""depot from asyncio: gets, waits and task results awaited on an event loop, never blocking it.

    import asyncio, depot, depot.aio

    async def main(socket):
        async with depot.aio.AsyncClient(socket) as client:
            ref = await client.put(b"hello")
            print(await client.get(ref, timeout=10))
            done, not_done = await client.wait(refs, return_when="FIRST_COMPLETED")

Each awaited get or wait is one request, which the daemon answers when its objects are
sealed or its time is up. The loop learns of answers through two descriptors it watches
(the client's socket, and an eventfd the client signals when an answer is in, whichever
thread read it), so a thousand awaits cost a thousand waiting requests in the daemon and
no thread here. Cancelling an awaiting task (``asyncio.wait_for``, a TaskGroup, Ctrl-C in
``asyncio.run``) cancels its request in the daemon, and what it was granted is given back.

Values come back as :meth:`depot.Client.get` returns them: arrays view the store's memory.
Puts copy the value into shared memory, which takes as long as its bytes: they run in a
worker thread (``asyncio.to_thread``), as do submits, so the loop goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from typing import Any, Deque, Dict, Iterable, List, Optional, Tuple, Union

from . import _codec, _device
from ._client import (
    Client, RefLike, _check_host_options, _check_writable, _decode, _device_ordinal, _ref, _split_done, _wait_request,
)
from ._errors import DepotError, InvalidArgument
from ._ref import ObjectRef

# The longest one callback of this module runs on the loop while answers pile up; the rest
# are handled in later callbacks, so that other tasks run in between.
_TURN_SECONDS = 0.0005


class AsyncClient:
    """A :class:`depot.Client` for asyncio: awaitable gets, waits, puts and task results.

    Give it a socket path (as Client takes), or a Client to share: its other threads may
    go on using it. It serves one event loop at a time: the loop of its awaits, which may
    change once none is pending (one ``asyncio.run`` after another). Close it (or use
    ``async with``) before its loop ends, which cancels what still waits.
    """

    def __init__(
        self, socket: Union[str, "os.PathLike[str]", Client, None] = None, *, name: str = ""
    ) -> None:
        self._client = socket if isinstance(socket, Client) else Client(socket, name=name)
        self._owned = self._client is not socket
        # Answers are announced per connection: one AsyncClient takes them all.
        if self._client._aio_client is not None:
            raise InvalidArgument(
                "this Client already serves an open AsyncClient: share that one (or close it)"
            )
        self._client._aio_client = self
        self._native = self._client._native
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # Requests awaited, by id: the future and what will take its answer.
        self._waiting: Dict[int, Tuple[asyncio.Future, Any]] = {}
        self._answered: Deque[int] = collections.deque()  # ids to hand to their futures
        self._draining = False  # a callback to go on handing answers out is scheduled
        self._watching = False

    @property
    def client(self) -> Client:
        """The blocking Client underneath (for calls this class does not offer)."""
        return self._client

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancels what still waits, and closes the Client if this made it."""
        waiting, self._waiting = list(self._waiting.values()), {}
        for future, pending in waiting:
            future.cancel()
            self._cancel(pending)
        for _, pending in waiting:
            self._drop(pending)  # answered at once, cancelled
        self._unwatch()
        self._client._aio_client = None
        if self._owned:
            self._client.close()

    # Reading.

    async def get(
        self, ref: RefLike, *, timeout: Optional[float] = None, device: Optional[int] = None,
        writable: bool = False, populate: bool = False,
    ) -> Any:
        """The value of an object, as :meth:`depot.Client.get` returns it (``writable``
        and ``populate`` too), awaiting its seal up to ``timeout`` seconds (``None``: for
        ever). Raises as that does."""
        return (
            await self.get_many(
                [ref], timeout=timeout, device=device, writable=writable, populate=populate
            )
        )[0]

    async def get_many(
        self, refs: Iterable[RefLike], *, timeout: Optional[float] = None,
        device: Optional[int] = None, writable: bool = False, populate: bool = False,
    ) -> List[Any]:
        """The values of several objects, in order, in one request; raises as
        :meth:`depot.Client.get_many` does. With ``populate``, the pages are mapped on a
        thread of the loop's default executor, not on the loop."""
        _check_host_options(writable, populate, device)
        ids = [_ref(r).id for r in refs]
        timeout_ms = _codec.parse_timeout(timeout)
        if device is None:
            buffers = await self._answer(self._native.start_get(ids, timeout_ms))
            if writable:
                buffers = [b.private_copy() for b in buffers]
            if populate:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: [b.populate() for b in buffers]
                )
            return [_decode(b, False) for b in buffers]
        pending = self._native.start_get_on_device(ids, _device_ordinal(device), timeout_ms)
        return _device.wrap(await self._answer(pending))

    async def result(self, ref: RefLike, *, timeout: Optional[float] = None) -> Any:
        """A task's result: :meth:`get` of its output (TaskFailed if it failed)."""
        return await self.get(ref, timeout=timeout)

    async def wait(
        self, refs: Iterable[RefLike], *, timeout: Optional[float] = None,
        return_when: str = "ALL_COMPLETED",
    ) -> Tuple[List[ObjectRef], List[ObjectRef]]:
        """``(done, not_done)`` once every ref (``"ALL_COMPLETED"``) or one of them
        (``"FIRST_COMPLETED"``) is sealed, or ``timeout`` seconds have passed, as
        :meth:`depot.Client.wait`. Holds nothing."""
        wanted = [_ref(r) for r in refs]
        ids, count = _wait_request(wanted, return_when)
        sealed = await self._answer(
            self._native.start_wait(ids, count, _codec.parse_timeout(timeout))
        )
        return _split_done(wanted, sealed)

    # Writing and tasks, in a worker thread.

    async def put(self, value: Any, **options: Any) -> ObjectRef:
        """:meth:`depot.Client.put`, in a worker thread."""
        return await asyncio.to_thread(self._client.put, value, **options)

    async def submit(self, fn: Any, *args: Any, **options: Any) -> Any:
        """:meth:`depot.Client.submit`, in a worker thread; await :meth:`result` of the
        refs it returns."""
        return await asyncio.to_thread(self._client.submit, fn, *args, **options)

    async def map(self, fn: Any, *iterables: Iterable[Any], **options: Any) -> List[Any]:
        """:meth:`depot.Client.map`, in a worker thread."""
        return await asyncio.to_thread(self._client.map, fn, *iterables, **options)

    async def delete(self, refs: Union[RefLike, Iterable[RefLike]]) -> None:
        """:meth:`depot.Client.delete`, in a worker thread."""
        await asyncio.to_thread(self._client.delete, refs)

    # Awaiting answers.

    async def _answer(self, pending: Any) -> Any:
        """What ``pending`` (a request started for this loop) is answered with."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._waiting and not self._bound_loop.is_closed():
                self._cancel(pending)
                self._drop(pending)
                raise InvalidArgument(
                    "an AsyncClient serves one event loop at a time, and awaits are pending on "
                    "another"
                )
            self._rebind(loop)
        if pending.ready():  # answered from what the client holds, or already read
            return pending.take()
        future = loop.create_future()
        self._waiting[pending.id] = (future, pending)
        self._watch()
        try:
            return await future
        except asyncio.CancelledError:
            if pending.id in self._waiting:
                # The daemon answers at once; _hand_out gives back what it granted.
                self._cancel(pending)
            raise

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serves ``loop`` from now on: the last one is closed, or nothing waits on it."""
        if self._watching and self._loop is not None and not self._loop.is_closed():
            self._unwatch()
        self._watching = False  # a closed loop's readers went with it
        self._draining = False
        waiting, self._waiting = list(self._waiting.values()), {}
        for _, pending in waiting:  # awaited on a loop that has closed
            self._cancel(pending)
            self._drop(pending)
        self._loop = loop

    @staticmethod
    def _cancel(pending: Any) -> None:
        """Asks the daemon to answer ``pending`` now; sends, and waits for nothing."""
        try:
            pending.cancel()
        except DepotError:
            pass  # the connection is gone: so is the request

    @property
    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this serves (see _answer), once an await has bound one."""
        assert self._loop is not None, "no await has bound this AsyncClient to a loop yet"
        return self._loop

    def _watch(self) -> None:
        if self._watching:
            return
        self._bound_loop.add_reader(self._native.fd, self._on_socket)
        self._bound_loop.add_reader(self._native.completion_fd(), self._on_answers)
        self._watching = True

    def _unwatch(self) -> None:
        if not self._watching:
            return
        self._bound_loop.remove_reader(self._native.fd)
        self._bound_loop.remove_reader(self._native.completion_fd())
        self._watching = False

    def _on_socket(self) -> None:
        # Reads what has come, without blocking. While another thread of this process is
        # the reader (a blocking call on the same Client), this returns at once, and the
        # answers it reads are announced through the eventfd.
        self._native.pump()
        self._on_answers()

    def _on_answers(self) -> None:
        self._answered.extend(self._native.take_completed())
        if not self._draining:
            self._hand_out()

    def _hand_out(self) -> None:
        """Hands answers to their futures, for one turn at most; schedules the rest."""
        self._draining = False
        end = time.perf_counter() + _TURN_SECONDS
        while self._answered:
            entry = self._waiting.pop(self._answered.popleft(), None)
            if entry is not None:
                future, pending = entry
                if future.done():  # cancelled: what it was granted goes back
                    self._drop(pending)
                else:
                    try:
                        future.set_result(pending.take())
                    except DepotError as e:
                        future.set_exception(e)
            if self._answered and time.perf_counter() > end:
                self._draining = True
                self._bound_loop.call_soon(self._hand_out)
                return
        if not self._waiting:
            self._unwatch()

    @staticmethod
    def _drop(pending: Any) -> None:
        """Takes an answer nobody awaits, giving back what it granted."""
        try:
            pending.take()
        except DepotError:
            pass

    def __repr__(self) -> str:
        return f"<depot.aio.AsyncClient over {self._client!r}, {len(self._waiting)} awaiting>"
