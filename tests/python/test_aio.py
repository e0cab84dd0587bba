"""Waits that do not poll, and depot.aio: a get or wait is one request however long it
waits; Ctrl-C and cancelled tasks cancel it in the daemon; a thousand awaits on one event
loop all complete while the loop keeps turning."""

import asyncio
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import depot
import depot.aio

from conftest import wait_for


def requests_of(client, kind):
    """How many requests of ``kind`` (get, wait, cancel_wait...) the daemon has handled."""
    for line in client.metrics().splitlines():
        if line.startswith(f'depot_requests_total{{type="{kind}"}} '):
            return int(line.split()[-1])
    raise AssertionError(f"no request counter for {kind}")


def session_of(client):
    """The daemon's view of ``client``'s session (requests sent, references held)."""
    mine = client._native.session_id
    return next(c for c in client.clients() if c.session_id == mine)


def test_a_get_with_a_timeout_is_one_request_however_long_it_waits(client):
    before = session_of(client).requests
    gets = requests_of(client, "get")
    with pytest.raises(depot.Timeout):
        client.get("aio/never", timeout=0.7)  # once cut into 200 ms gets
    with pytest.raises(depot.Timeout):
        client.get_many(["aio/never", "aio/nor"], timeout=0.3)
    done, not_done = client.wait(["aio/never"], timeout=0.3)
    assert done == [] and [r.name for r in not_done] == ["aio/never"]
    # Three requests, and the clients and metrics requests that count them.
    assert session_of(client).requests - before == 5
    assert requests_of(client, "get") - gets == 2


def test_wait_returns_when_the_first_or_all_are_sealed(client, daemon):
    threading.Timer(0.2, lambda: daemon.client().put(1, name="aio/first")).start()
    done, not_done = client.wait(["aio/first", "aio/second"], return_when="FIRST_COMPLETED", timeout=30)
    assert [r.name for r in done] == ["aio/first"] and [r.name for r in not_done] == ["aio/second"]
    threading.Timer(0.2, lambda: daemon.client().put(2, name="aio/second")).start()
    done, not_done = client.wait(["aio/first", "aio/second"], timeout=30)
    assert len(done) == 2 and not_done == []
    assert client.wait([]) == ([], [])
    with pytest.raises(depot.InvalidArgument, match="return_when"):
        client.wait(["aio/first"], return_when="SOMETIMES")


def test_ctrl_c_cancels_the_get_in_the_daemon_and_the_client_goes_on(daemon):
    """The interrupted get's wait goes at once, while its client lives on (the daemon
    counts a waiting get's ids against its metadata budget)."""
    observer = daemon.client()
    waiter = (
        "import depot, signal, sys\n"
        # Ctrl-C raises KeyboardInterrupt even where this test runs with SIGINT ignored
        # (a shell's background job), which the child would inherit.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"client = depot.Client({daemon.socket!r})\n"
        "print('connected', flush=True)\n"
        "sys.stdin.readline()\n"
        "try:\n"
        "    client.get_many(['aio/never/%d' % i for i in range(1000)])\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "sys.stdin.readline()\n"
        "client.put(1, name='aio/after')\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", waiter], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "connected"
        before = observer.status().metadata_bytes
        child.stdin.write("get\n")
        child.stdin.flush()
        assert wait_for(lambda: observer.status().metadata_bytes > before, timeout=30)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == "interrupted"
        assert wait_for(lambda: observer.status().metadata_bytes == before, timeout=30)
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert child.wait(30) == 0
        assert observer.get("aio/after") == 1
    finally:
        child.kill()
        child.stdout.close()
        child.stdin.close()


def test_awaited_gets_waits_puts_and_errors(daemon):
    async def main():
        async with depot.aio.AsyncClient(daemon.socket) as client:
            ref = await client.put(np.arange(10))
            assert (await client.get(ref)).tolist() == list(range(10))
            assert await client.get_many([ref, ref], timeout=1) is not None
            mine = await client.get(ref, writable=True)
            mine += 1
            assert mine.tolist() == list(range(1, 11))
            assert (await client.get(ref)).tolist() == list(range(10))
            with pytest.raises(depot.InvalidArgument, match="writable is True or False"):
                await client.get(ref, writable=1)
            populated = await client.get_many([ref, ref], populate=True, writable=True)
            assert [v.tolist() for v in populated] == [list(range(10))] * 2
            assert populated[0].flags.writeable
            with pytest.raises(depot.InvalidArgument, match="populate is True or False"):
                await client.get(ref, populate="no")
            with pytest.raises(depot.ObjectNotFound):
                await client.get("aio/missing", timeout=0)
            with pytest.raises(depot.Timeout):
                await client.get("aio/missing", timeout=0.05)
            done, not_done = await client.wait([ref, "aio/missing"], timeout=0.05)
            assert done == [ref] and len(not_done) == 1
            done, _ = await client.wait([ref, "aio/missing"], return_when="FIRST_COMPLETED")
            assert done == [ref]
            later = asyncio.ensure_future(client.get("aio/later", timeout=30))
            await asyncio.sleep(0.05)
            assert not later.done()
            await client.put(b"now", name="aio/later")
            assert bytes(await later) == b"now"

    asyncio.run(main())


