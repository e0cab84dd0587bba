"""depot.cubed.Executor: Cubed plans on a private depotd's worker processes, their arrays in
depot.zarr.Store; results against Cubed's single-threaded executor, the memory bound,
intermediates freed, retries, a killed worker, callbacks, and bad input."""

import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

cubed = pytest.importorskip("cubed")
import cubed.array_api as xp  # noqa: E402
from cubed.runtime.executors.local import SingleThreadedExecutor  # noqa: E402
from cubed.runtime.types import Callback  # noqa: E402

import depot  # noqa: E402
import depot.cubed  # noqa: E402
from conftest import wait_for  # noqa: E402


@pytest.fixture(scope="module")
def executor():
    with depot.cubed.Executor(workers=2, store_memory="512MiB", memory="2GiB") as ex:
        yield ex


class Recorder(Callback):
    """What Cubed's callbacks are told: operations started and ended, and each task's end."""

    def __init__(self):
        self.started, self.ended, self.tasks = [], [], []
        self.events = []  # ("start" or "end", operation), in order
        self.dag = None

    def on_compute_start(self, event):
        self.dag = event.dag

    def on_operation_start(self, event):
        self.started.append(event.name)
        self.events.append(("start", event.name))

    def on_operation_end(self, event):
        self.ended.append(event.name)
        self.events.append(("end", event.name))

    def on_task_end(self, event):
        self.tasks.append(event)


def _objects(executor, prefix=""):
    """The names of the objects in the store under ``prefix``: not those deleted (a worker
    may still view one for a moment after its task, until its release reaches the daemon)."""
    return sorted(o.name for o in executor.client.list(prefix) if not o.delete_pending)


def _arrays_of(executor):
    """The arrays (by path) the executor's store holds chunks of."""
    prefix = executor.prefix + "/"
    return {n[len(prefix):].split("/")[0] for n in _objects(executor, prefix)}


# The operations Cubed #284 uses, each as (name, function of a spec).
def _matmul(spec):
    a = xp.asarray(np.arange(60 * 40, dtype=np.float64).reshape(60, 40) / 100, chunks=(20, 20),
                   spec=spec)
    b = xp.asarray(np.linspace(0, 1, 40 * 30).reshape(40, 30), chunks=(20, 10), spec=spec)
    return xp.matmul(a, b)


def _concat(spec):
    a = xp.asarray(np.arange(50.0).reshape(10, 5), chunks=(4, 5), spec=spec)
    b = xp.asarray(np.arange(30.0).reshape(6, 5) * -1, chunks=(4, 5), spec=spec)
    return xp.concat([a, b, a], axis=0)


def _astype_elementwise(spec):
    a = xp.asarray(np.arange(1000, dtype=np.int64).reshape(25, 40), chunks=(10, 10), spec=spec)
    return xp.astype(xp.sin(xp.astype(a, xp.float32) / 7) * 3 + a, xp.float64)


def _reductions(spec):
    a = xp.asarray(np.arange(3000.0).reshape(50, 60) % 17, chunks=(10, 12), spec=spec)
    return xp.stack([xp.sum(a, axis=0), xp.max(a, axis=0), xp.mean(a, axis=0)])


def _product_of_transpose(spec):
    a = xp.asarray(np.arange(900.0).reshape(30, 30) / 30, chunks=(10, 10), spec=spec)
    return xp.sum(a * xp.permute_dims(a, (1, 0)))


OPERATIONS = [_matmul, _concat, _astype_elementwise, _reductions, _product_of_transpose]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda f: f.__name__.strip("_"))
def test_results_equal_cubeds_single_threaded_executors(executor, operation):
    expected = operation(cubed.Spec(allowed_mem="100MB")).compute(
        executor=SingleThreadedExecutor()
    )
    got = operation(executor.spec(allowed_mem="100MB")).compute()
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert got.dtype == expected.dtype and got.shape == expected.shape


