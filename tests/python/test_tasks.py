"""Tasks from Python (issue 13, first part): Client.submit of functions that Python workers
(depot.Worker, in processes of their own) registered or that are sent by value, results
with get, failures with their traceback, cancel, wait, map, and retries when a worker dies."""

import multiprocessing
import operator
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import children
import depot
from conftest import wait_for
from dlpack_util import FakeInterfaceArray


@pytest.fixture
def workers(daemon, client):
    """Starts Python worker processes on the daemon: start(n, cpus=1) returns them."""
    spawn = multiprocessing.get_context("spawn")
    started = []

    def start(n=1, cpus=1):
        before = client.status().scheduler.workers
        procs = [spawn.Process(target=children.run_worker, args=(daemon.socket, cpus)) for _ in range(n)]
        for p in procs:
            p.start()
        started.extend(procs)
        assert wait_for(lambda: client.status().scheduler.workers == before + n, timeout=60)
        return procs

    yield start
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(10)


def test_a_registered_function_gets_values_for_refs_and_its_result_is_stored(client, workers):
    workers(1)
    source = np.arange(100_000, dtype=np.float64)
    ref = client.put(source)
    out = client.submit("scale", ref, 3)
    assert isinstance(out, depot.ObjectRef)
    result = client.get(out, timeout=60)
    np.testing.assert_array_equal(result, source * 3)
    assert not result.flags.writeable
    # The output is sealed a moment before the worker's completion reaches the daemon.
    assert wait_for(lambda: client.status().scheduler.completed == 1, timeout=60)
    placed = client.locate([ref])[0]  # read where it was: its data and its metadata
    assert client.status().scheduler.local_bytes == placed.data_size + placed.metadata_size


def test_refs_nested_in_arguments_arrive_as_refs_and_are_read_with_get_client(client, workers):
    workers(1)
    parts = [client.put(np.full(10, i, dtype=np.int64)) for i in range(3)]
    later = depot.ObjectRef.from_name("not yet")  # nested: not waited for

    def total(refs, others):
        c = depot.get_client()
        assert all(isinstance(r, depot.ObjectRef) for r in refs + [others["later"]])
        return int(sum(c.get(r).sum() for r in refs)), c.contains(others["later"])

    out = client.submit(total, parts, {"later": later})
    assert client.get(out, timeout=60) == (30, False)
    with pytest.raises(RuntimeError, match="task's function"):
        depot.get_client()


def test_an_output_filled_in_place_is_sealed_as_it_is(client, workers):
    workers(1)

    def fill(n):
        out = depot.output_array(n, "float64")
        out[:] = 7.0
        return out

    np.testing.assert_array_equal(client.get(client.submit(fill, 1000), timeout=60),
                                  np.full(1000, 7.0))

    def second(n):
        out = depot.output_array((2, n), "int32", index=1)
        out[:] = 1
        return "first", out

    first, other = client.submit(second, 3, num_outputs=2)
    assert client.get(first, timeout=60) == "first"
    np.testing.assert_array_equal(client.get(other, timeout=60), np.ones((2, 3), np.int32))

    # Returning something else stores that, and a failure drops what was made.
    def returns_else(n):
        depot.output_array(n)
        return "else"

    assert client.get(client.submit(returns_else, 10), timeout=60) == "else"
    for body, message in [
        ("depot.output_array(4)\n    raise ValueError('no luck')", "no luck"),
        ("depot.output_array(4)\n    depot.output_array(4)", "made already"),
        ("depot.output_array(4, index=3)", "no output 3"),
    ]:
        namespace = {"depot": depot}
        exec(f"def task():\n    {body}", namespace)
        with pytest.raises(depot.TaskFailed, match=message):
            client.get(client.submit(namespace["task"]), timeout=60)
    assert client.status().objects_creating == 0
    with pytest.raises(RuntimeError, match="task's function"):
        depot.output_array(4)