def test_a_thousand_awaits_complete_on_one_loop_that_keeps_turning(daemon):
    """The objects are put by another process, so that nothing here holds the GIL but the
    loop; a monitor task measures the longest the loop went without turning."""
    n = 1000
    names = [f"aio/many/{i}" for i in range(n)]
    putter = (
        "import depot, sys\n"
        f"client = depot.Client({daemon.socket!r})\n"
        "sys.stdin.readline()\n"
        f"for i in range({n}):\n"
        "    client.put(i, name='aio/many/%d' % i)\n"
    )

    async def main():
        async with depot.aio.AsyncClient(daemon.socket) as client:
            before = requests_of(client.client, "get")
            stop = asyncio.Event()
            longest = 0.0

            async def monitor():
                nonlocal longest
                last = time.perf_counter()
                while not stop.is_set():
                    await asyncio.sleep(0)
                    now = time.perf_counter()
                    longest = max(longest, now - last)
                    last = now

            # Started before the monitor: starting a process blocks the loop.
            child = subprocess.Popen([sys.executable, "-c", putter], stdin=subprocess.PIPE, text=True)
            gets = [asyncio.ensure_future(client.get(name)) for name in names]
            await asyncio.sleep(0.05)
            watching = asyncio.ensure_future(monitor())
            await asyncio.sleep(0)
            try:
                child.stdin.write("go\n")
                child.stdin.close()
                values = await asyncio.wait_for(asyncio.gather(*gets), 120)
            finally:
                child.wait(60)
            stop.set()
            await watching
            assert values == list(range(n))
            assert requests_of(client.client, "get") - before == n  # one each

            return longest

    longest = asyncio.run(main())
    # The target is 1 ms (bench/python/bench_aio.py measures it); this bound only catches
    # a loop that blocks, on a machine that may be busy with other tests.
    assert longest < 0.25, f"the loop went {longest * 1000:.1f} ms without turning"


def test_cancelling_an_awaiting_task_cancels_its_wait_and_gives_back_its_grants(daemon):
    observer = daemon.client()
    observer.put(b"x" * 1000, name="aio/there")
    before = observer.status().metadata_bytes

    async def main():
        async with depot.aio.AsyncClient(daemon.socket) as client:
            waits = [
                asyncio.ensure_future(client.get_many(["aio/there", f"aio/not-yet/{i}"]))
                for i in range(100)
            ]
            waits.append(asyncio.ensure_future(client.wait(["aio/not-yet/x"])))
            for _ in range(1000):
                await asyncio.sleep(0.01)
                if observer.status().metadata_bytes > before:
                    break
            assert observer.status().metadata_bytes > before
            for w in waits:
                w.cancel()
            results = await asyncio.gather(*waits, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.get("aio/not-yet/y"), 0.05)
            # The daemon answered each at once; the answers' grants go back.
            for _ in range(1000):
                await asyncio.sleep(0.01)
                if observer.status().metadata_bytes == before:
                    break
            assert observer.status().metadata_bytes == before
            assert session_of(client.client).references == 0

    asyncio.run(main())


def test_answers_read_by_another_threads_blocking_call_still_reach_the_loop(daemon):
    """A Client shared with threads: while they are the reader of its socket, the answers
    they read for the loop are announced through the eventfd."""
    shared = daemon.client()
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            shared.locate(["aio/busy"])

    async def main():
        client = depot.aio.AsyncClient(shared)
        gets = [asyncio.ensure_future(client.get(f"aio/shared/{i}", timeout=60)) for i in range(50)]
        await asyncio.sleep(0.05)
        with daemon.client() as writer:
            for i in range(50):
                writer.put(i, name=f"aio/shared/{i}")
        assert await asyncio.wait_for(asyncio.gather(*gets), 60) == list(range(50))
        await client.close()

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        thread.join()
    assert not shared._native.closed  # shared, so left open


def test_one_loop_at_a_time_and_a_later_loop_once_nothing_waits(daemon):
    client = depot.aio.AsyncClient(daemon.socket)
    client.client.put(1, name="aio/loops")

    async def first():
        pending = asyncio.ensure_future(client.get("aio/loops/never"))
        await asyncio.sleep(0.05)
        # Another thread's loop, while this one has an await pending.
        with pytest.raises(depot.InvalidArgument, match="one event loop at a time"):
            await asyncio.to_thread(lambda: asyncio.run(client.get("aio/loops")))
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        return await client.get("aio/loops")

    assert asyncio.run(first()) == 1
    assert asyncio.run(client.get("aio/loops")) == 1  # a new loop, nothing pending

    async def close():
        await client.close()

    asyncio.run(close())


def test_a_client_serves_one_async_client_at_a_time(daemon):
    shared = daemon.client()
    first = depot.aio.AsyncClient(shared)
    with pytest.raises(depot.InvalidArgument, match="already serves an open AsyncClient"):
        depot.aio.AsyncClient(shared)
    asyncio.run(first.close())
    second = depot.aio.AsyncClient(shared)
    shared.put(2, name="aio/second")
    assert asyncio.run(second.get("aio/second")) == 2


def test_an_awaited_get_on_a_gpu_is_a_device_array_there():
    """On simulated GPUs (their memory is host memory): the same DeviceArray as a blocking
    get(device=1), the copy to that GPU made by the daemon while the loop goes on."""
    from dlpack_util import FakeCudaArray, host_view

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with depot.start_daemon(memory="256MiB", segment_size="64MiB", simulate_gpus="2:64MiB") as d:
        with d.client() as writer:
            ref = writer.put(FakeCudaArray(x))  # on GPU 0

        async def main():
            async with depot.aio.AsyncClient(d.socket) as client:
                (a,) = await client.get_many([ref], device=1, timeout=30)
                assert a.device == 1 and a.shape == (3, 4) and a.dtype == x.dtype
                assert np.array_equal(host_view(a.ptr, a.nbytes, a.dtype, a.shape), x)
                with pytest.raises(depot.InvalidArgument):
                    await client.get(ref, device=7)

        asyncio.run(main())