def test_intermediates_are_freed_the_computed_array_stays_until_close(executor):
    ex = depot.cubed.Executor(socket=executor.socket)
    try:
        spec = ex.spec(allowed_mem="100MB")
        a = xp.asarray(np.ones((40, 40)), chunks=(10, 10), spec=spec)
        b = xp.matmul(a, a) + 1  # an intermediate array (the product) and the result
        assert np.all(b.compute() == 41)
        assert _arrays_of(ex) == {b.name, "zarr.json"}
    finally:
        ex.close()
    assert not _objects(executor, ex.prefix + "/")


def test_a_computes_results_go_when_the_next_compute_starts(executor):
    ex = depot.cubed.Executor(socket=executor.socket)
    try:
        spec = ex.spec(allowed_mem="100MB")
        first = xp.asarray(np.ones((20, 20)), chunks=(10, 10), spec=spec) * 3
        assert np.all(first.compute() == 3)
        assert first.name in _arrays_of(ex)
        second = xp.asarray(np.ones((20, 20)), chunks=(10, 10), spec=spec) - 1
        assert np.all(second.compute() == 0)
        assert _arrays_of(ex) - {"zarr.json"} == {second.name}
    finally:
        ex.close()


def test_arrays_the_user_keeps_in_another_depot_store_are_never_deleted(executor):
    import depot.zarr
    import zarr

    mine = depot.zarr.Store("results", socket=executor.socket)
    spec = executor.spec(allowed_mem="100MB")
    a = xp.asarray(np.ones((20, 20)), chunks=(10, 10), spec=spec)
    cubed.to_zarr(a + 1, mine, path="kept")
    # An array at the store's root (path ""), read by a later stage of the same plan.
    root = depot.zarr.Store("results-root", socket=executor.socket)
    zarr.create_array(root, shape=(20, 20), chunks=(10, 10), dtype="f8")[:] = 5.0
    assert np.all((cubed.from_zarr(root, spec=spec) * 2).compute() == 10)
    assert np.all((a * 3).compute() == 3)  # another compute: the last one's results go
    np.testing.assert_array_equal(zarr.open_array(mine, path="kept", mode="r")[:], 2)
    np.testing.assert_array_equal(zarr.open_array(root, mode="r")[:], 5)
    zarr.core.sync.sync(mine.clear())
    zarr.core.sync.sync(root.clear())


def test_an_array_returned_and_read_by_a_later_stage_stays_for_cubed_to_read_back(executor):
    spec = executor.spec(allowed_mem="100MB")
    a = xp.asarray(np.arange(400.0).reshape(20, 20), chunks=(10, 10), spec=spec) + 1
    b = xp.matmul(a, a)
    got_a, got_b = cubed.compute(a, b)
    expected_a = np.arange(400.0).reshape(20, 20) + 1
    np.testing.assert_array_equal(got_a, expected_a)
    np.testing.assert_allclose(got_b, expected_a @ expected_a)


