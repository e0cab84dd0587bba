"""A value's store reference lives exactly as long as the value and every view of it."""

import gc
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import depot
from conftest import wait_for


def held(client):
    return client.status().held_bytes


def references(client):
    """References to the store's objects, by every client: through the socket or through a
    lease (a get of an object the client has seen, such as one it put, takes a lease, which
    the daemon's views count as a reference)."""
    return sum(info.ref_count for info in client.list())


def test_reference_is_released_only_when_the_last_view_goes(client):
    array = client.get(client.put(np.arange(1_000_000)))
    view = array[10:20]
    buffer = memoryview(array)
    del array
    gc.collect()
    assert references(client) > 0
    del buffer
    gc.collect()
    assert references(client) > 0
    assert view.sum() == sum(range(10, 20))
    del view
    gc.collect()
    assert references(client) == 0


def test_nested_arrays_keep_the_object_until_each_is_gone(client):
    value = client.get(client.put({"a": np.arange(100_000), "b": np.ones(100_000)}))
    a, b = value["a"], value["b"]
    del value
    gc.collect()
    del a
    gc.collect()
    assert references(client) > 0
    del b
    gc.collect()
    assert references(client) == 0


def test_memoryview_keeps_its_object(client):
    view = client.get(client.put(b"q" * 100_000))
    assert references(client) > 0
    sliced = view[5:10]
    del view
    gc.collect()
    assert references(client) > 0 and sliced.tobytes() == b"qqqqq"
    del sliced
    gc.collect()
    assert references(client) == 0


def test_put_holds_no_reference(client):
    client.put(np.arange(1_000_000))
    client.put({"x": np.arange(1_000_000)})
    assert held(client) == 0


def test_deleted_object_stays_readable_while_held(client):
    ref = client.put(np.arange(1000))
    array = client.get(ref)
    client.delete(ref)
    assert not client.contains(ref)
    assert array.sum() == sum(range(1000))
    del array
    gc.collect()
    assert wait_for(lambda: client.status().used_bytes == 0)


def test_killed_process_releases_what_it_held(client, daemon):
    refs = [client.put(np.arange(1_000_000)) for _ in range(3)]
    holder = textwrap.dedent(
        f"""
        import sys, time, depot
        client = depot.Client({daemon.socket!r})
        arrays = [client.get(depot.ObjectRef(bytes.fromhex(h))) for h in sys.argv[1:]]
        nested = client.get(client.put({{"k": arrays[0] + 1}}))
        print("holding", flush=True)
        time.sleep(60)
        """
    )
    ids = [r.id.hex() for r in refs]
    child = subprocess.Popen([sys.executable, "-c", holder, *ids], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "holding"
        # The three by reference; the nested one maybe through a lease (its creator's
        # reference may have gone before the get), which held_bytes counts only once the
        # daemon has found it, but references() counts.
        assert held(client) >= 3 * 8_000_000
        assert references(client) >= 4
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        child.kill()
        child.stdout.close()
    assert wait_for(lambda: held(client) == 0), f"still held: {held(client)} bytes"
    assert wait_for(lambda: references(client) == 0), f"still referenced: {references(client)}"


def test_a_handoff_with_a_ttl_is_given_back_if_unclaimed(daemon):
    key = os.urandom(16)
    with depot.Client(daemon.socket, group=key) as sender, depot.Client(
        daemon.socket, group=key
    ) as receiver, daemon.client() as observer:
        ref, _ = sender.handoff(b"x" * 100_000)  # no deadline: until claimed
        before = observer.status().metadata_bytes
        sender.handoff_again(ref, ttl=0.05)  # one more claim, for 50 ms
        # Its deadline passes (and its charge with it); the group lives on, and the handoff
        # without a deadline is still there to claim, once.
        assert wait_for(lambda: observer.status().metadata_bytes == before)
        assert bytes(receiver.claim(ref)) == b"x" * 100_000
        with pytest.raises(depot.NotHeld):
            receiver.claim(ref)
        for bad in (0, -1, 5e6):
            with pytest.raises(depot.InvalidArgument, match="ttl"):
                sender.handoff_again(ref, ttl=bad)


def test_what_a_client_with_a_grace_handed_off_goes_back_after_it_has_closed(daemon):
    key = os.urandom(16)
    with depot.Client(daemon.socket, group=key) as receiver, daemon.client() as observer:
        with depot.Client(daemon.socket, group=key, handoff_grace=0.05) as sender:
            assert sender.handoff_grace == 0.05 and receiver.handoff_grace is None
            kept, _ = sender.handoff(b"k" * 100_000)
            left, _ = sender.handoff(b"l" * 100_000)
            claimed = receiver.claim(kept)
            assert observer.status().objects_sealed == 2  # both wait while the sender lives
        # 50 ms after the sender has closed, what nobody claimed goes, though the receiver
        # keeps the group alive; what was claimed stays with its claimer.
        assert wait_for(lambda: observer.status().objects_sealed == 1)
        with pytest.raises(depot.NotHeld):
            receiver.claim(left)
        assert bytes(claimed) == b"k" * 100_000
        for bad in (0, -1, 5e6, "10"):
            with pytest.raises(depot.InvalidArgument, match="handoff grace"):
                depot.Client(daemon.socket, group=key, handoff_grace=bad)