def test_a_value_returned_instead_of_an_output_it_views_is_stored_whole(client, workers):
    # What was made is dropped, and its memory may go to the next object created (this
    # output's, made again for what was returned): what the value views of it is copied first.
    workers(1)
    n = 512  # 2 MiB

    def transposed(n):
        out = depot.output_array((n, n), "float64")
        out[:] = np.arange(n * n, dtype=np.float64).reshape(n, n)
        return out.T

    def in_a_dict(n):
        out = depot.output_array(n * n, "float64")
        out[:] = np.arange(n * n, dtype=np.float64)
        return {"tail": out[n:], "head": out[:n]}

    def one_views_the_other(n):
        out = depot.output_array(n * n, "float64", index=1)
        out[:] = np.arange(n * n, dtype=np.float64)
        return out[: n * n // 2], out + 1

    expected = np.arange(n * n, dtype=np.float64)
    for _ in range(3):
        np.testing.assert_array_equal(client.get(client.submit(transposed, n), timeout=60),
                                      expected.reshape(n, n).T)
        got = client.get(client.submit(in_a_dict, n), timeout=60)
        np.testing.assert_array_equal(got["tail"], expected[n:])
        np.testing.assert_array_equal(got["head"], expected[:n])
        # One output views what was made for another, which is dropped: the view is copied
        # out before the drop, whichever output comes first.
        refs = client.submit(one_views_the_other, n, num_outputs=2)
        a, b = client.get_many(list(refs), timeout=60)
        np.testing.assert_array_equal(a, expected[: n * n // 2])
        np.testing.assert_array_equal(b, expected + 1)
        del got, a, b
    assert client.status().objects_creating == 0


def _seal_requests(client):
    for line in client.metrics().splitlines():
        if line.startswith('depot_requests_total{type="seal"} '):
            return float(line.split()[-1])
    return 0.0


def test_large_results_are_sealed_with_the_completion(client, workers):
    # One buffer, several (a DataFrame), an array that is not contiguous, and one filled in
    # place: each made through the task, and sealed by the daemon with its completion, with
    # no seal request of the worker's.
    pd = pytest.importorskip("pandas")
    workers(1)
    before = _seal_requests(client)

    def one_buffer(n):
        return np.arange(n, dtype=np.float64)

    def frame(n):
        return pd.DataFrame({"a": np.arange(n), "b": np.arange(n) * 0.5, "c": ["x"] * n})

    def strided(n):
        return np.arange(2 * n, dtype=np.int64).reshape(n, 2)[:, ::2]

    def in_place(n):
        out = depot.output_array(n, "float64")
        out[:] = 3.0
        return out

    n = 200_000  # 1.6 MB: past what a completion carries
    np.testing.assert_array_equal(client.get(client.submit(one_buffer, n), timeout=60),
                                  np.arange(n, dtype=np.float64))
    pd.testing.assert_frame_equal(client.get(client.submit(frame, n), timeout=60), frame(n))
    np.testing.assert_array_equal(client.get(client.submit(strided, n), timeout=60), strided(n))
    np.testing.assert_array_equal(client.get(client.submit(in_place, n), timeout=60),
                                  np.full(n, 3.0))
    assert _seal_requests(client) == before

    # A function that keeps what it made and then fails: it is dropped all the same.
    kept = []

    def keeps_then_fails(n):
        kept.append(depot.output_array(n))
        raise ValueError("kept it")

    with pytest.raises(depot.TaskFailed, match="kept it"):
        client.get(client.submit(keeps_then_fails, n), timeout=60)
    assert client.status().objects_creating == 0


def test_a_task_declaring_more_output_than_there_is_room_for_waits_while_others_run(
    client, workers, daemon
):
    workers(1, cpus=2)
    for bad in (-1, 1 << 64, 1.5, "1MiB", True):
        with pytest.raises(depot.InvalidArgument, match="output_bytes"):
            client.submit("noop", output_bytes=bad)
    busy = client.submit("wait_for_go", daemon.socket, "busy")
    assert wait_for(lambda: any(o.name.startswith("started/busy/") for o in client.list()), 60)
    # More than the whole store: it waits, saying why, while a task declaring little runs.
    capacity = client.status().capacity_bytes
    big = client.submit(np.zeros, 10, output_bytes=capacity + 1, label="big")
    small = client.submit(np.zeros, 10, output_bytes=80)
    np.testing.assert_array_equal(client.get(small, timeout=60), np.zeros(10))
    (waiting,) = [t for t in client.tasks() if t.label == "big"]
    assert waiting.state == "ready"
    assert f"{capacity + 1} output bytes it declared" in waiting.reason
    # Once no task runs that could free room, the declaration holds it back no longer: it
    # starts, and what it really makes fits.
    client.put(b"", name="go")
    assert client.get(busy, timeout=60) == "busy"
    np.testing.assert_array_equal(client.get(big, timeout=60), np.zeros(10))


def test_a_group_of_tasks_shares_a_memory_bound(client, workers):
    workers(1, cpus=1)
    for bad in ("lots", 0, -1, True, "1 XB"):
        with pytest.raises(depot.InvalidArgument, match="a size is"):
            client.map(np.ones, [10], memory=bad)
    # Four outputs of 1 MiB declared, a bound of 2.5 MiB: two are made, and kept (this client
    # holds them); the other two wait for it to free results, far past the half second after
    # which a graph's idle bound fails its tasks, and each starts once one is freed.
    mib = 2**20
    # Then undeclared: each is expected to make what the most of the group made; after the
    # first (1 MiB), one more fits a bound of 2.5 MiB, and the others wait as above.
    for options in ({"output_bytes": mib + 4096}, {}):
        refs = client.map(np.ones, [mib // 8] * 4, memory="2.5MiB", **options)
        for ref in refs[:2]:
            np.testing.assert_array_equal(client.get(ref, timeout=60), np.ones(mib // 8))
        done, waiting = client.wait(refs[2:], timeout=5)  # ten times that half second
        assert (done, len(waiting)) == ([], 2)
        for freed, then in zip(refs[:2], refs[2:]):
            client.delete([freed])
            np.testing.assert_array_equal(client.get(then, timeout=60), np.ones(mib // 8))
        client.delete(refs[2:])
    # A task whose output alone is larger than the bound could never start: it fails, naming
    # itself, its size and the bound.
    (too_large,) = client.map(np.ones, [10], memory="1MiB", output_bytes=2 * mib)
    with pytest.raises(depot.TaskFailed, match="its declared output of 2.00 MiB is larger "
                       "than its group's memory bound of 1.00 MiB"):
        client.get(too_large, timeout=60)


def test_closures_and_lambdas_run_by_value(client, workers):
    workers(1)
    offset = 7
    assert client.get(client.submit(lambda x: x + offset, 5), timeout=60) == 12

    def make(n):
        return {"n": n, "squares": [i * i for i in range(n)]}

    assert client.get(client.submit(make, 4), timeout=60) == {"n": 4, "squares": [0, 1, 4, 9]}
    # The function is stored once, however often it is sent.
    names = [o.name for o in client.list() if o.name.startswith("depot.function/")]
    client.get(client.submit(make, 2), timeout=60)
    assert [o.name for o in client.list() if o.name.startswith("depot.function/")] == names


def test_a_failing_function_raises_task_failed_with_its_traceback(client, workers):
    workers(1)
    out = client.submit("fail_with", "no luck here")
    with pytest.raises(depot.TaskFailed) as failure:
        client.get(out, timeout=60)
    assert "ValueError: no luck here" in str(failure.value)
    assert "Traceback" in str(failure.value)
    # A task reading the failed output fails with it.
    downstream = client.submit(lambda x: x, out)
    with pytest.raises(depot.TaskFailed, match="no luck here"):
        client.get(downstream, timeout=60)


def test_refs_between_tasks_move_no_bytes(client, workers):
    workers(1)
    first = client.submit(lambda n: np.ones(n), 1_000_000)
    second = client.submit(lambda a: a * 2, first)
    total = client.submit(lambda a: float(a.sum()), second)
    assert client.get(total, timeout=60) == 2_000_000.0
    status = client.status()
    assert status.scheduler.moved_bytes == 0
    # Both arrays were read where they were; the functions sent by value are inputs too.
    assert 2 * 8_000_000 <= status.scheduler.local_bytes < 2 * 8_000_000 + 65536
    assert status.replicas_made == 0


def test_intermediates_given_up_go_once_their_readers_are_done(client, workers):
    workers(1)
    first = client.submit(lambda n: np.ones(n), 1_000_000)
    second = client.submit(lambda a: a * 2, first)
    total = client.submit(lambda a: float(a.sum()), second)
    # Every reader is submitted: the intermediates are given up before they are even made.
    client.delete([first, second], after_tasks=True)
    assert client.get(total, timeout=60) == 2_000_000.0
    assert wait_for(lambda: first not in client and second not in client, timeout=60)
    assert total in client
    # Nothing reads or makes it any more: it goes at once, as delete does.
    client.delete(total, after_tasks=True)
    assert total not in client
    with pytest.raises(depot.ObjectNotFound):
        client.delete(total, after_tasks=True)


def test_several_outputs_and_named_ones(client, workers):
    workers(1)
    values, count = client.submit("split", 5, num_outputs=2, name="parts")
    assert values.name == "parts/0" and count.name == "parts/1"
    assert client.get(values, timeout=60) == [0, 1, 2, 3, 4]
    assert client.get(depot.ObjectRef.from_name("parts/1"), timeout=60) == 5
    wrong = client.submit("split", 5, num_outputs=3)
    with pytest.raises(depot.TaskFailed, match="3 outputs"):
        client.get(wrong[0], timeout=60)


def test_map_over_ten_thousand_items(client, workers):
    workers(2)
    refs = client.map(lambda x: x * x, range(10_000))
    assert len(refs) == 10_000
    assert client.get_many(refs, timeout=120) == [x * x for x in range(10_000)]
    done, pending = client.wait(refs, timeout=0)
    assert len(done) == 10_000 and pending == []


def test_large_arguments_travel_as_objects(client, workers):
    workers(1)
    big = list(range(100_000))  # pickles to far more than a task carries inline
    assert client.get(client.submit(lambda xs: sum(xs), big), timeout=60) == sum(big)


def test_cancel_and_wait(client, workers, daemon):
    workers(1)
    busy = client.submit("wait_for_go", daemon.socket, "busy")
    assert wait_for(lambda: any(o.name.startswith("started/busy/") for o in client.list()), 60)
    queued = client.submit("scale", 2, 21)
    done, pending = client.wait([busy, queued], timeout=0.05)
    assert done == [] and pending == [busy, queued]
    assert client.cancel(queued) == ["cancelled"]
    with pytest.raises(depot.TaskFailed, match="cancelled"):
        client.get(queued, timeout=60)
    done, pending = client.wait([busy, queued], return_when="FIRST_COMPLETED", timeout=60)
    assert done == [queued] and pending == [busy]
    client.put(b"", name="go")
    done, pending = client.wait([busy, queued], timeout=60)
    assert pending == [] and client.get(busy) == "busy"
    assert client.cancel(busy) == ["finished"]
    assert client.cancel(depot.ObjectRef(depot._depot.random_id())) == ["unknown"]


def test_a_worker_killed_mid_task_has_it_retried_on_another(client, workers, daemon):
    first, second = workers(2)
    out = client.submit("wait_for_go", daemon.socket, "retried")
    started = wait_for(
        lambda: [o.name for o in client.list() if o.name.startswith("started/retried/")], 60
    )
    assert len(started) == 1
    pid = int(started[0].rsplit("/", 1)[1])
    victim = first if first.pid == pid else second
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    client.put(b"", name="go")
    assert client.get(out, timeout=60) == "retried"
    assert client.status().scheduler.retried == 1


def test_bad_submissions_are_clear_errors(client, workers):
    workers(1)
    with pytest.raises(depot.InvalidArgument, match="no_such_function"):
        client.submit("no_such_function", 1)
    with pytest.raises(depot.InvalidArgument, match="raw_args"):
        client.submit("scale", 1, raw_args=b"x")
    with pytest.raises(ValueError, match="affinity"):
        client.submit("scale", 1, 2, affinity="sideways")
    with pytest.raises(depot.InvalidArgument):
        client.submit("scale", 1, 2, resources={"GPU": 1})  # no worker offers a GPU
    with pytest.raises(depot.ObjectNotFound):
        client.submit("scale", depot.ObjectRef(depot._depot.random_id()), 2)
    with pytest.raises(TypeError):
        client.submit(42)
    # The daemon serves on.
    assert client.get(client.submit("scale", 2, 21), timeout=60) == 42


def test_start_daemon_with_workers_runs_tasks_from_a_fresh_interpreter():
    script = (
        "import depot\n"
        "with depot.start_daemon(workers=2) as d, d.client() as c:\n"
        "    print(c.get(c.submit(lambda x: x * 2, 21), timeout=60))\n"
        "    print(c.status().scheduler.workers, len(d.workers))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["42", "2", "2"]


def _depot_worker():
    """The depot-worker command: beside this interpreter (a venv's scripts), else on PATH
    (`pip install --target` puts it in the target's bin/, which the GPU check puts there)."""
    beside = os.path.join(os.path.dirname(sys.executable), "depot-worker")
    return beside if os.path.exists(beside) else (shutil.which("depot-worker") or beside)


def test_the_depot_worker_command_runs_a_modules_tasks_and_drains_on_sigterm(
    client, daemon, tmp_path
):
    module = tmp_path / "my_tasks.py"
    module.write_text(
        "import depot\n"
        "@depot.task\n"
        "def triple(x):\n"
        "    return 3 * x\n"
        "@depot.task(name='where')\n"
        "def pid():\n"
        "    import os\n"
        "    return os.getpid()\n"
        "def not_a_task():\n"
        "    return None\n"
    )
    command = subprocess.Popen(
        [_depot_worker(), "--socket", daemon.socket, "--cpus", "2", str(module)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert wait_for(lambda: client.status().scheduler.workers == 2, timeout=60)
        assert client.get(client.submit("triple", 14), timeout=60) == 42
        # Each slot is a process of its own.
        pids = client.get_many([client.submit("where") for _ in range(20)], timeout=60)
        assert command.pid not in pids
        with pytest.raises(depot.InvalidArgument, match="not_a_task"):
            client.submit("not_a_task")
        command.send_signal(signal.SIGTERM)
        assert command.wait(30) == 0, command.stdout.read()
        assert wait_for(lambda: client.status().scheduler.workers == 0, timeout=30)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def _shared_dirty(pid):
    """Bytes of a process's pages written before a fork and still shared with its relatives."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Shared_Dirty:"))


def _ended(pid):
    """Whether a process has exited: gone, or a zombie that its new parent (a container's
    init, maybe) has not reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_the_depot_worker_commands_processes_share_what_it_preloaded_and_stop_with_it(
    client, daemon, tmp_path
):
    module = tmp_path / "draws.py"
    module.write_text(
        "import os, sys\n"
        "import depot\n"
        "@depot.task\n"
        "def draw():\n"
        "    import numpy\n"
        "    return os.getpid(), 'pandas' in sys.modules, float(numpy.random.random())\n"
    )
    pid_file = tmp_path / "pids"
    command = subprocess.Popen(
        [_depot_worker(), "--socket", daemon.socket, "--cpus", "2", "--preload", "pandas",
         "--pid-file", str(pid_file), str(module)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert wait_for(lambda: client.status().scheduler.workers == 2, timeout=60)
        forked = {int(p) for p in pid_file.read_text().split()}
        assert len(forked) == 2 and command.pid not in forked
        draws = client.get_many([client.submit("draw") for _ in range(40)], timeout=60)
        assert {pid for pid, _, _ in draws} <= forked
        # pandas came with the fork: no worker imported it.
        assert all(preloaded for _, preloaded, _ in draws)
        # Its heap, written before the fork, is shared by the workers, not loaded by each
        # (a worker forked from a parent that loaded only depot shares about 10 MiB).
        for pid in forked:
            assert _shared_dirty(pid) > 20 << 20
        # Each worker seeded numpy's global random state afresh: their draws differ.
        by_worker = {}
        for pid, _, value in draws:
            by_worker.setdefault(pid, set()).add(value)
        if len(by_worker) == 2:
            first, second = by_worker.values()
            assert not first & second
        # A worker whose parent dies is told to stop, and drains.
        command.kill()
        command.wait()
        assert wait_for(lambda: client.status().scheduler.workers == 0, timeout=60)
        assert wait_for(lambda: all(_ended(p) for p in forked), timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def test_the_depot_worker_command_forks_again_a_worker_killed_by_a_signal(
    client, daemon, tmp_path
):
    pid_file = tmp_path / "pids"
    command = subprocess.Popen(
        [_depot_worker(), "--socket", daemon.socket, "--cpus", "2", "--pid-file", str(pid_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert wait_for(lambda: client.status().scheduler.workers == 2, timeout=60)
        first = [int(p) for p in pid_file.read_text().split()]
        os.kill(first[0], signal.SIGKILL)

        def replaced():
            pids = [int(p) for p in pid_file.read_text().split()]
            return len(pids) == 2 and first[0] not in pids and first[1] in pids

        assert wait_for(replaced, timeout=60)
        assert wait_for(lambda: client.status().scheduler.workers == 2, timeout=60)
        assert client.get(client.submit(operator.mul, 6, 7), timeout=60) == 42
        command.send_signal(signal.SIGTERM)
        assert command.wait(60) == 0
        output = command.stdout.read()
        assert "was killed by signal 9; starting another" in output, output
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def test_the_depot_worker_command_names_a_module_it_cannot_preload_and_serves_on(
    client, daemon
):
    command = subprocess.Popen(
        [_depot_worker(), "--socket", daemon.socket, "--cpus", "2", "--preload", "no_such_mod"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert wait_for(lambda: client.status().scheduler.workers == 2, timeout=60)
        assert client.get(client.submit(operator.mul, 6, 7), timeout=60) == 42
        command.send_signal(signal.SIGTERM)
        assert command.wait(60) == 0
        output = command.stdout.read()
        assert "depot-worker: cannot preload no_such_mod: No module named 'no_such_mod'" in output
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def test_closing_a_daemon_ends_its_workers_even_in_a_task_that_does_not_end():
    with depot.start_daemon(workers=2) as d:
        workers = d.workers
        assert len(workers) == 2
        with d.client() as c:
            c.submit(time.sleep, 600)  # drains for ever: SIGKILL after 5 s
            assert wait_for(lambda: [t.state for t in c.tasks()] == ["running"], timeout=60)
        d.close()
        assert wait_for(lambda: all(_ended(p) for p in workers), timeout=60)
    with depot.start_daemon(workers=1) as one:
        assert one.workers == [one._workers[0].pid]  # it serves itself: nothing to fork


def test_on_sigterm_the_depot_worker_command_lets_its_running_task_finish(
    client, daemon, tmp_path
):
    # The signal lands while the worker's main thread waits for its serving thread: the
    # worker drains, and must neither end nor close its connection under the running task.
    module = tmp_path / "held_tasks.py"
    module.write_text(
        "import depot\n"
        "@depot.task\n"
        "def held(socket):\n"
        "    with depot.Client(socket) as c:\n"
        "        return c.get('go', timeout=60)\n"
    )
    command = subprocess.Popen(
        [_depot_worker(), "--socket", daemon.socket, str(module)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert wait_for(lambda: client.status().scheduler.workers == 1, timeout=60)
        out = client.submit("held", daemon.socket)
        assert wait_for(lambda: [t.state for t in client.tasks()] == ["running"], timeout=60)
        command.send_signal(signal.SIGTERM)
        assert wait_for(lambda: [w.draining for w in client.workers()] == [True], timeout=60)
        assert command.poll() is None  # draining: its task runs on
        client.put("released", name="go")
        assert client.get(out, timeout=60) == "released"
        assert command.wait(60) == 0, command.stdout.read()
        assert client.workers() == []
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def test_closing_a_worker_whose_serving_thread_runs_lets_its_running_task_finish(
    client, daemon
):
    # What the depot-worker command does when SIGTERM comes as run() starts its serving
    # thread: run() raises, and close() must not abandon the task the thread runs.
    worker = depot.Worker(daemon.socket, cpus=1, name="closed while serving")
    worker.register("wait_for_go", children.wait_for_go)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    assert wait_for(lambda: client.status().scheduler.workers == 1, timeout=60)
    out = client.submit("wait_for_go", daemon.socket, "closing")
    assert wait_for(lambda: [t.state for t in client.tasks()] == ["running"], timeout=60)
    closer = threading.Thread(target=worker.close, daemon=True)
    closer.start()
    assert wait_for(lambda: [w.draining for w in client.workers()] == [True], timeout=60)
    assert closer.is_alive() and [t.state for t in client.tasks()] == ["running"]
    client.put(b"", name="go")
    assert client.get(out, timeout=60) == "closing"
    closer.join(60)
    runner.join(60)
    assert not closer.is_alive() and not runner.is_alive()
    assert wait_for(lambda: client.workers() == [], timeout=60)


def test_workers_and_tasks_list_what_the_scheduler_knows(client, daemon, workers):
    workers(1)
    [w] = client.workers()
    assert isinstance(w, depot.WorkerInfo)
    assert (w.name, w.cpus, w.gpus, w.draining) == ("test worker", 1.0, [], False)
    assert {"scale", "split", "depot.call"} <= set(w.functions)
    source = np.arange(1000, dtype=np.float64)
    done = client.submit("scale", client.put(source), 2)
    client.get(done, timeout=60)
    busy = client.submit("wait_for_go", daemon.socket, "listed")
    waiting = client.submit("scale", busy, 2)
    assert wait_for(lambda: client.workers()[0].running == 1, timeout=60)
    by_output = {t.outputs[0]: t for t in client.tasks()}
    finished, running, blocked = by_output[done.id], by_output[busy.id], by_output[waiting.id]
    assert isinstance(finished, depot.TaskInfo)
    assert (finished.function, finished.state, finished.worker) == ("scale", "done", w.session_id)
    assert finished.local_bytes >= source.nbytes and finished.moved_bytes == 0
    assert (running.function, running.state) == ("wait_for_go", "running")
    assert (blocked.state, blocked.inputs_missing, blocked.worker) == ("waiting", 1, 0)
    assert blocked.to_dict()["outputs"] == [waiting.hex]
    assert "state='waiting'" in repr(blocked)
    assert client.workers()[0].done == 1
    client.put(b"", name="go")
    assert client.get(waiting, timeout=60) == "listedlisted"


def test_a_function_with_two_variants_runs_where_its_input_already_is():
    # The CPU variant costs 1 ns a byte, the GPU variant 2 ms (children.describe_on_*).
    # Once each is measured at both sizes: 16 MiB already on the GPU runs there (a
    # DeviceArray), 1 KiB in host memory is read there.
    with depot.start_daemon(memory="256MiB", segment_size="64MiB", simulate_gpus="1:128MiB") as d:
        with d.client() as client:
            worker = multiprocessing.get_context("spawn").Process(
                target=children.run_variant_worker, args=(d.socket,)
            )
            worker.start()
            try:
                assert wait_for(lambda: client.status().scheduler.workers == 1, timeout=60)
                [w] = client.workers()
                # Every Python worker also runs functions sent by value (depot.call) and
                # depot.dask's tasks (depot.dask.*), as built-ins; one with a GPU has the
                # GPU variant of depot.dask's tasks that have a GPU form.
                builtins = ["depot.call", "depot.dask.gather", "depot.dask.run",
                            "depot.dask.run_gathered", "depot.dask.run_offloadable",
                            "depot.dask.run_split"]
                assert (w.functions, w.gpu_functions) == (
                    builtins + ["describe", "kinds"], ["depot.dask.run_offloadable", "describe"]
                )
                big = np.arange(2 << 20, dtype=np.float64)
                on_gpu = client.put(FakeInterfaceArray(big), device=0)
                placed = client.locate([on_gpu])[0]
                assert (placed.on_host, placed.gpus) == (False, [0])
                small = client.put(np.arange(128, dtype=np.float64))

                # Pinned, each runs where it is told: that measures both at both sizes.
                for ref in (on_gpu, small):
                    cpu = client.get(client.submit("describe", ref, variant="cpu"), timeout=60)
                    assert cpu[:2] == ("cpu", "ndarray")
                    gpu = client.get(client.submit("describe", ref, variant="gpu"), timeout=60)
                    assert gpu[:3] == ("gpu", "DeviceArray", 0)

                large = client.submit("describe", on_gpu)
                assert client.get(large, timeout=60) == ("gpu", "DeviceArray", 0, big.nbytes)
                assert client.get(client.submit("describe", small), timeout=60) == (
                    "cpu", "ndarray", 1024,
                )
                by_output = {t.outputs[0]: t for t in client.tasks()}
                chosen = by_output[large.id]
                assert (chosen.variant, chosen.device, chosen.moved_bytes) == ("gpu", 0, 0)
                assert "expected to finish first: gpu" in chosen.variant_reason
                with pytest.raises(ValueError, match="variant"):
                    client.submit("describe", small, variant="fpga")

                # A task on a GPU gets arrays there, other values from host memory, which
                # are not copied to the GPU.
                settings = client.put({"k": 3})
                kinds = client.submit("kinds", small, settings, resources={"GPU": 1, "CPU": 0})
                assert client.get(kinds, timeout=60) == ["DeviceArray", "dict"]
                assert client.locate([settings])[0].gpus == []
            finally:
                worker.kill()
                worker.join(10)


def test_register_takes_one_function_or_variants():
    with pytest.raises(TypeError, match="not both"):
        depot.Worker.register(None, "f", print, cpu=print)
    with pytest.raises(TypeError, match="needs a function"):
        depot.Worker.register(None, "f")

    @depot.task(gpu=len)
    def marked(x):
        return x

    assert marked.__depot_task__ == "marked" and marked.__depot_task_gpu__ is len


def test_the_depot_worker_command_refuses_bad_flags():
    for flags, message in [
        (["--cpus", "0"], "offers something"),
        (["--resource", "ssd"], "NAME=AMOUNT"),
        (["--gpus", "zero"], "--gpus"),
    ]:
        run = subprocess.run([_depot_worker(), *flags], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2, run
        assert message in run.stderr