def test_the_executor_listens_to_cubeds_computations_only_while_open(executor):
    program = (
        "import sys, depot.cubed\n"
        "from cubed.runtime.types import Callback\n"
        "listening = lambda: depot.cubed._plans in Callback.active\n"
        "assert not listening()\n"
        "with depot.cubed.Executor(socket=sys.argv[1]):\n"
        "    with depot.cubed.Executor(socket=sys.argv[1]):\n"
        "        assert listening()\n"
        "    assert listening()\n"
        "assert not listening()\n"
    )
    run = subprocess.run([sys.executable, "-c", program, executor.socket],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_keep_intermediates_keeps_every_array(executor):
    kept = depot.cubed.Executor(socket=executor.socket, keep_intermediates=True)
    try:
        spec = kept.spec(allowed_mem="100MB")
        a = xp.asarray(np.ones((20, 20)), chunks=(10, 10), spec=spec)
        result = xp.matmul(a, a) + 1
        result.compute(optimize_graph=False)  # unfused: the product is an array of its own
        arrays = _arrays_of(kept) - {"zarr.json"}
        assert result.name in arrays and len(arrays) >= 2, arrays
    finally:
        kept.close()
    assert not _objects(executor, kept.prefix + "/")


def test_tasks_admitted_at_once_keep_their_projected_memory_inside_the_bound(executor):
    # A bound that fits one task of this stage: its tasks never overlap, though two workers
    # are free. Each task of the elementwise stage sleeps, so that overlaps would show.
    def slow_add(block):
        import time

        time.sleep(0.05)
        return block + 1

    bounded = depot.cubed.Executor(socket=executor.socket, memory=1)  # below any task
    try:
        spec = bounded.spec(allowed_mem="100MB")
        a = xp.asarray(np.zeros((40, 10)), chunks=(10, 10), spec=spec)
        b = cubed.map_blocks(slow_add, a, dtype=a.dtype)
        # The bound is smaller than one task: such a stage is refused before running.
        with pytest.raises(depot.StoreFull, match=r"projects [\d,]+ bytes for one task") as e:
            b.compute()
        assert not [t for t in executor.client.tasks() if t.state in ("queued", "running")]
        one_task = int(re.search(r"projects ([\d,]+) bytes", str(e.value))[1].replace(",", ""))
        bounded.memory = one_task * 3 // 2
        recorder = Recorder()
        np.testing.assert_array_equal(b.compute(callbacks=[recorder]), np.ones((40, 10)))
        spans = sorted(
            (e.function_start_tstamp, e.function_end_tstamp)
            for e in recorder.tasks
            if e.name == recorder.started[-1]
        )
        assert len(spans) == 4
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans
    finally:
        bounded.close()


def test_callbacks_see_every_operation_and_task(executor):
    recorder = Recorder()
    spec = executor.spec(allowed_mem="100MB")
    a = xp.asarray(np.ones((30, 30)), chunks=(10, 10), spec=spec)
    xp.sum(a + 1).compute(callbacks=[recorder])
    assert recorder.started == recorder.ended and "create-arrays" in recorder.started
    assert len(recorder.started) >= 2
    for name in recorder.started:
        tasks = [t for t in recorder.tasks if t.name == name]
        assert len(tasks) == recorder.dag.nodes[name]["primitive_op"].num_tasks
    assert all(t.function_end_tstamp >= t.function_start_tstamp for t in recorder.tasks)
    assert all(t.peak_measured_mem_end > 0 for t in recorder.tasks)


def test_a_raising_task_raises_in_the_caller_after_its_retries(executor, tmp_path):
    attempts = tmp_path / "attempts"

    def fails(block):
        with open(attempts, "a") as f:
            f.write("x")
        raise ValueError("a task that always fails")

    spec = executor.spec(allowed_mem="100MB")
    a = xp.asarray(np.ones((10, 10)), chunks=(10, 10), spec=spec)
    with pytest.raises(depot.TaskFailed, match="a task that always fails"):
        cubed.map_blocks(fails, a, dtype=a.dtype).compute()
    assert attempts.read_text() == "xxx"  # the first run and executor.retries (2) more


def test_a_task_that_fails_once_succeeds_on_its_retry(executor, tmp_path):
    marker = tmp_path / "failed-once"

    def flaky(block):
        if not marker.exists():
            marker.touch()
            raise RuntimeError("the first attempt fails")
        return block * 2

    spec = executor.spec(allowed_mem="100MB")
    a = xp.asarray(np.ones((10, 10)), chunks=(10, 10), spec=spec)
    np.testing.assert_array_equal(cubed.map_blocks(flaky, a, dtype=a.dtype).compute(), 2)


def test_a_worker_killed_mid_stage_has_its_task_run_again():
    with depot.cubed.Executor(workers=2, store_memory="256MiB") as ex:
        marker = os.path.join(os.path.dirname(ex.socket), "killed-once")

        def dies_once(block):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return block + 1

        spec = ex.spec(allowed_mem="100MB")
        a = xp.asarray(np.zeros((20, 10)), chunks=(10, 10), spec=spec)
        np.testing.assert_array_equal(cubed.map_blocks(dies_once, a, dtype=a.dtype).compute(), 1)
        assert os.path.exists(marker)
        # The killed worker's slot is forked again (depot-worker): two workers once more.
        assert wait_for(lambda: len(ex.client.workers()) == 2, timeout=60)


def test_stages_of_one_generation_run_together_with_compute_arrays_in_parallel(executor):
    recorder = Recorder()
    spec = executor.spec(allowed_mem="100MB")
    a = xp.asarray(np.ones((30, 30)), chunks=(10, 10), spec=spec)
    b = xp.asarray(np.full((30, 30), 2.0), chunks=(10, 10), spec=spec)
    got_a, got_b = cubed.compute(a * 3, b + 1, callbacks=[recorder],
                                 compute_arrays_in_parallel=True)
    assert np.all(got_a == 3) and np.all(got_b == 3)
    # The two elementwise stages were started before either ended.
    first_end = min(recorder.events.index(("end", n)) for n in recorder.started[1:])
    assert all(recorder.events.index(("start", n)) < first_end for n in recorder.started[1:])


def test_ctrl_c_cancels_the_tasks_not_yet_run_and_raises(executor):
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import cubed, numpy as np, cubed.array_api as xp, depot.cubed
        def slow(block):
            import time
            time.sleep(0.2)
            return block
        with depot.cubed.Executor(socket={executor.socket!r}) as ex:
            a = xp.asarray(np.ones((200, 10)), chunks=(1, 10), spec=ex.spec(allowed_mem="100MB"))
            print(ex.prefix, flush=True)
            try:
                cubed.map_blocks(slow, a, dtype=a.dtype).compute()
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(0)
        sys.exit(3)
        """
    )
    before = executor.client.status().scheduler.cancelled
    objects = {o.id for o in executor.client.list()}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    prefix = child.stdout.readline().strip()
    assert prefix.startswith("cubed/"), prefix
    assert wait_for(lambda: executor.client.status().scheduler.tasks_pending > 10, timeout=60)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and "interrupted" in out, out
    assert wait_for(lambda: executor.client.status().scheduler.tasks_pending == 0, timeout=60)
    assert executor.client.status().scheduler.cancelled > before
    # The child's arrays went with its executor (its with block); the tasks' outputs and
    # functions went too: the store holds nothing it did not hold before.
    assert not _objects(executor, prefix + "/")
    assert wait_for(lambda: {o.id for o in executor.client.list()} <= objects, timeout=60), [
        (o.name, o.state, o.data_size, o.metadata_size, o.ref_count, o.pinned, o.failed)
        for o in executor.client.list() if o.id not in objects
    ]


def test_bad_input_is_a_clear_error(executor):
    with pytest.raises(depot.InvalidArgument, match="workers is a count"):
        depot.cubed.Executor(workers=0)
    with pytest.raises(depot.InvalidArgument, match="retries is a count"):
        depot.cubed.Executor(socket=executor.socket, retries=-1)
    with pytest.raises(depot.InvalidArgument, match="size"):
        depot.cubed.Executor(socket=executor.socket, memory="lots")
    with pytest.raises(depot.InvalidArgument, match="sets intermediate_store itself"):
        executor.spec(intermediate_store="/tmp/x")
    elsewhere = pickle.loads(pickle.dumps(executor))
    with pytest.raises(depot.InvalidArgument, match="only in the process that made it"):
        elsewhere.execute_dag(None)


def test_a_daemon_that_is_gone_says_so(tmp_path):
    with pytest.raises(depot.ConnectionError, match="no depot daemon is listening"):
        depot.cubed.Executor(socket=str(tmp_path / "none.sock"))
