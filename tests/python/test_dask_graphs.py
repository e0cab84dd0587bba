"""Dask graphs on depot's own scheduler (depot.dask.get, depot.dask.Scheduler): results equal
to Dask's threaded scheduler's, intermediates deleted as their readers finish, exceptions
re-raised with the worker's traceback, bad graphs refused before anything runs, a worker
killed mid-graph, Ctrl-C; and the store empty after each test."""

import operator
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
pd = pytest.importorskip("pandas")
dd = pytest.importorskip("dask.dataframe")

import depot  # noqa: E402
import depot.dask  # noqa: E402
from conftest import wait_for  # noqa: E402
from dask import delayed  # noqa: E402


@pytest.fixture(scope="module")
def scheduler():
    """Two Python worker processes on a private depotd, for the whole module."""
    with depot.dask.Scheduler(workers=2, memory="512MiB") as s:
        yield s


@pytest.fixture
def sched(scheduler):
    """The module's scheduler; each test must leave its store empty (values returned to the
    test view the store until collected, and workers let go of their inputs just after)."""
    yield scheduler
    import gc

    gc.collect()
    assert wait_for(lambda: scheduler.client.list() == [], timeout=30), scheduler.client.list()


def same(expr, sched):
    """Computes ``expr`` with depot's scheduler and Dask's threaded one; both results."""
    ours = expr.compute(scheduler=sched.get)
    theirs = expr.compute(scheduler="threads")
    return ours, theirs


def array():
    return da.random.RandomState(7).random((600, 600), chunks=150)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: ((x + 1) * 2 - 3) / 4 + x ** 2,
        lambda x: (x * x.T).sum(),
        lambda x: x.rechunk((60, 600)),
        lambda x: x.std(axis=0),
        lambda x: x.max(),
        lambda x: x.map_blocks(lambda b: b * 2 + 1),
        lambda x: x[10:500:3, ::7],
        lambda x: da.concatenate([x, x], axis=1).sum(axis=1),
    ],
    ids=["elementwise", "a-times-a-T-sum", "rechunk", "std", "max", "map_blocks", "slice",
         "concatenate"],
)
def test_dask_array_results_equal_the_threaded_schedulers(sched, make):
    ours, theirs = same(make(array()), sched)
    assert type(ours) is type(theirs)
    np.testing.assert_allclose(ours, theirs)


def test_dask_dataframe_results_equal_the_threaded_schedulers(sched):
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(
        {"k": rng.integers(0, 9, 2000), "v": rng.random(2000), "i": np.arange(2000)}
    )
    df = dd.from_pandas(frame, npartitions=5)
    ours, theirs = same(df.groupby("k").v.agg(["sum", "mean", "count"]), sched)
    pd.testing.assert_frame_equal(ours, theirs)
    ours, theirs = same(df.set_index("v"), sched)
    pd.testing.assert_frame_equal(ours, theirs)
    names = dd.from_pandas(pd.DataFrame({"k": range(9), "name": list("abcdefghi")}), npartitions=2)
    ours, theirs = same(df.merge(names, on="k"), sched)
    pd.testing.assert_frame_equal(
        ours.sort_values("i").reset_index(drop=True), theirs.sort_values("i").reset_index(drop=True)
    )


def test_delayed_graphs_and_several_collections_at_once(sched):
    @delayed
    def inc(i):
        return i + 1

    parts = [inc(i) for i in range(50)]
    total = delayed(sum)(parts)
    pairs = delayed(lambda *xs: dict(enumerate(xs)))(*parts[:3])
    values = dask.compute(total, pairs, parts[7], {"literal": 5}, scheduler=sched.get)
    assert values == (sum(range(1, 51)), {0: 1, 1: 2, 2: 3}, 8, {"literal": 5})


def test_a_task_reading_more_outputs_than_a_depot_task_has_inputs(sched):
    @delayed
    def inc(i):
        return i + 1

    n = 9000  # over 4,096: read through tasks that gather them
    assert delayed(sum)([inc(i) for i in range(n)]).compute(scheduler=sched.get) == n * (n + 1) // 2


def test_a_batch_that_ends_among_the_tasks_gathering_a_tasks_inputs_gives_none_of_them_up(
    sched, monkeypatch
):
    # 9,000 values in the graph (stored before any task is submitted), gathered by three
    # tasks (4,000 + 4,000 + 1,000) for the task that sums them, in batches of one task. The
    # sum is the last reader of every value; none may be given up until the gather reading
    # it is submitted, though the sum's place in the graph's order is reached with the first.
    n = 9000
    graph = {f"x{i}": i for i in range(n)}
    graph["total"] = (sum, [f"x{i}" for i in range(n)])
    monkeypatch.setattr(sched, "batch", 1)
    assert sched.get(graph, "total") == n * (n - 1) // 2


def test_legacy_graphs_with_aliases_literals_and_nested_tasks(sched):
    dsk = {
        "x": 1,
        "y": (operator.add, "x", 10),
        "alias": "y",
        "nested": (sum, [(operator.mul, "x", 3), "alias", (operator.neg, (operator.add, "y", 1))]),
        "unused": (operator.truediv, 1, 0),
    }
    assert depot.dask.get(dsk, "nested") == 3 + 11 - 12
    assert sched.get(dsk, ["alias", ["x", "y"]]) == [11, [1, 11]]


def test_intermediates_are_deleted_as_their_readers_finish(sched):
    # A chain whose every link is 8 MB: were intermediates kept, 40 of them would not fit
    # the daemon's 512 MiB without eviction; with each deleted after its reader, at most a
    # few exist at once, and none is evicted.
    x = da.ones((1000, 1000), chunks=(1000, 1000))
    for _ in range(40):
        x = x + 1
    before = sched.client.status()
    assert float(x.sum().compute(scheduler=sched.get)) == 41e6
    status = sched.client.status()
    assert status.evictions == before.evictions


def test_an_exception_in_a_task_is_re_raised_with_the_workers_traceback(sched):
    def divide(a, b):
        return a / b

    downstream = delayed(operator.add)(delayed(divide)(1, 0), 1)
    with pytest.raises(ZeroDivisionError) as raised:
        downstream.compute(scheduler=sched.get)
    note = "\n".join(getattr(raised.value, "__notes__", []))
    assert "on a worker" in note and "divide" in note and "Traceback" in note

    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    def raise_unpicklable():
        raise Unpicklable("odd")

    with pytest.raises(depot.DepotError, match="failed") as raised:
        delayed(raise_unpicklable)().compute(scheduler=sched.get)
    assert "Unpicklable" in "\n".join(raised.value.__notes__)


