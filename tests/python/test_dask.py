"""depot.dask on real distributed.LocalCluster workers (separate processes) and a real depotd.

Each cluster's workers attach to the test's daemon through depot.dask.DepotPlugin; the test
process holds its own depot.Client to look at the store.
"""

import os
import signal
import time

import numpy as np
import pytest

from conftest import frame_of_every_kind, in_store, pandas_buffers, store_pages, wait_for

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
import dask  # noqa: E402

import depot  # noqa: E402
import depot.dask  # noqa: E402
from distributed import LocalCluster  # noqa: E402

MiB = 1 << 20


def _cluster(**kwargs):
    options = dict(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0",
        memory_limit="4GiB",
    )
    options.update(kwargs)
    # The tests look at which workers hold a key: the Active Memory Manager, which drops
    # replicas every 2 s, must not change that under them.
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        return LocalCluster(**options)


@pytest.fixture(scope="module")
def store():
    with depot.start_daemon(memory="1GiB", segment_size="64MiB") as daemon:
        yield daemon


@pytest.fixture(scope="module")
def cluster(store):
    with _cluster(resources={"GPU": 1}) as c, c.get_client() as dask_client:
        dask_client.register_plugin(depot.dask.DepotPlugin(socket=store.socket))
        yield dask_client


@pytest.fixture
def dask_client(cluster, store):
    yield cluster
    # Every test leaves the store as it found it: empty once Dask forgets its keys.
    assert _store_empties(store), "objects left in the store after the test"


def _store_empties(store, timeout=30):
    with store.client() as c:
        return wait_for(lambda: c.status().objects_sealed == 0, timeout=timeout)


def _objects(store):
    with store.client() as c:
        return c.status().objects_sealed


def _in_depot(dask_worker):
    """The keys a worker keeps in the store."""
    return sorted(map(str, getattr(dask_worker.data, "stored", {})))


def _transfers(peers, dask_worker=None):
    """(bytes of the values this worker sent to other workers, bytes it wrote to the comms
    for them, their keys). The values the Dask client gathers are left out: it has no
    store."""
    log = [t for t in dask_worker.transfer_outgoing_log if t["who"] in peers]
    keys = sorted({str(k) for t in log for k in t["keys"]})
    return sum(t["total"] for t in log), sum(t["compressed"] or 0 for t in log), keys


def _worker_transfers(dask_client):
    return dask_client.run(_transfers, set(dask_client.scheduler_info()["workers"]))


def _clear_transfer_logs(dask_worker):
    dask_worker.transfer_outgoing_log.clear()


def test_results_equal_plain_dask(dask_client):
    rs = da.random.RandomState(0)
    a = rs.random_sample((1500, 1500), chunks=500)  # 2 MB chunks: in the store
    expected = (a * a.T).sum().compute(scheduler="sync")
    assert dask_client.compute((a * a.T).sum()).result(timeout=120) == pytest.approx(
        expected, rel=1e-12
    )
    # The array itself comes back to this process (which has no plugin) as bytes.
    np.testing.assert_array_equal(
        dask_client.compute(a.T + 1).result(timeout=120), a.T.compute(scheduler="sync") + 1
    )


def test_a_large_result_goes_to_the_store_when_first_sent(dask_client, store):
    first, second = sorted(dask_client.scheduler_info()["workers"])[:2]
    big = dask_client.submit(np.ones, (2 * MiB,), dtype=np.uint8, key="big", workers=[first])
    small = dask_client.submit(np.ones, (1000,), key="small", workers=[first])
    objects = dask_client.submit(
        np.array, [object(), 1] * (1 << 16), dtype=object, key="obj", workers=[first]
    )
    distributed.wait([big, small, objects], timeout=60)
    assert dask_client.run(_in_depot)[first] == [] and _objects(store) == 0

    def read(x, *rest):
        return x.flags.writeable, int(x.sum())

    # A task on another worker: the result is stored once, both workers view the store, and
    # the reader gets the store's read-only view.
    answer = dask_client.submit(read, big, small, objects, workers=[second], pure=False)
    assert answer.result(timeout=60) == (False, 2 * MiB)
    assert wait_for(lambda: dask_client.run(_in_depot)[first] == ["big"], timeout=30)
    assert dask_client.run(_in_depot)[second] == ["big"]
    assert _objects(store) == 1
    del big, small, objects, answer