def test_bad_graphs_are_refused_before_anything_runs(sched):
    before = sched.client.status().scheduler.submitted
    with pytest.raises(depot.InvalidArgument, match="cycle"):
        sched.get({"a": (operator.neg, "b"), "b": (operator.neg, "a")}, "a")
    from dask._task_spec import Task, TaskRef

    with pytest.raises(depot.InvalidArgument, match="'missing', which is not in the graph"):
        sched.get({"a": Task("a", operator.neg, TaskRef("missing"))}, "a")
    with pytest.raises(depot.InvalidArgument, match="not in the graph"):
        sched.get({"a": 1}, ["a", "nowhere"])
    lock = threading.Lock()  # cannot be pickled
    with pytest.raises(depot.InvalidArgument, match="cannot be sent to a worker"):
        sched.get({"a": (operator.add, 1, 2), "b": (lambda x, l: x, "a", lock)}, "b")
    assert sched.client.status().scheduler.submitted == before


def test_a_worker_killed_mid_graph_has_its_task_retried():
    with depot.dask.Scheduler(workers=2) as s:
        started = os.path.join(os.path.dirname(s.client.socket), "started")

        def slow(i, path=started):
            import time

            open(path, "a").close()
            time.sleep(0.5)
            return i

        parts = [delayed(slow)(i) for i in range(4)]
        result = {}
        thread = threading.Thread(
            target=lambda: result.setdefault("v", delayed(sum)(parts).compute(scheduler=s.get))
        )
        thread.start()
        assert wait_for(lambda: os.path.exists(started), timeout=60)
        os.kill(s._daemon.workers[0], signal.SIGKILL)
        thread.join(120)
        assert result.get("v") == 6
        assert s.client.status().scheduler.retried >= 1
        assert wait_for(lambda: s.client.list() == [], timeout=30)


def test_ctrl_c_cancels_the_graph_and_leaves_the_store_as_it_was(sched):
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import dask, depot.dask
        from dask import delayed
        def slow(i):
            time.sleep(0.2)
            return i
        s = depot.dask.Scheduler(socket={sched.client.socket!r})
        print("computing", flush=True)
        try:
            delayed(sum)([delayed(slow)(i) for i in range(200)]).compute(scheduler=s.get)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(0)
        sys.exit(3)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert child.stdout.readline().strip() == "computing"
    assert wait_for(lambda: sched.client.status().scheduler.tasks_pending > 0, timeout=60)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0, out
    assert "interrupted" in out
    # Nothing of it runs any more, and all it made goes once its running tasks are done.
    assert wait_for(lambda: sched.client.status().scheduler.tasks_pending == 0, timeout=60)
    assert sched.client.status().scheduler.cancelled > 0


def test_a_scheduler_needs_workers_and_says_so():
    with depot.start_daemon(memory="64MiB") as d:
        with pytest.raises(depot.DepotError, match="no worker process is attached"):
            depot.dask.Scheduler(socket=d.socket)
    with pytest.raises(depot.InvalidArgument, match="workers"):
        depot.dask.Scheduler(workers=0)


def test_dask_local_callbacks_and_the_progress_bar_see_every_task(sched):
    import io

    from dask.callbacks import Callback
    from dask.diagnostics import ProgressBar

    seen = {"start": 0, "post": set(), "finish": None}

    class Counter(Callback):
        def _start(self, dsk):
            seen["start"] += 1

        def _posttask(self, key, result, dsk, state, worker_id):
            seen["post"].add(key)

        def _finish(self, dsk, state, errored):
            seen["finish"] = (len(state["finished"]), errored)

    parts = [delayed(operator.add)(i, 1) for i in range(40)]
    out = io.StringIO()
    with Counter(), ProgressBar(out=out, dt=0.01):
        assert delayed(sum)(parts).compute(scheduler=sched.get) == sum(range(1, 41))
    assert seen["start"] == 1
    assert len(seen["post"]) == 41 and seen["finish"] == (41, False)
    assert "100% Completed" in out.getvalue()


def test_callbacks_see_intermediates_whose_readers_finished_before_they_were_looked_at(sched):
    from dask.callbacks import Callback

    # One task a request: the first links of the chain, and their readers, are done long
    # before the last is submitted and the callbacks start to look.
    seen = set()

    class Counter(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            seen.add(key)

    chain = delayed(operator.add)(0, 1)
    for _ in range(30):
        chain = delayed(operator.add)(chain, 1)
    one_by_one = depot.dask.Scheduler(socket=sched.client.socket, batch=1, fuse=False)
    result = {}

    def compute():
        with Counter():
            result["value"] = chain.compute(scheduler=one_by_one.get)

    thread = threading.Thread(target=compute, daemon=True)
    thread.start()
    thread.join(120)
    one_by_one.close()
    assert not thread.is_alive(), "the callbacks waited for an intermediate deleted already"
    assert result["value"] == 31 and len(seen) == 31


def test_callables_a_graph_shares_are_stored_once_a_graph_and_go_with_it(sched, monkeypatch):
    from depot import _dask_graphs

    stored = []
    store = _dask_graphs._Functions.store

    def counting(self, data):
        stored.append(data)
        return store(self, data)

    monkeypatch.setattr(_dask_graphs._Functions, "store", counting)
    offset = 3

    def shift(b):  # a closure of the test module: pickle cannot name it, so it goes by value
        return b + offset

    def run(chunks):
        del stored[:]
        x = da.ones((400, 400), chunks=chunks).map_blocks(shift).map_blocks(lambda b: b * 2)
        assert float(x.sum().compute(scheduler=sched.get)) == 400 * 400 * 8
        return len(stored)

    # 16 blocks or 256: the closure, the lambda and da.ones's curried function are each
    # stored once a graph, not once a task; the fixture checks that they are gone from the
    # store after the run.
    assert 2 <= run(100) == run(25) <= 4


def test_a_graph_of_100000_tasks_runs_in_batches(sched):
    # 100,000 tasks of dask.array (a 1000 × 100 grid of tiny chunks, a sum); the graph is
    # submitted in batches of the scheduler's size, with no round trip a task.
    before = sched.client.status().scheduler.submitted
    x = da.ones((1000, 100), chunks=1)
    total = (x + 1).sum()
    assert len(dict(total.__dask_graph__())) > 100_000
    assert float(total.compute(scheduler=sched.get)) == 2 * 1000 * 100
    assert sched.client.status().scheduler.submitted - before >= 100_000


def test_a_graph_past_the_clients_metadata_limit_waits_for_room_instead_of_failing(monkeypatch):
    from depot import _dask_graphs

    waits = []
    make_room = _dask_graphs._Run.make_room
    monkeypatch.setattr(
        _dask_graphs._Run, "make_room", lambda run: waits.append(1) or make_room(run)
    )
    # The daemon keeps at most 200 KiB of this client's tasks at once; the graph's tasks take
    # 9 MB, and one request of them up to 256 KiB: batches are halved, and submitted as
    # earlier tasks end.
    with depot.start_daemon(
        "256MiB", args=["--client-max-metadata", "200KiB"], workers=2, prefault=False
    ) as d:
        with depot.dask.Scheduler(socket=d.socket) as s:
            padding = "p" * 3000  # in every task's arguments

            @delayed
            def inc(i, pad):
                return i + 1

            parts = [inc(i, padding + str(i)) for i in range(3000)]
            sums = [delayed(sum)(parts[i : i + 100]) for i in range(0, 3000, 100)]
            assert delayed(sum)(sums).compute(scheduler=s.get) == sum(range(1, 3001))
            assert waits, "the limit was never reached: the test tests nothing"
            assert wait_for(lambda: s.client.status().objects_on_host == 0, timeout=30)
            # One task past the limit on its own (its arguments name 3,000 keys): refused,
            # with the daemon's reason, and nothing of the graph is left.
            with pytest.raises(depot.LimitExceeded, match="client-max-metadata"):
                delayed(sum)(parts).compute(scheduler=s.get)
            assert wait_for(lambda: s.client.status().objects_on_host == 0, timeout=30)


def _room_waits(client):
    """The daemon's counts of outputs that waited for room: begun, failed."""
    import re

    metrics = client.metrics()
    return tuple(
        int(re.search(rf"\n{name} (\d+)", metrics).group(1))
        for name in ("depot_task_output_room_waits_total",
                     "depot_task_output_room_waits_failed_total")
    )


def _blocks_of(n):
    """Delayed functions making block ``i`` (``n`` doubles of ``i``) and summing one; made
    here, so that they travel by value (workers cannot import tests)."""

    @delayed
    def block(i):
        return np.full(n, float(i))

    @delayed
    def total(b):
        return float(b.sum())

    return block, total


def test_outputs_wait_for_room_others_free_and_a_graph_that_cannot_fit_says_so():
    # 5 MiB results in a store of 12 MiB: two fit beside each other, not three.
    mib5 = 5 * 2**20 // 8
    # Unfused: each block is stored, not made inside its reader. One worker: the order in
    # which tasks run is the scheduler's alone.
    with depot.dask.Scheduler(workers=1, memory="12MiB", fuse=False) as s:
        block, total = _blocks_of(mib5)
        # Each block is read once, then goes: blocks made while two others wait for their
        # readers wait for room instead of failing. The first three outrank every reader
        # (depot runs the readers of data first among tasks alike): the third is made while
        # the first two wait for theirs, and must wait for room, lending the worker to the
        # first reader.
        # Each block a kind of its own (its key's name): none is expected to make what
        # another made, so each finds the store full only when it creates its output.
        with dask.annotate(priority=10):
            first = [block(i, dask_key_name=f"block{i}") for i in range(3)]
        blocks = first + [block(i, dask_key_name=f"block{i}") for i in range(3, 8)]
        sums = [total(b) for b in blocks]
        assert dask.compute(*sums, scheduler=s.get) == tuple(float(i * mib5) for i in range(8))
        begun, failed = _room_waits(s.client)
        assert begun >= 1 and failed == 0, "no output waited: the test tests nothing"
        assert wait_for(lambda: s.client.status().objects_on_host == 0, timeout=30)

        # Three blocks kept at once, as results: the third can never be made. The graph stops
        # with the daemon's reason instead of waiting forever, and leaves nothing behind.
        with pytest.raises(depot.TaskFailed, match="every task that runs waits for room too"):
            dask.compute(block(1), block(2), block(3), scheduler=s.get)
        assert _room_waits(s.client)[1] >= 1
        import gc

        gc.collect()
        assert wait_for(lambda: s.client.status().objects_on_host == 0, timeout=30)


def test_intermediates_that_cannot_all_fit_spill_to_disk_where_there_is_a_spill_directory(
    tmp_path,
):
    # The graph above, every block made before any is read (all outrank the readers): 40 MiB
    # of blocks in a store of 12 MiB, which holds two. With a spill directory the blocks
    # that wait for their readers go to disk (the graph's hold on each moves there with it)
    # and come back when read (a restore waits for the room a prefetch's copy will leave);
    # the graph completes with the values it would have had in memory.
    mib5 = 5 * 2**20 // 8
    with depot.dask.Scheduler(
        workers=1, memory="12MiB", spill_dir=tmp_path / "spill", fuse=False
    ) as s:
        block, total = _blocks_of(mib5)
        with dask.annotate(priority=10):
            blocks = [block(i, dask_key_name=f"block{i}") for i in range(8)]
        sums = [total(b) for b in blocks]
        assert dask.compute(*sums, scheduler=s.get) == tuple(float(i * mib5) for i in range(8))
        disk = s.client.status().disk
        assert disk.spills >= 3 and disk.restores >= 3, disk
        assert _room_waits(s.client)[1] == 0
        assert wait_for(lambda: s.client.list() == [], timeout=30)


def _filler():
    """A function making a chunk of a map_blocks array, filled with its block's number (row *
    10 + column); made here, so that it travels by value (workers cannot import tests)."""

    def filled(block_info=None):
        row, column = block_info[None]["chunk-location"]
        return np.full(block_info[None]["chunk-shape"], float(row * 10 + column))

    return filled


def _pairs(blocks, side):
    """The #7449 problem, (a * a.T).sum(), on ``blocks`` x ``blocks`` blocks of ``side`` x
    ``side`` doubles; and its value."""
    a = da.map_blocks(_filler(), chunks=((side,) * blocks,) * 2, dtype=float)
    value = sum(
        float(i * 10 + j) * float(j * 10 + i) * side * side
        for i in range(blocks) for j in range(blocks)
    )
    return (a * a.T).sum(), value


def test_array_tasks_declare_their_chunks_so_no_output_waits_for_room():
    # 16 blocks of 2 MiB in a store of 12 MiB, each read by two tasks: (i, j) and (j, i).
    # Each producer declares its chunk (shape and dtype from the graph), and the daemon
    # starts one only where its output has room beside what is held and what the tasks
    # placed before it declared: no worker is left holding a result the store cannot take.
    # (Without the declarations, 3 to 11 outputs a run waited for room here.)
    x, value = _pairs(4, 512)
    with depot.dask.Scheduler(workers=2, memory="12MiB") as s:
        for _ in range(3):
            assert dask.compute(x, scheduler=s.get)[0] == value
        assert _room_waits(s.client) == (0, 0)
        assert wait_for(lambda: s.client.status().objects_on_host == 0, timeout=30)


def test_plan_projects_the_peak_from_the_graphs_metadata_before_anything_runs():
    x, _ = _pairs(4, 512)  # 2 MiB blocks
    plan = depot.dask.plan(x, memory="12MiB")
    assert plan.fits and plan.memory == 12 * 2**20
    # The blocks off the diagonal are stored, each read by two products; those on it are
    # fused with their product (filled-sum-...).
    (made,) = [s for s in plan.stages if s.name.startswith("filled-") and "sum" not in s.name]
    assert made.tasks == 12 and made.each == 2 * 2**20 and made.total == 24 * 2**20
    assert made.known
    # The first stage of the sum reduces each block to one number (keepdims), fused with
    # the product: it makes 8 bytes, not a block.
    assert max(s.each for s in plan.stages if s is not made) < 1024
    # Consumers run before more producers: two blocks and a pair's reader at most, not 16.
    assert 4 * 2**20 <= plan.peak <= 6 * 2**20, plan.peak
    assert plan.largest[1] >= 4 * 2**20  # a product reads two blocks
    text = str(plan)
    assert "fits" in text and "filled" in text and "tasks" in text

    # Below what the largest task needs at once: no order fits, and the stage is named.
    tight = depot.dask.plan(x, memory=3 * 2**20)
    assert not tight.fits
    assert "needs 4.0 MiB at once" in tight.reason() and "stage" in tight.reason()
    assert "does not fit" in str(tight) and "does not fit" in repr(tight)

    # A task without metadata counts as the sum of its inputs.
    listed = depot.dask.plan(delayed(list)([delayed(np.zeros)(1000) for _ in range(3)]))
    assert listed.unknown == listed.tasks and listed.peak >= 0

    for bad in ("lots", "-1GiB", 0, -5, True, 1.5, None.__class__):
        with pytest.raises(depot.InvalidArgument, match="memory is a size"):
            depot.dask.plan(x, memory=bad)
    with pytest.raises(depot.InvalidArgument, match="dask collections"):
        depot.dask.plan(np.zeros(3))


def test_check_refuses_a_graph_that_cannot_fit_before_anything_runs():
    x, value = _pairs(4, 512)
    whole = da.map_blocks(_filler(), chunks=((512,) * 4,) * 2, dtype=float)  # a 32 MiB result
    with depot.dask.Scheduler(workers=1, memory="12MiB", check=True) as s:
        assert s.memory == s.client.status().capacity_bytes
        ours, default = s.plan(x), depot.dask.plan(x)  # default: the with block's bound
        assert ours.memory == default.memory == s.memory and ours.peak == default.peak
        assert dask.compute(x, scheduler=s.get)[0] == value
        submitted = s.client.status().scheduler.submitted
        with pytest.raises(depot.StoreFull, match="cannot run within its bound.*stage") as e:
            dask.compute(whole, scheduler=s.get)
        assert isinstance(e.value, MemoryError)
        assert s.client.status().scheduler.submitted == submitted, "something was submitted"
        # check=False for this graph: it runs, and meets the store's own limit.
        with pytest.raises(depot.TaskFailed):
            dask.compute(whole, scheduler=s.get, check=False)
        import gc

        gc.collect()
        assert wait_for(lambda: s.client.status().objects_on_host == 0, timeout=30)
    with pytest.raises(depot.InvalidArgument, match="memory is a size"):
        depot.dask.Scheduler(socket="/nonexistent", memory="lots")


class _PeakUsed:
    """While inside, samples the store's used bytes every millisecond: ``peak`` is the most."""

    def __init__(self, socket):
        self.socket, self.peak, self.stop = socket, 0, threading.Event()
        self.thread = threading.Thread(target=self._sample)

    def _sample(self):
        with depot.Client(self.socket) as watcher:
            while not self.stop.is_set():
                self.peak = max(self.peak, watcher.status().used_bytes)
                self.stop.wait(0.001)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_a_graphs_bound_on_a_shared_daemon_is_kept_and_one_it_cannot_hold_says_so(sched):
    # The module's daemon (512 MiB, two workers) is shared: memory= bounds each graph's use
    # of it. Blocks of 2 MiB, a product reading two: unbounded, the daemon ran 6 to 8 blocks
    # at once here; bounded to 6 MiB, the store never holds more than that.
    x, value = _pairs(4, 512)
    with depot.dask.Scheduler(socket=sched.client.socket, memory="6MiB") as bounded:
        with _PeakUsed(sched.client.socket) as used:
            assert dask.compute(x, scheduler=bounded.get)[0] == value
        assert 0 < used.peak <= 6 * 2**20, used.peak

    # 3 MiB holds one block and not a second beside it: the graph fails, naming the task,
    # its size and the bound, instead of waiting for ever.
    with depot.dask.Scheduler(socket=sched.client.socket, memory="3MiB") as tight:
        with pytest.raises(depot.TaskFailed) as failure:
            dask.compute(x, scheduler=tight.get)
    for part in ("('filled-", "its declared output of 2.00 MiB does not fit its graph's memory "
                 "bound of 3.00 MiB", "no task of the graph runs"):
        assert part in str(failure.value), str(failure.value)


def _paired_blocks(count, doubles):
    """``count`` blocks of ``doubles`` doubles, made in order before any is read (they outrank
    their readers), block i read with block count - 1 - i: nothing can be read until the last
    block is made. The sums of the pairs, and their values."""

    @delayed
    def block(i):
        return np.full(doubles, float(i))

    @delayed
    def pair(a, b):
        return float(a.sum() + b.sum())

    blocks = []
    for i in range(count):  # in order: the first read is made last
        with dask.annotate(priority=count + 10 - i):
            blocks.append(block(i, dask_key_name=f"block-{i}"))
    pairs = [pair(blocks[i], blocks[count - 1 - i]) for i in range(count // 2)]
    return pairs, tuple(float((count - 1) * doubles) for _ in pairs)


def test_a_bound_on_a_daemon_with_a_spill_directory_moves_its_outputs_to_disk(sched, tmp_path):
    # Eight blocks of 2 MiB, every one made before any is read, in a bound of 6 MiB on a
    # shared daemon. Without a spill directory (the module's daemon) three blocks fill the
    # bound and nothing of the graph runs that could free one: it stops, saying so.
    mib2 = 2 * 2**20 // 8
    pairs, values = _paired_blocks(8, mib2)
    with depot.dask.Scheduler(socket=sched.client.socket, memory="6MiB", fuse=False) as bounded:
        with pytest.raises(depot.TaskFailed, match="could move to disk"):
            dask.compute(*pairs, scheduler=bounded.get)
    # With one, the bound counts what is in memory: when nothing of the graph runs and a
    # block does not fit, the oldest go to disk and come back when read. The graph completes
    # with its store never holding more than the bound.
    with depot.dask.Scheduler(workers=1, memory="64MiB", spill_dir=tmp_path / "spill") as d:
        with depot.dask.Scheduler(socket=d.client.socket, memory="6MiB", fuse=False) as bounded:
            with _PeakUsed(d.client.socket) as used:
                assert dask.compute(*pairs, scheduler=bounded.get) == values
        assert 0 < used.peak <= 6 * 2**20, used.peak
        disk = d.client.status().disk
        assert disk.spills >= 2 and disk.restores >= 2, disk
        assert wait_for(lambda: d.client.list() == [], timeout=30)


def test_fused_chains_of_elementwise_operations_run_a_slab_at_a_time_on_the_workers(sched):
    # Ten elementwise operations and a sum on 8 MiB chunks: Dask fuses each chunk's chain into
    # one task; depot's workers run it a slab at a time (depot._dask_tiling, whose own tests
    # check the values and the temporaries task by task). The nodes sent name depot's runner
    # in place of Dask's where depot's fusion is on, and not with fuse=False; the values are
    # the threaded scheduler's.
    from dask._task_spec import Task, _execute_subgraph

    from depot._dask_graphs import _Functions

    a = da.random.default_rng(9).random((2048, 2048), chunks=1024)
    b = np.exp(np.sin(np.abs(np.log(np.sqrt((a + 1) * 2)) - 0.25)) ** 2) / 3
    x = (b.sum(), (a * a.T).sum(), b.max(axis=1))
    want = dask.compute(*x, scheduler="threads")
    for fuse in (True, False):
        with depot.dask.Scheduler(socket=sched.client.socket, fuse=fuse) as s:
            got = dask.compute(*x, scheduler=s.get)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12)
        del got
    dsk = dict(b.sum().__dask_optimize__(b.sum().__dask_graph__(), b.sum().__dask_keys__()))
    node = next(v for v in dsk.values() if isinstance(v, Task) and v.func is _execute_subgraph)
    functions = _Functions(sched.client)
    plain = functions.dumps(node)
    functions.tiled = True
    assert b"_tiled" in functions.dumps(node) and b"_tiled" not in plain


def _bytes_in(client):
    """Bytes of objects the daemon created in host memory so far."""
    import re

    return int(re.search(r'\ndepot_bytes_in_total\{tier="host"\} (\d+)', client.metrics()).group(1))


def test_a_tree_reductions_levels_fold_into_the_next_while_they_fit_the_bound():
    # a.sum(axis=0) of 64 rows of 1 MiB, built with split_every=2: six levels of partial
    # sums of 1 MiB each. The levels fold into the level above while the task's inputs fit
    # an eighth of its share of the bound (memory over the workers): in 2 GiB (128 MiB) every
    # partial sum is made inside the one aggregate, which reads the 64 rows' sums (a fan-in
    # of 64); in 512 MiB (32 MiB) a task reads about thirty, and a few partial tasks stay.
    # Results as unfused.
    a = da.random.default_rng(5).random((64, 131072), chunks=(1, 131072))
    total = a.sum(axis=0, split_every=2)
    want = total.compute(scheduler="sync")
    partials = {}
    for memory in ("2GiB", "512MiB"):
        with depot.dask.Scheduler(workers=2, memory=memory) as s:
            got = total.compute(scheduler=s.get)
            np.testing.assert_allclose(got, want, rtol=1e-12)
            del got
            ran = [t.label for t in s.client.tasks()]
            partials[memory] = sum("-partial-" in label for label in ran)
            assert wait_for(lambda: s.client.list() == [], timeout=30)
        plan = depot.dask.plan(total, memory=memory, workers=2)
        assert plan.fits and plan.fused
    assert partials["2GiB"] == 0
    assert 0 < partials["512MiB"] < 63, partials  # 63: every level's every task, unfused
    unfused = depot.dask.plan(total, memory="2GiB", workers=2, fuse=False)
    assert sum("-partial-" in stage.name for stage in unfused.stages) >= 5  # as built


def test_slices_run_inside_the_tasks_that_read_them_and_are_never_stored(sched):
    def graph():
        # Six row blocks rechunked into six column blocks: each output block is made of a
        # slice of every input block (36 "splits", 320 KB each), then two elementwise steps
        # and a sum that Dask fuses into the merge.
        a = da.random.RandomState(3).random((1200, 1200), chunks=(200, 1200))
        return ((a.rechunk((1200, 200), method="tasks") + 1) * 2).sum(axis=0)

    plan = sched.plan(graph())
    (fused,) = plan.fused
    assert fused.stage.startswith("rechunk-split") and fused.into.startswith("rechunk-merge")
    assert fused.tasks == 36 and fused.bytes == 1200 * 1200 * 8
    assert "36 tasks of rechunk-split" in str(plan)
    expected = graph().compute(scheduler="threads")

    before = _bytes_in(sched.client)
    np.testing.assert_allclose(dask.compute(graph(), scheduler=sched.get)[0], expected)
    middle = _bytes_in(sched.client)
    np.testing.assert_allclose(dask.compute(graph(), scheduler=sched.get, fuse=False)[0], expected)
    after = _bytes_in(sched.client)
    # Unfused, the splits are stored as well: 11 MB more made in the store.
    assert (after - middle) - (middle - before) >= 1200 * 1200 * 8, (before, middle, after)

    # A bound whose share a worker cannot hold a merge and one input block in fuses nothing.
    assert depot.dask.plan(graph(), memory=6 * 2**20, workers=2).fused == []
    # Chains fuse too: a task that is the only input of its one reader runs inside it.
    chain = delayed(operator.add)(0, 1)
    for _ in range(30):
        chain = delayed(operator.add)(chain, 1)
    linked = sched.plan(chain)
    assert sum(f.tasks for f in linked.fused) == 30 and linked.tasks == 1
    assert chain.compute(scheduler=sched.get) == 31
    with pytest.raises(depot.InvalidArgument, match="workers is a count"):
        depot.dask.plan(chain, workers=0)


def test_a_block_that_branches_and_joins_again_runs_as_one_task(sched):
    # One value read by two tasks whose results are joined: fused, the branches are never
    # stored. A join of two sources is not: its inputs may run on two workers at once.
    start = delayed(operator.add)(1, 2)
    diamond = delayed(operator.add)(delayed(operator.mul)(start, 3), delayed(operator.neg)(start))
    plan = sched.plan(diamond)
    assert plan.tasks == 1 and sum(f.tasks for f in plan.fused) == 3, plan
    assert diamond.compute(scheduler=sched.get) == 6
    two = delayed(operator.mul)(delayed(operator.add)(1, 2), delayed(operator.add)(3, 4))
    assert sched.plan(two).tasks == 3 and sched.plan(two).fused == []
    assert two.compute(scheduler=sched.get) == 21
    # Nor are blocks a reduction combines: eight sources.
    total = delayed(sum)([delayed(operator.add)(i, 1) for i in range(8)])
    assert sched.plan(total).tasks == 9 and total.compute(scheduler=sched.get) == 36

    # A frame's key column computed apart and assigned back, then grouped by it: each
    # partition's eight tasks run as one, and only its partial aggregate is stored.
    import dask.dataframe as dd

    def grouped():
        rows = da.random.RandomState(0).random_sample((40_000, 4), chunks=(10_000, 4))
        frame = dd.from_dask_array(rows, columns=["a", "b", "c", "d"])
        frame = frame.assign(k=(frame["b"] * 10).astype("int64"))
        return frame.groupby("k").agg({"a": "mean", "c": "sum"}, split_out=1)

    plan = sched.plan(grouped())
    unfused = depot.dask.plan(grouped(), memory="512MiB", workers=2, fuse=False)
    assert plan.tasks == 5 and unfused.tasks > 30, (plan, unfused)
    before = _bytes_in(sched.client)
    ours = grouped().compute(scheduler=sched.get)
    made = _bytes_in(sched.client) - before
    pd.testing.assert_frame_equal(ours, grouped().compute(scheduler="threads"))
    assert made < 40_000 * 8, made  # partial aggregates; not the columns (1.3 MB)
    del ours


def _by_value():
    """Functions for graphs, made here so that they travel by value (workers cannot import
    tests): a shuffle's split, four groups of 1 MB by their names; and the identity."""

    def groups(seed):
        rng = np.random.default_rng(seed)
        return {name: rng.random(131072) for name in "abcd"}

    def same(x):
        return x

    return groups, same


_groups, _same = _by_value()


def test_items_of_a_tasks_value_are_made_as_its_outputs_and_their_tasks_never_run(sched):
    # Each of six tasks makes four groups that four item tasks take apart (getitem with a
    # constant, as a task-based shuffle's splits do), and each group is summed. The six
    # tasks are run with an output per group: their dicts are never stored, and the 24
    # item tasks never run.
    dsk = {}
    for i in range(6):
        dsk[("group-x", i)] = (_groups, i)
        for name in "abcd":
            dsk[("split-x", i, name)] = (operator.getitem, ("group-x", i), name)
            dsk[("sum-x", i, name)] = (np.sum, ("split-x", i, name))
    keys = [("sum-x", i, name) for i in range(6) for name in "abcd"]
    want = list(dask.get(dsk, keys))
    before = _bytes_in(sched.client)
    assert sched.get(dsk, keys) == want
    made = _bytes_in(sched.client) - before
    labels = [t.label for t in sched.client.tasks()]
    assert not any("split-x" in label for label in labels), labels
    assert sum("group-x" in label for label in labels) == 6
    assert made < 6 * 4 * 1_100_000, made  # each group stored once, no dict besides

    # An item asked for is a result; one the value lacks raises in the tasks reading it.
    assert np.array_equal(sched.get(dsk, [("split-x", 2, "c")])[0], _groups(2)["c"])
    dsk[("split-x", 5, "z")] = (operator.getitem, ("group-x", 5), "z")
    dsk[("sum-x", 5, "z")] = (np.sum, ("split-x", 5, "z"))
    with pytest.raises(KeyError, match="z"):
        sched.get(dsk, [("sum-x", 5, "z")])
    # A value read whole too is stored whole, and the items run as tasks; so too unfused.
    dsk[("all-x", 1)] = (len, ("group-x", 1))
    assert sched.get(dsk, [("all-x", 1), ("sum-x", 1, "a")]) == [4, want[4]]
    assert sched.get(dsk, keys, fuse=False) == want
    assert any("split-x" in t.label for t in sched.client.tasks())
    # Callbacks see the split tasks and their items end.
    finished = []
    with dask.callbacks.Callback(posttask=lambda key, *_: finished.append(key)):
        assert sched.get(dsk, keys[:8]) == want[:8]
    assert {("group-x", 0), ("split-x", 0, "a"), ("sum-x", 1, "d")} <= set(finished)
    assert len(finished) == len(set(finished)) == 2 + 8 + 8

    # A task-based shuffle: its splits are no stage of the plan, its results as Dask's.
    frame = pd.DataFrame({"a": np.arange(4000.0)[::-1], "b": np.arange(4000) % 7})
    shuffled = dd.from_pandas(frame, npartitions=8).set_index("a", shuffle_method="tasks")
    stages = [stage.name for stage in sched.plan(shuffled).stages]
    assert any(name.startswith("group-") for name in stages), stages
    assert not any(name.startswith("split-") for name in stages), stages
    pd.testing.assert_frame_equal(*same(shuffled, sched))


_SHUFFLE_BLOCKS = """
import threading
import dask, numpy as np, pandas as pd, dask.dataframe as dd, depot.dask

def method():
    return dask.config.get("dataframe.shuffle.method", None)

assert method() is None
with depot.dask.Scheduler(workers=1) as s:
    assert method() == "tasks"
    frame = pd.DataFrame({"a": np.arange(300.0)[::-1], "b": np.arange(300) % 7})
    shuffled = dd.from_pandas(frame, npartitions=3).set_index("a")
    with dask.config.set(scheduler=s.get):
        stages = [stage.name for stage in s.plan(shuffled).stages]
        assert any(name.startswith("group-") for name in stages), stages
        pd.testing.assert_frame_equal(shuffled.compute(), frame.set_index("a").sort_index())
assert method() is None
# Blocks that do not nest (another thread's, or closed out of order): set while any is open.
a, b = depot.dask.Scheduler(workers=1), depot.dask.Scheduler(workers=1)
a.__enter__(); b.__enter__(); a.__exit__(None, None, None)
assert method() == "tasks"
b.__exit__(None, None, None)
assert method() is None
# What the user configured, before or during a block, is theirs.
with dask.config.set({"dataframe.shuffle.method": "disk"}):
    with depot.dask.Scheduler(workers=1):
        assert method() == "disk"
    assert method() == "disk"
with depot.dask.Scheduler(workers=1):
    dask.config.set({"dataframe.shuffle.method": "p2p"})
assert method() == "p2p"
print("ok")
"""


def test_dataframes_shuffle_by_tasks_while_a_schedulers_block_is_open_unless_configured():
    # In a process of its own: this module's scheduler keeps a block open meanwhile.
    run = subprocess.run(
        [sys.executable, "-c", _SHUFFLE_BLOCKS], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_items_that_could_overlap_or_are_equal_or_missing(sched, monkeypatch):
    # Forty slices of one 8 MB array: split, they would be forty copies (300 MB, past the
    # 512 MiB store's room with the rest); unsplit, each is a view taken in its reader.
    dsk = {"t": (np.arange, 1_000_000.0)}
    for i in range(40):
        dsk[("s", i)] = (operator.getitem, "t", slice(i * 1000, None))
        dsk[("r", i)] = (np.sum, ("s", i))
    keys = [("r", i) for i in range(40)]
    before = _bytes_in(sched.client)
    assert sched.get(dsk, keys) == list(dask.get(dsk, keys))
    assert _bytes_in(sched.client) - before < 20_000_000
    # Twenty readers of the same item: one output, kept until the last of them is done,
    # although the batches holding the first readers end before the later ones are
    # submitted.
    dsk = {"t": (_groups, 0)}
    for i in range(20):
        dsk[("s", i)] = (operator.getitem, "t", "a")
        dsk[("r", i)] = (np.sum, ("s", i))
    keys = [("r", i) for i in range(20)]
    submit = depot._dask_graphs._Run.submit_batch

    submitted = []

    def batch_by_batch(run, batch):
        submit(run, batch)
        readers = [t["outputs"][0] for t in batch if t["label"].startswith("('r'")]
        assert all(run.client._native.wait(readers, len(readers), 30_000))
        submitted.extend(readers)
        if len(submitted) < 20:  # not given up (deleted once its readers are done) yet
            assert run.refs[("s", 0)] not in run.given_refs

    before = _bytes_in(sched.client)
    with monkeypatch.context() as patch:
        patch.setattr(depot._dask_graphs._Run, "submit_batch", batch_by_batch)
        patch.setattr(sched, "batch", 3)
        assert sched.get(dsk, keys) == list(dask.get(dsk, keys))
    assert len(submitted) == 20
    assert _bytes_in(sched.client) - before < 2_000_000  # one group of 1 MB
    # An item that cannot be taken is raised under its own key.
    dsk = {"t": (_groups, 0), ("item", "z"): (operator.getitem, "t", "z")}
    dsk["n"] = (len, ("item", "z"))
    with pytest.raises(KeyError) as raised:
        sched.get(dsk, ["n"])
    assert "('item', 'z')" in "".join(getattr(raised.value, "__notes__", [])), raised.value


def test_a_task_annotated_to_run_on_a_gpu_is_not_split():
    with depot.dask.Scheduler(
        workers=2, gpus=1, simulate_gpus="1:64MiB", memory="128MiB"
    ) as s:
        a = delayed(np.arange)(1000.0)
        with dask.annotate(resources={"GPU": 1}):
            on_gpu = delayed(_same)(a)
        assert dask.compute(*[on_gpu[i * 10] for i in range(3)], scheduler=s.get) == (0, 10, 20)
        assert wait_for(lambda: s.client.list() == [], timeout=30)


def test_depotctl_tasks_shows_each_tasks_dask_key(sched):
    import shutil

    # The tasks stay listed a while after they finish: their labels are their Dask keys.
    dsk = {"first-key": (operator.add, 1, 2), ("second", 1): (operator.neg, "first-key")}
    assert sched.get(dsk, ("second", 1), fuse=False) == -3
    labels = {t.label for t in sched.client.tasks()}
    assert {"first-key", "('second', 1)"} <= labels, labels
    depotctl = shutil.which("depotctl") or os.path.join(os.path.dirname(sys.executable), "depotctl")
    out = subprocess.run(
        [depotctl, "--socket", sched.client.socket, "tasks"], capture_output=True, text=True,
        check=True,
    ).stdout
    assert "LABEL" in out and "('second', 1)" in out, out


def test_tasks_annotated_with_a_gpu_run_on_one_with_their_arrays_there():
    # Simulated GPUs (this machine has none): the first worker has GPU 0.
    with depot.dask.Scheduler(workers=2, gpus=1, simulate_gpus="1:64MiB", memory="256MiB") as s:

        @delayed
        def make():
            return np.arange(1000.0)

        @delayed
        def where(x):
            return depot.task_device(), type(x).__name__, getattr(x, "shape", None)

        @delayed
        def scale(x):
            return x.shape

        a = make()
        with dask.annotate(resources={"GPU": 1}, priority=5):
            on_gpu = where(a)
            shaped = scale(a)
        on_host = where(a)
        got = dask.compute(on_gpu, shaped, on_host, scheduler=s.get)
        assert got[0] == (0, "DeviceArray", (1000,))  # CuPy is not installed here
        assert got[1] == (1000,)
        assert got[2] == (None, "ndarray", (1000,))
        placed = {t.label: t.device for t in s.client.tasks()}
        assert placed[str(on_gpu.key)] == 0 and placed[str(on_host.key)] == -1, placed

        before = s.client.status().scheduler.submitted
        for resources in ({"GPU": "lots"}, {"GPU": 2}, {"CPU": -1}, {"ssd": float("nan")}):
            with dask.annotate(resources=resources):
                bad = where(make())
            with pytest.raises(depot.InvalidArgument, match="annotated with resources"):
                bad.compute(scheduler=s.get)
        with dask.annotate(retries=101):
            bad = where(make())
        with pytest.raises(depot.InvalidArgument, match="retries 101: .* from 0 to 100"):
            bad.compute(scheduler=s.get)
        # (Dask itself refuses a priority that is no number.)
        assert s.client.status().scheduler.submitted == before
        assert wait_for(lambda: s.client.list() == [], timeout=30)


@pytest.fixture
def gpu_forms(monkeypatch):
    """dask_gpu_forms's functions given their GPU forms, and its directory on the workers'
    path (they import it by name)."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    import dask_gpu_forms as f

    pairs = [(f.double_slowly, f.double_on_gpu), (f.inc, f.inc_on_gpu_slowly),
             (f.scale, f.scale_on_gpu), (f.block_sum, f.block_sum_on_gpu)]
    for cpu, gpu in pairs:
        depot.dask.register_gpu(cpu, gpu)
    yield f
    for cpu, _ in pairs:
        depot.dask.unregister_gpu(cpu)


def _variants(client, layer):
    """The variant ("cpu" or "gpu") each task of a layer ran, from the daemon's task list."""
    return [(t.variant, t.device) for t in client.tasks() if t.label.startswith(f"('{layer}',")]


def test_each_layer_runs_where_its_gpu_form_or_its_cpu_form_was_measured_faster(gpu_forms):
    # Simulated GPUs: the first worker has GPU 0. One function is slow on the CPU and fast in
    # its GPU form, the other the reverse; both layers read the same host blocks. The daemon
    # tries each form of each layer, then runs each layer where it finishes first.
    f = gpu_forms
    x = da.random.default_rng(0).random((32, 65536), chunks=(1, 65536))  # 32 blocks, 512 KiB
    doubled, incremented = x.map_blocks(f.double_slowly), x.map_blocks(f.inc)
    with depot.dask.Scheduler(
        workers=2, gpus=1, simulate_gpus="1:64MiB", memory="256MiB", fuse=False
    ) as s:
        got = dask.compute(doubled, incremented, scheduler=s.get, optimize_graph=False)
        want = dask.compute(doubled, incremented, scheduler="sync", optimize_graph=False)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        del got  # the results view the store
        on_gpu = _variants(s.client, doubled.name)
        on_cpu = _variants(s.client, incremented.name)
        assert len(on_gpu) == len(on_cpu) == 32
        assert all(device == (0 if v == "gpu" else -1) for v, device in on_gpu + on_cpu)
        assert [v for v, _ in on_gpu].count("gpu") >= 20, on_gpu
        assert [v for v, _ in on_cpu].count("cpu") >= 20, on_cpu
        sources = _variants(s.client, x.name)  # no GPU form: depot.dask.run, no variant
        assert len(sources) == 32 and all(v == "" for v, _ in sources), sources
        assert wait_for(lambda: s.client.list() == [], timeout=30)


def test_an_array_four_times_the_gpu_pool_is_paged_through_it(gpu_forms):
    # 64 blocks of 1 MiB made in host memory, each scaled on a GPU whose pool takes 16 MiB
    # (offload pins the GPU form), then summed: the scaled blocks, results asked for, go
    # back to host memory as the pool fills; the pool never holds more than its limit.
    f = gpu_forms
    x = da.random.default_rng(1).random((64, 131072), chunks=(1, 131072))
    scaled = depot.dask.offload(x.map_blocks(f.scale))
    sums = scaled.map_blocks(f.block_sum, chunks=(1, 1))
    with depot.dask.Scheduler(
        workers=2, gpus=1, simulate_gpus="1:16MiB", memory="512MiB", fuse=False
    ) as s:
        limit = s.client.gpus()[0].limit_bytes
        assert 0 < 4 * limit <= x.nbytes
        most, done = [0], threading.Event()

        def sample():
            while not done.is_set():
                most[0] = max(most[0], s.client.gpus()[0].used_bytes)
                done.wait(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            got = dask.compute(scaled, sums, scheduler=s.get, optimize_graph=False)
        finally:
            done.set()
            sampler.join()
        want = dask.compute(scaled, sums, scheduler="sync", optimize_graph=False)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1])
        del got
        # Pinned to the GPU form (offload), as a task asking for a GPU would be: on GPU 0,
        # 64 MiB through the pool.
        placed = [d for _, d in _variants(s.client, scaled.name)]
        assert placed == [0] * 64, placed
        assert 0 < most[0] <= limit, (most[0], limit)
        assert wait_for(lambda: s.client.list() == [], timeout=30)


def test_array_tasks_calling_only_numpys_functions_are_their_own_gpu_form_where_cupy_is(
    gpu_forms, monkeypatch,
):
    # What decides whether a task has a GPU form, without a GPU: NumPy's and Dask's
    # functions dispatch to CuPy (with CuPy installed); a function of the user's does not,
    # unless registered; a registered one is replaced by its form wherever it is.
    from dask._task_spec import Task, convert_legacy_graph

    from depot import _dask_gpu
    from depot._dask_graphs import _Functions

    x = da.ones((8,), chunks=4)
    layers = {
        "numpy": np.sin(x) + 1,
        "user": x.map_blocks(lambda b: b + 1),
        "registered": x.map_blocks(gpu_forms.scale),
    }

    def form(y, cupy):
        monkeypatch.setattr(_dask_gpu, "cupy_installed", lambda: cupy)
        graph = convert_legacy_graph(dict(y.__dask_graph__()))
        node = graph[(y.name, 0)]
        assert isinstance(node, Task)
        forms = _dask_gpu.Forms()
        pickled = _Functions(None).dumps(node, forms)
        return _dask_gpu.has_form(forms, array_task=True), pickled

    assert form(layers["numpy"], cupy=True)[0] == "dispatch"
    assert form(layers["numpy"], cupy=False)[0] is None
    assert form(layers["user"], cupy=True)[0] is None
    found, pickled = form(layers["registered"], cupy=False)
    assert found == "replaced" and b"scale_on_gpu" in pickled
    depot.dask.unregister_gpu(gpu_forms.scale)
    assert form(layers["registered"], cupy=False)[0] is None


def test_gpu_forms_and_offload_refuse_what_they_cannot_take(gpu_forms):
    f = gpu_forms
    with pytest.raises(depot.InvalidArgument, match="two callables"):
        depot.dask.register_gpu(f.inc, "inc_on_gpu")
    with pytest.raises(depot.InvalidArgument, match="high-level graph"):
        depot.dask.offload(np.ones(3))
    with pytest.raises(depot.InvalidArgument, match="one or more"):
        depot.dask.offload()
    x = da.ones(4, chunks=2)
    with depot.dask.Scheduler(workers=1, memory="64MiB") as s:
        # No worker has a GPU: tasks with GPU forms run as any other, on host memory.
        np.testing.assert_array_equal(
            depot.dask.offload(x.map_blocks(f.inc)).compute(scheduler=s.get), np.full(4, 2.0)
        )
        before = s.client.status().scheduler.submitted
        with dask.annotate(depot_offload="yes"):
            bad = x.map_blocks(f.inc)
        with pytest.raises(depot.InvalidArgument, match="depot_offload 'yes': True or False"):
            bad.compute(scheduler=s.get)
        assert s.client.status().scheduler.submitted == before
        assert wait_for(lambda: s.client.list() == [], timeout=30)


def test_gpus_are_for_a_private_daemons_workers_one_each():
    with pytest.raises(depot.InvalidArgument, match="one GPU a worker"):
        depot.dask.Scheduler(workers=1, gpus=[0, 1])
    with pytest.raises(depot.InvalidArgument, match="private daemon"):
        depot.dask.Scheduler(socket="/nowhere", gpus=1)
    with pytest.raises(depot.InvalidArgument, match="private daemon"):
        depot.dask.Scheduler(spill_dir="/tmp")


def test_labels_are_keys_cut_to_the_daemons_256_bytes():
    from depot._dask_graphs import _label

    assert _label(("sum-abc", 0, 1)) == "('sum-abc', 0, 1)"
    assert _label("k" * 300) == "k" * 256
    cut = _label("é" * 200)  # two bytes each: cut on a character, not inside one
    assert cut == "é" * 128 and len(cut.encode()) == 256
    assert len(_label("x" * 300, " (inputs 0-3999)").encode()) == 256
    assert _label("\udcff") == "\\udcff"  # a lone surrogate cannot be UTF-8: escaped
    assert _label("a\nb\x1b[2J\x9b") == "a?b?[2J?"  # the daemon takes no control character


def test_callables_of_main_and_local_classes_travel_by_value(sched):
    # A callable object of a class defined in __main__ (a script) or inside a function:
    # plain pickle would name a class the worker cannot import.
    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, block):
            return block * self.k

    x = da.ones((40, 40), chunks=20).map_blocks(Scale(3))
    assert float(x.sum().compute(scheduler=sched.get)) == 4800.0
    script = textwrap.dedent(
        f"""
        import dask.array as da, depot.dask
        class Scale:
            def __init__(self, k):
                self.k = k
            def __call__(self, block):
                return block * self.k
        s = depot.dask.Scheduler(socket={sched.client.socket!r})
        x = da.ones((40, 40), chunks=20).map_blocks(Scale(2))
        print(float(x.sum().compute(scheduler=s.get)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "3200.0", out.stderr