@pytest.fixture(scope="module")
def eager(store):
    """One worker that stores every large result as the task returns it (keep="always")."""
    with _cluster(n_workers=1) as c, c.get_client() as dask_client:
        dask_client.register_plugin(depot.dask.DepotPlugin(socket=store.socket, keep="always"))
        yield dask_client


def test_a_slice_of_a_stored_result_travels_as_a_view(dask_client, store):
    first, second = sorted(dask_client.scheduler_info()["workers"])[:2]
    n = 1 << 20
    big = dask_client.submit(np.arange, n, dtype=np.int64, workers=[first])  # 8 MB
    last = dask_client.submit(lambda x: int(x[-1]), big, workers=[second], pure=False)
    assert last.result(timeout=60) == n - 1  # big is in the store now, viewed by both
    half = dask_client.submit(lambda x: x[1::2], big, workers=[first])  # a view of it, 4 MB

    def check(x):
        return x.flags.writeable, int(x[0]), int(x[-1]), x.shape, x.strides

    dask_client.run(_clear_transfer_logs)
    answer = dask_client.submit(check, half, workers=[second])
    assert answer.result(timeout=60) == (False, 1, n - 1, (n // 2,), (16,))
    moved = _worker_transfers(dask_client)
    assert sum(w for _, w, _ in moved.values()) < 4096, moved
    assert _objects(store) == 1  # the slice was neither copied nor stored apart
    del big, last, half, answer


def _shared(array):
    """Whether an array's memory lies in a shared mapping of this process (the store's), not
    in its own memory."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                return perms[3] == "s"
    return False


def _numbers(n):
    pd = pytest.importorskip("pandas")
    return pd.DataFrame(
        {"x": np.arange(n, dtype=np.float64), "y": np.arange(n, dtype=np.int32)},
        index=pd.Index(np.arange(n) * 2, name="i"),
    )


def test_pandas_results_travel_as_handles(dask_client, store):
    pd = pytest.importorskip("pandas")
    first, second, third = sorted(dask_client.scheduler_info()["workers"])
    n = 1 << 18  # 5 MiB of data in the frame (index included), 2 MiB in the series
    dask_client.run(_clear_transfer_logs)
    frame = dask_client.submit(_numbers, n, key="frame", workers=[first])
    series = dask_client.submit(
        lambda n: pd.Series(np.ones(n), name="s"), n, key="series", workers=[first]
    )

    def read(frame, series):
        # The receiver's columns, index and series are the store's memory, mapped.
        views = [_shared(frame[c].to_numpy()) for c in frame]
        views += [_shared(frame.index.to_numpy()), _shared(series.to_numpy())]
        return views, float(frame["x"].sum()), int(frame["y"].sum()), float(series.sum())

    views, x, y, s = dask_client.submit(read, frame, series, workers=[second]).result(60)
    assert views == [True] * 4
    assert (x, y, s) == (float(n * (n - 1) // 2), n * (n - 1) // 2, float(n))
    (total, written, keys), = [t for a, t in _worker_transfers(dask_client).items() if a == first]
    assert keys == ["frame", "series"] and total >= 6 * MiB
    assert written < total / 1000, (written, total)
    assert wait_for(lambda: dask_client.run(_in_depot)[first] == ["frame", "series"], 30)
    assert _objects(store) == 2
    # What pandas makes of a stored frame without a copy is kept as it is, not stored again.
    renamed = dask_client.submit(
        lambda f: f[["x"]].rename(columns={"x": "z"}), frame, key="renamed", workers=[second]
    )
    distributed.wait(renamed, timeout=60)
    # One with a column of its own is the worker's, until it is sent.
    widened = dask_client.submit(lambda f: f.assign(w=np.zeros(len(f))), frame, workers=[second])
    distributed.wait(widened, timeout=60)
    kept = dask_client.run(_in_depot)[second]
    assert "renamed" in kept and widened.key not in kept and _objects(store) == 2

    def mapped(dask_worker):
        renamed = dask_worker.data["renamed"]
        stored = depot.dask._current().stored_of(renamed) is not None
        return _shared(renamed["z"].to_numpy()), stored

    assert dask_client.run(mapped, workers=[second])[second] == (True, False)
    # Sent on, a value that shares stored arrays is stored, and its worker keeps that copy;
    # so is an array taken from a stored frame (not a view of any stored array).
    column = dask_client.submit(lambda f: f["x"].to_numpy(), frame, workers=[second])
    total = dask_client.submit(
        lambda r, w, c: (float(r["z"].sum()), float(w["w"].sum()), float(c.sum())),
        renamed, widened, column, workers=[third],
    )
    assert total.result(60) == (float(n * (n - 1) // 2), 0.0, float(n * (n - 1) // 2))
    assert wait_for(lambda: dask_client.run(mapped, workers=[second])[second] == (True, True), 30)
    assert _objects(store) == 5
    # What gathers them (this process, without the plugin) gets the bytes, as from Dask.
    pd.testing.assert_frame_equal(frame.result(60), _numbers(n))
    pd.testing.assert_frame_equal(renamed.result(60), _numbers(n)[["x"]].rename(columns={"x": "z"}))
    del frame, series, renamed, widened, column, total


def test_pandas_frames_of_one_block_and_slices_of_their_rows(dask_client, store):
    pd = pytest.importorskip("pandas")
    first, second = sorted(dask_client.scheduler_info()["workers"])[:2]
    n = 1 << 18

    def block(n):  # three columns in one 2-d block
        return pd.DataFrame(
            np.arange(3 * n, dtype=np.float64).reshape(n, 3), columns=["a", "b", "c"],
            index=pd.Index(np.arange(n, dtype=np.uint32)),
        )

    whole = dask_client.submit(block, n, workers=[first])
    # A slice of its rows views a block that is not contiguous: stored as a contiguous copy.
    rows = dask_client.submit(lambda f: f.iloc[10:-10], whole, workers=[first])

    def read(whole, rows):
        return (
            _shared(whole["a"].to_numpy()), _shared(whole.index.to_numpy()),
            _shared(rows["a"].to_numpy()), float(rows["c"].sum()), int(rows.index[0]),
        )

    assert dask_client.submit(read, whole, rows, workers=[second]).result(60) == (
        True, True, True, float((3 * np.arange(10, n - 10) + 2).sum()), 10,
    )
    assert _objects(store) == 2
    del whole, rows


def test_pandas_values_of_times_strings_and_categories_travel_as_handles(dask_client, store):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    first, second = sorted(dask_client.scheduler_info()["workers"])[:2]
    n = 1 << 17  # 4 MiB in the frame
    dask_client.run(_clear_transfer_logs)
    frame = dask_client.submit(frame_of_every_kind, n, key="kinds", workers=[first])
    keyed = dask_client.submit(  # numbers indexed by pairs of (number, string)
        lambda n: pd.Series(
            np.ones(n),
            index=pd.MultiIndex.from_arrays([np.arange(n) % 3, np.arange(n).astype(str)]),
        ),
        n, key="keyed", workers=[first],
    )

    def read(frame, keyed):
        # Every buffer of every column, index and categories is the store's memory, mapped.
        buffers = pandas_buffers(frame) + pandas_buffers(keyed)
        private = [b for b in buffers if not in_store(*b)]
        return len(buffers), private, frame.equals(frame_of_every_kind(n)), float(keyed.sum())

    count, private, equal, total = dask_client.submit(
        read, frame, keyed, workers=[second]
    ).result(60)
    assert count >= 16 and private == [] and equal and total == float(n)
    (moved, written, keys), = [t for a, t in _worker_transfers(dask_client).items() if a == first]
    assert keys == ["keyed", "kinds"] and moved >= 4 * MiB and written < moved / 1000
    assert _objects(store) == 2
    # What pandas makes of the stored frame without a copy is kept as it is if it holds
    # numpy arrays alone (times, periods, nullable numbers); with Arrow strings, it is not.
    picked = dask_client.submit(
        lambda f: f[["at", "took", "day", "count", "even"]], frame, key="picked", workers=[second]
    )
    named = dask_client.submit(lambda f: f[["name", "count"]], frame, key="named", workers=[second])
    distributed.wait([picked, named], timeout=60)
    kept = dask_client.run(_in_depot)[second]
    assert "picked" in kept and "named" not in kept and _objects(store) == 2
    pd.testing.assert_frame_equal(frame.result(60), frame_of_every_kind(n))
    del frame, keyed, picked, named


def test_pandas_values_of_python_objects_stay_with_dask(dask_client, store):
    pd = pytest.importorskip("pandas")
    first, second = sorted(dask_client.scheduler_info()["workers"])[:2]
    n = 1 << 18
    objects = dask_client.submit(  # strings as Python objects, which pickle in the stream
        lambda n: pd.DataFrame({"s": pd.Series(["abcdefgh"] * n, dtype=object), "x": np.ones(n)}),
        n, workers=[first],
    )
    strings = dask_client.submit(  # pandas' strings kept as Python objects
        lambda n: pd.Series(["abcdefgh"] * n, dtype=pd.StringDtype("python")), n, workers=[first]
    )
    spans = dask_client.submit(  # intervals: an index of Python objects
        lambda n: pd.Series(np.ones(n), index=pd.interval_range(0, n)), n, workers=[first]
    )

    def read(objects, strings, spans):
        return len(objects), objects["s"].iloc[-1], strings.iloc[-1], float(spans.sum())

    assert dask_client.submit(read, objects, strings, spans, workers=[second]).result(60) == (
        n, "abcdefgh", "abcdefgh", float(n)
    )
    assert dask_client.run(_in_depot)[first] == [] and _objects(store) == 0
    del objects, strings, spans


def test_keep_always_stores_pandas_results_when_first_sent(store):
    with _cluster(n_workers=2) as cluster, cluster.get_client() as dask_client:
        dask_client.register_plugin(depot.dask.DepotPlugin(socket=store.socket, keep="always"))
        first, second = sorted(dask_client.scheduler_info()["workers"])
        frame = dask_client.submit(_numbers, 1 << 18, key="frame", workers=[first])
        array = dask_client.submit(np.ones, 1 << 18, key="array", workers=[first])
        distributed.wait([frame, array], timeout=60)
        assert dask_client.run(_in_depot)[first] == ["array"] and _objects(store) == 1
        rows = dask_client.submit(lambda f, a: len(f) + len(a), frame, array, workers=[second])
        assert rows.result(60) == 2 << 18
        assert wait_for(lambda: dask_client.run(_in_depot)[first] == ["array", "frame"], 30)
        assert _objects(store) == 2
        del frame, array, rows
    assert _store_empties(store)


def _rss_and_private(dask_worker):
    return depot.dask.private_memory(), dask_worker.monitor.get_process_memory()


def _watch_copies(dask_worker):
    """Records the threads the worker's store copies results on, and its event loop's
    (client.run runs a function on the loop)."""
    import threading

    store = depot.dask._current()
    threads = []
    original = type(store).copy

    def copy(value, kind):
        threads.append(threading.get_ident())
        return original(store, value, kind)

    store.copy = copy
    dask_worker._depot_watch = (threading.get_ident(), threads)


def _stop_watching_copies(dask_worker):
    del depot.dask._current().copy
    return dask_worker.__dict__.pop("_depot_watch")


def test_keep_always_stores_results_as_tasks_return_them(eager, store):
    eager.run(_watch_copies)
    try:
        big = eager.submit(np.ones, (2 * MiB,), dtype=np.uint8, key="big")
        small = eager.submit(np.ones, (1000,), key="small")
        distributed.wait([big, small], timeout=60)
    finally:
        ((loop, threads),) = eager.run(_stop_watching_copies).values()
    assert list(eager.run(_in_depot).values()) == [["big"]]
    assert _objects(store) == 1
    # Copied on the task's thread, not on the event loop that serves the worker's comms.
    assert len(threads) == 1 and loop not in threads, (loop, threads)
    del big, small
    assert _store_empties(store)


def test_memory_monitor_counts_the_store_as_shared(eager, store):
    (address,) = eager.scheduler_info()["workers"]
    before = eager.run(_rss_and_private)[address]
    big = eager.submit(np.ones, (200 * MiB,), dtype=np.uint8)
    assert eager.submit(lambda x: int(x.sum()), big).result(timeout=60) == 200 * MiB

    def measure(dask_worker):
        from conftest import memory_kib

        return memory_kib("RssShmem") * 1024, dask_worker.monitor.get_process_memory()

    shmem, private = eager.run(measure)[address]
    assert shmem >= 200 * MiB  # the worker maps the result ...
    assert private < before[1] + 100 * MiB  # ... and Dask does not count it as its own
    del big
    assert _store_empties(store)


def _cross(n=4, chunk_mb=4, client=None):
    """a random array of n x n chunks, and a + a.T; with ``client``, both persisted."""
    side = int((chunk_mb * MiB / 8) ** 0.5)
    a = da.random.RandomState(1).random_sample((side * n, side * n), chunks=side)
    if client is None:
        return a, (a + a.T)
    a = client.persist(a)
    b = client.persist(a + a.T)
    distributed.wait([a, b], timeout=120)
    return a, b


def test_same_host_transfers_move_handles_not_bytes(dask_client, store):
    dask_client.run(_clear_transfer_logs)
    a, b = _cross(client=dask_client)
    moved = _worker_transfers(dask_client)
    total = sum(t for t, _, _ in moved.values())
    written = sum(w for _, w, _ in moved.values())
    # 16 chunks of 4 MB spread over 3 workers: some of a.T's chunks crossed workers.
    assert total >= 2 * MiB, moved
    assert written < total / 1000, f"{written} bytes written to move {total} bytes: {moved}"
    # What a worker sent, it now keeps as a view of the store (its own copy is gone); the
    # chunks of b, never sent, stay in the worker's memory.
    kept = dask_client.run(_in_depot)
    for address, (_, _, keys) in moved.items():
        assert set(keys) <= set(kept[address]), (keys, kept[address])
    assert not any("add" in key for keys in kept.values() for key in keys), kept
    expected = _cross()[1].compute(scheduler="sync")
    np.testing.assert_array_equal(dask_client.compute(b).result(timeout=120), expected)
    del a, b


def test_released_keys_leave_the_store_empty(dask_client, store):
    a, b = _cross(n=3, client=dask_client)
    assert _objects(store) > 0  # the chunks of a that crossed workers
    del a, b
    assert _store_empties(store)


def test_resources_keep_working(dask_client):
    def on_gpu_worker(n):
        from distributed import get_worker

        return get_worker().state.available_resources["GPU"], np.full(n, 7, dtype=np.uint8)

    futures = [
        dask_client.submit(on_gpu_worker, 2 * MiB, resources={"GPU": 1}, pure=False)
        for _ in range(4)
    ]
    for available, value in dask_client.gather(futures):
        assert available == 0  # it held the worker's one GPU while it ran
        assert value.nbytes == 2 * MiB and (value == 7).all()
    del futures


def test_a_killed_worker_is_recomputed_and_leaves_nothing(store):
    with _cluster(n_workers=2) as cluster, cluster.get_client() as dask_client:
        dask_client.register_plugin(depot.dask.DepotPlugin(socket=store.socket))

        def chunk(i):
            time.sleep(0.2)
            return np.full(MiB, i, dtype=np.float64)  # 8 MB: in the store

        def add_all(xs):
            return float(sum(x.sum() for x in xs))

        chunks = dask_client.map(chunk, range(12))
        total = dask_client.submit(add_all, chunks)
        assert wait_for(lambda: sum(c.status == "finished" for c in chunks) >= 3, timeout=60)
        victim = next(iter(dask_client.who_has(chunks[0]).values()))[0]
        pid = dask_client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        assert total.result(timeout=120) == float(sum(i * MiB for i in range(12)))
        chunks.clear()
        del total
        assert _store_empties(store)
    assert _objects(store) == 0


def _depot_events(dask_client, count):
    """depot.dask's events on the scheduler, once it has ``count`` of them (at most 30 s):
    workers send events in batches, which may arrive after register_plugin returns."""

    def events():
        return [e for _, e in dask_client.get_events(depot.dask.EVENT_TOPIC)]

    wait_for(lambda: len(events()) >= count, timeout=30, interval=0.05)
    return events()


def test_no_daemon_falls_back_to_plain_dask_with_one_warning(tmp_path):
    with _cluster(n_workers=2) as cluster, cluster.get_client() as dask_client:
        dask_client.register_plugin(
            depot.dask.DepotPlugin(socket=str(tmp_path / "no-such.sock"))
        )
        a, b = _cross(n=2, chunk_mb=2)
        np.testing.assert_array_equal(
            dask_client.compute(b).result(timeout=120), (a + a.T).compute(scheduler="sync")
        )
        events = _depot_events(dask_client, 2)
        assert len(events) == 2 and not any(e["attached"] for e in events), events
        assert all(e["message"].startswith("depot.dask: no depotd") for e in events), events
        assert dask_client.run(_in_depot) == {w: [] for w in dask_client.run(lambda: 0)}


def test_required_plugin_fails_setup_without_a_daemon(tmp_path):
    with _cluster(n_workers=1) as cluster, cluster.get_client() as dask_client:
        with pytest.raises(Exception, match="no-such.sock"):
            dask_client.register_plugin(
                depot.dask.DepotPlugin(socket=str(tmp_path / "no-such.sock"), required=True)
            )


def test_a_full_store_leaves_results_to_dask(tmp_path):
    with depot.start_daemon(memory="16MiB", segment_size="16MiB") as small:
        with _cluster(n_workers=1) as cluster, cluster.get_client() as dask_client:
            dask_client.register_plugin(
                depot.dask.DepotPlugin(socket=small.socket, keep="always")
            )
            futures = [
                dask_client.submit(np.full, (MiB,), i, key=f"full-{i}") for i in range(4)
            ]  # 8 MB each: one fits, the rest stay in the worker
            values = dask_client.gather(futures)
            assert [int(v[0]) for v in values] == [0, 1, 2, 3]
            (kept,) = dask_client.run(_in_depot).values()
            assert 1 <= len(kept) < 4
            del futures, values
        assert _store_empties(small)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        depot.dask.DepotPlugin(threshold="lots")
    with pytest.raises(ValueError, match="threshold"):
        depot.dask.DepotPlugin(threshold=-1)
    with pytest.raises(ValueError, match="keep must be one of 'on-send', 'always', not 'never'"):
        depot.dask.DepotPlugin(keep="never")


def test_a_bad_handle_is_a_failed_transfer(dask_client):
    # What a hostile or confused peer could send: handles to objects this worker's group
    # never got, and handles that are not handles at all.
    def receive(dask_worker):
        from distributed.protocol import deserialize

        answers = []
        for handle in (
            {"ref": b"\x01" * 16, "gpu": None, "module": ""},
            {"ref": b"\x01" * 16, "gpu": b"\x02" * 16, "module": "torch"},
            {"ref": b"short", "gpu": None, "module": ""},
            {"gpu": None},
            "not a dict",
            {"ref": 2**63, "gpu": None, "module": ""},
            {"ref": b"\x01" * 16, "gpu": None, "module": "", "view": [2**63, [1], [1], "|u1"]},
            {"ref": b"\x01" * 16, "gpu": None, "module": "", "view": [-8, [1], [1], "|u1"]},
            {"ref": b"\x01" * 16, "gpu": 7, "module": ""},
        ):
            try:
                deserialize({"depot": handle, "serializer": "dask"}, [], deserializers=["dask"])
                answers.append("claimed")
            except OSError as e:
                answers.append(str(e))
        # Views that do not lie in their object, of objects that are there.
        store = depot.dask._store
        for view in ([8, [16], [1], "|u1"], [0, [2], [8], "|O"], [0, [4], [8], "<f8"]):
            ref, _ = store.client.handoff(np.zeros(16, dtype=np.uint8))
            handle = {"ref": ref.id, "gpu": None, "module": "", "view": view}
            try:
                deserialize({"depot": handle, "serializer": "dask"}, [], deserializers=["dask"])
                answers.append("claimed")
            except OSError as e:
                answers.append(str(e))
        return answers

    for answers in dask_client.run(receive).values():
        assert "could not claim" in answers[0], answers
        assert "cannot see (uuid 0202" in answers[1], answers
        assert all("malformed handle" in a for a in answers[2:9]), answers
        assert all("a view that is not in its object" in a for a in answers[9:]), answers
    # The workers still work.
    assert dask_client.submit(lambda: 41 + 1).result(timeout=60) == 42


def _fake_gpu_array(n, fill):
    from dlpack_util import FakeCudaArray

    return FakeCudaArray(np.full(n, fill, dtype=np.uint8))  # host memory, on "CUDA device 0"


def _device_array(n, fill):
    """A depot.DeviceArray on the simulated GPU 0, as a task would get one from the store."""
    client = depot.dask._store.client
    ref = client.put(_fake_gpu_array(n, fill))
    try:
        return client.get(ref, device=0)
    finally:
        client.delete(ref)


def _gpu_sum(x):
    from dlpack_util import host_view

    return type(x).__name__, x.simulated, int(host_view(x.ptr, x.nbytes, np.uint8, x.shape).sum())


def test_gpu_results_travel_as_handles_in_the_gpu_pool():
    # A GPU array made on one worker and read on another (a simulated GPU, whose device
    # memory is host memory): stored in the GPU pool, received as a depot.DeviceArray on the
    # GPU of the same UUID; no bytes on the comm.
    with depot.start_daemon(memory="256MiB", simulate_gpus="1:256MiB") as gpu_store:
        with _cluster(n_workers=2) as cluster, cluster.get_client() as dask_client:
            dask_client.register_plugin(depot.dask.DepotPlugin(socket=gpu_store.socket))
            dask_client.run(_clear_transfer_logs)
            first, second = sorted(dask_client.scheduler_info()["workers"])
            value = dask_client.submit(_device_array, 2 * MiB, 3, workers=[first])
            answer = dask_client.submit(_gpu_sum, value, workers=[second])
            assert answer.result(timeout=60) == ("DeviceArray", True, 3 * 2 * MiB)
            moved = _worker_transfers(dask_client)
            assert moved[first][2] == [value.key], moved  # sent, as a handle:
            assert sum(w for _, w, _ in moved.values()) < 4096, moved
            with gpu_store.client() as c:
                (gpu,) = c.status().gpus
                assert gpu.used_bytes >= 2 * MiB  # in the GPU pool
            # The sender now keeps the pool's copy too.
            kept = dask_client.run(_in_depot)
            assert kept[first] == kept[second] == [value.key]

            # Another library's CUDA array stays Dask's (a claimed copy would come back as
            # a DeviceArray, another type): it travels, and gathers, as Dask sends it.
            other = dask_client.submit(_fake_gpu_array, 2 * MiB, 5, workers=[first])
            taken = dask_client.submit(lambda x: type(x).__name__, other, workers=[second])
            assert taken.result(timeout=60) == "FakeCudaArray"
            assert int(other.result(timeout=60).array.sum()) == 5 * 2 * MiB
            del value, answer, other, taken
        assert _store_empties(gpu_store)


def _store_300mb(seed):
    return np.full(300 * MiB, seed, dtype=np.uint8)  # made in the worker, then kept in the store


def test_nanny_measures_private_memory(store):
    # A nanny limited to 600 MiB, whose worker holds two 300 MB results of the store and
    # reads them (which maps every page of them into it): its resident set passes the 95%
    # limit, its private memory does not, and the nanny with the plugin leaves it alone.
    with _cluster(n_workers=1, memory_limit="600MiB") as cluster, cluster.get_client() as c:
        c.register_plugin(depot.dask.DepotPlugin(socket=store.socket, keep="always"))
        c.register_plugin(depot.dask.DepotNannyPlugin())
        (address,) = c.scheduler_info()["workers"]
        pid = c.run(os.getpid)[address]
        first = c.submit(_store_300mb, 1)
        first.result(timeout=60)
        second = c.submit(_store_300mb, 2)
        second.result(timeout=60)
        both = c.submit(lambda x, y: int(x.sum()) + int(y.sum()), first, second)
        assert both.result(timeout=60) == 3 * 300 * MiB

        def measured(dask_worker):  # in the nanny: as plain Dask's and as the plugin's
            import psutil

            from depot.dask import _PrivateMemoryPsutil

            return (
                psutil.Process(pid).memory_info().rss,
                _PrivateMemoryPsutil(psutil).Process(pid).memory_info().rss,
            )

        rss, private = c.run(measured, nanny=True)[address]
        assert rss > 0.95 * 600 * MiB  # plain Dask's nanny would restart this worker ...
        assert private < 300 * MiB  # ... which holds nothing of its own
        assert list(c.run(os.getpid).values()) == [pid]  # and it was not restarted
        del first, second, both
    assert _store_empties(store)


def _one_transfer(dask_client, nbytes=2 * MiB):
    """Sends one result of ``nbytes`` from one worker to another; returns what the workers
    sent one another (see _transfers)."""
    dask_client.run(_clear_transfer_logs)
    first, second = sorted(dask_client.scheduler_info()["workers"])[:2]
    value = dask_client.submit(np.ones, (nbytes,), dtype=np.uint8, workers=[first])
    total = dask_client.submit(lambda x: int(x.sum()), value, workers=[second])
    assert total.result(timeout=60) == nbytes
    del value, total
    return _worker_transfers(dask_client)


def test_preload_attaches_workers_and_nannies(store, monkeypatch):
    monkeypatch.setenv("DEPOT_SOCKET", store.socket)
    monkeypatch.setenv("DEPOT_DASK_THRESHOLD", "64KiB")
    monkeypatch.setenv("DEPOT_DASK_KEEP", "always")
    with _cluster(
        n_workers=2, preload=["depot.dask"], preload_nanny=["depot.dask"]
    ) as cluster, cluster.get_client() as dask_client:
        dask_client.run(_clear_transfer_logs)
        small = dask_client.submit(np.ones, (16 * 1024,), key="64k")  # 128 KiB
        distributed.wait(small, timeout=60)
        assert len(dask_client.run(_in_depot)[dask_client.who_has(small)["64k"][0]]) == 1
        moved = _one_transfer(dask_client)
        total = sum(t for t, _, _ in moved.values())
        assert total >= 2 * MiB and sum(w for _, w, _ in moved.values()) < total / 100, moved
        wrapped = dask_client.run(
            lambda dask_worker: hasattr(
                dask_worker.periodic_callbacks["memory_monitor"].callback, "_depot_original"
            ),
            nanny=True,
        )
        assert list(wrapped.values()) == [True, True]
        del small
    assert _store_empties(store)


def _depotd_processes(socket):
    """The depotd processes listening on ``socket``, by their command lines."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"depotd" and os.fsencode(socket) in argv:
            found.append(int(pid))
    return found


def test_nanny_plugin_starts_one_daemon_per_host(tmp_path):
    socket = str(tmp_path / "depot.sock")
    with _cluster(n_workers=2) as cluster, cluster.get_client() as dask_client:
        dask_client.register_plugin(
            depot.dask.DepotNannyPlugin(start_daemon=True, memory="256MiB", socket=socket)
        )
        dask_client.register_plugin(depot.dask.DepotPlugin(socket=socket))
        assert len(_depotd_processes(socket)) == 1
        events = _depot_events(dask_client, 2)
        assert [e["attached"] for e in events] == [True, True], events
        moved = _one_transfer(dask_client)
        total = sum(t for t, _, _ in moved.values())
        assert total >= 2 * MiB and sum(w for _, w, _ in moved.values()) < total / 100, moved
        # Its pages are allocated as results use them (--no-prefault), not a whole segment
        # (256 MiB here) at a time and one more kept ready.
        (pid,) = _depotd_processes(socket)
        assert store_pages(pid) < 64 * MiB, store_pages(pid)
    # It stops with the last nanny that used it.
    assert wait_for(lambda: not _depotd_processes(socket), timeout=30)


def test_nanny_plugin_fails_loudly_without_a_working_depotd(tmp_path, monkeypatch):
    socket = str(tmp_path / "depot.sock")
    with _cluster(n_workers=1) as cluster, cluster.get_client() as dask_client:
        misconfigured = depot.dask.DepotNannyPlugin(start_daemon=True, memory="lots", socket=socket)
        with pytest.raises(Exception, match=r"could not start depotd(.|\n)*lots"):
            dask_client.register_plugin(misconfigured)

        monkeypatch.setenv("DEPOT_DAEMON", str(tmp_path / "no-depotd"))  # nannies run here
        missing = depot.dask.DepotNannyPlugin(start_daemon=True, memory="64MiB", socket=socket)
        missing.name = "depot-nanny-missing"
        with pytest.raises(Exception, match="could not start depotd(.|\n)*no-depotd"):
            dask_client.register_plugin(missing)
    assert not _depotd_processes(socket)


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a depotd as another user (needs root)")
def test_another_users_daemon_is_refused_loudly():
    import subprocess
    import tempfile

    directory = tempfile.mkdtemp(prefix="depot-nobody-")
    os.chmod(directory, 0o777)
    socket = os.path.join(directory, "depot.sock")
    other = subprocess.Popen(
        [depot.find_depotd(), "--socket", socket, "--memory", "64MiB", "--socket-mode", "0666"],
        user="nobody", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        from depot._daemon import _accepts

        assert wait_for(lambda: _accepts(socket), timeout=10)
        with _cluster(n_workers=1) as cluster, cluster.get_client() as dask_client:
            with pytest.raises(Exception, match="refusing to use .* runs as uid"):
                dask_client.register_plugin(depot.dask.DepotPlugin(socket=socket))
            with pytest.raises(Exception, match="refusing to use .* runs as uid"):
                dask_client.register_plugin(
                    depot.dask.DepotNannyPlugin(start_daemon=True, socket=socket)
                )
    finally:
        other.terminate()
        other.wait()
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def test_unregistering_the_plugin_detaches_workers(store):
    with _cluster(n_workers=2) as cluster, cluster.get_client() as dask_client:
        dask_client.register_plugin(depot.dask.DepotPlugin(socket=store.socket))
        assert sum(w for _, w, _ in _one_transfer(dask_client).values()) < 4096
        kept = dask_client.submit(np.ones, (2 * MiB,), dtype=np.uint8, key="kept")
        distributed.wait(kept, timeout=60)
        dask_client.unregister_worker_plugin("depot")
        # Plain Dask again: results stay in the workers' memory; what was stored before
        # still reads, and the comms opened while attached still take handles.
        assert dask_client.run(_in_depot) == {w: [] for w in dask_client.run(lambda: 0)}
        moved = _one_transfer(dask_client)
        assert sum(t for t, _, _ in moved.values()) >= 2 * MiB
        assert dask_client.submit(lambda x: int(x.sum()), kept).result(timeout=60) == 2 * MiB
        del kept
        assert _store_empties(store)
