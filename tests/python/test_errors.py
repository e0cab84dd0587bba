"""Failures raise depot's exceptions, with the daemon's message."""

import os
import threading
import time

import numpy as np
import pytest

import depot


def test_missing_object_without_waiting_is_not_found(client):
    with pytest.raises(depot.ObjectNotFound) as e:
        client.get("missing", timeout=0)
    assert e.value.code == "NotFound"
    assert depot.ObjectRef.from_name("missing").hex in str(e.value)
    assert isinstance(e.value, depot.DepotError) and isinstance(e.value, KeyError)


def test_task_failed_is_a_depot_error_raised_for_the_task_failed_code():
    """The daemon's scheduler seals a failed task's outputs as failed objects, which no
    client request can make; a get of one raises TaskFailed with the task's message (the
    wire and client parts are tested in C++: tests/task_failed_test.cc)."""
    assert issubclass(depot.TaskFailed, depot.DepotError)
    assert depot._errors.BY_CODE["TaskFailed"] is depot.TaskFailed
    e = depot.TaskFailed("sum: bad input", "TaskFailed")
    assert str(e) == "sum: bad input" and e.message == "sum: bad input"
    assert "TaskFailed" in depot.__all__


def test_missing_object_times_out_after_the_timeout(client):
    start = time.monotonic()
    with pytest.raises(depot.Timeout) as e:
        client.get("late", timeout=0.5)
    assert 0.45 <= time.monotonic() - start < 3
    assert e.value.code == "Timeout" and isinstance(e.value, TimeoutError)
    with pytest.raises(depot.Timeout):
        client.get_many([client.put(1), "late"], timeout=0.1)
    with pytest.raises(depot.ObjectNotFound):
        client.get_many(["late"], timeout=0)


def test_get_waits_for_a_put_from_another_thread(client, daemon):
    """The GIL is released while get waits: the writer thread runs meanwhile."""

    def write_later():
        time.sleep(0.3)
        with daemon.client() as writer:
            writer.put(np.arange(3), name="later")

    thread = threading.Thread(target=write_later)
    thread.start()
    try:
        assert list(client.get("later", timeout=10)) == [0, 1, 2]
    finally:
        thread.join()


def test_get_without_timeout_waits_for_ever(client, daemon):
    thread = threading.Timer(0.5, lambda: daemon.client().put(7, name="eventually"))
    thread.start()
    assert client.get("eventually") == 7
    thread.join()


def test_bad_socket_path_is_a_connection_error(tmp_path):
    with pytest.raises(depot.ConnectionError) as e:
        depot.Client(tmp_path / "no.sock")
    assert str(tmp_path / "no.sock") in str(e.value)
    assert e.value.code == "ConnectionFailed"


@pytest.mark.parametrize("value", ["0", "65", "four", "4x"])
def test_a_depot_copy_threads_that_is_not_a_count_fails_the_connection_saying_so(daemon, value):
    import subprocess
    import sys

    program = (
        "import sys, depot\n"
        "try:\n"
        "    depot.Client(sys.argv[1])\n"
        "except depot.InvalidArgument as error:\n"
        "    print(error)\n"
        "    sys.exit(0)\n"
        "sys.exit('connected')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program, daemon.socket], capture_output=True, text=True,
        timeout=60, env={**os.environ, "DEPOT_COPY_THREADS": value},
    )
    assert run.returncode == 0, run.stderr
    assert f'DEPOT_COPY_THREADS is "{value}": it should be a count of threads from 1 to 64' in run.stdout


def test_closed_client_is_a_connection_error(daemon):
    client = daemon.client()
    client.close()
    with pytest.raises(depot.ConnectionError):
        client.put(1)


def test_name_taken_is_object_exists(client):
    client.put(1, name="once")
    with pytest.raises(depot.ObjectExists):
        client.put(2, name="once")


def test_object_larger_than_the_store_is_store_full():
    with depot.start_daemon(memory="16MiB", args=["--no-evict"]) as d, d.client() as client:
        client.put(np.zeros(1 << 20))  # 8 MiB
        with pytest.raises(depot.StoreFull) as e:
            client.put(np.zeros(1 << 20))
        assert e.value.code == "OutOfMemory"


def test_object_over_the_largest_size_is_invalid(client):
    with pytest.raises(depot.InvalidArgument):
        client.create(1 << 40)


def test_unpicklable_value_is_invalid_argument(client):
    with pytest.raises(depot.InvalidArgument) as e:
        client.put(threading.Lock())
    assert "pickle" in str(e.value)


def test_sealing_twice_is_already_sealed(client):
    buf = client.create(4)
    ref = client.seal(buf)
    with pytest.raises(depot.ObjectAlreadySealed):
        client.seal(ref)


def test_seal_of_unknown_object_is_not_found(client):
    with pytest.raises(depot.ObjectNotFound):
        client.seal("never-created")


class FakeRocmArray:
    """Looks like a ROCm array to DLPack consumers."""

    def __dlpack_device__(self):
        return (10, 0)  # kDLROCM, device 0

    def __dlpack__(self, stream=None):
        raise AssertionError("must not be exported")


def test_arrays_on_other_devices_are_not_supported(client):
    with pytest.raises(depot.GpuNotSupported) as e:
        client.put(FakeRocmArray())
    assert "device type 10" in str(e.value)


def test_cpu_dlpack_values_are_stored(client):
    assert np.array_equal(client.get(client.put(np.arange(4))), np.arange(4))


def test_daemon_that_cannot_start_reports_its_log():
    with pytest.raises(depot.DepotError) as e:
        depot.start_daemon(memory="not-a-size")
    assert "not-a-size" in str(e.value)


def test_errors_survive_pickling():
    import pickle

    error = pickle.loads(pickle.dumps(depot.Timeout("waited", "Timeout")))
    assert isinstance(error, depot.Timeout) and error.code == "Timeout" and str(error) == "waited"


def test_ctrl_c_interrupts_a_get_that_waits_for_ever(daemon):
    import signal
    import subprocess
    import sys

    waiter = (
        "import depot, signal, sys\n"
        # Ctrl-C raises KeyboardInterrupt even where this test runs with SIGINT ignored
        # (a shell's background job), which the child would inherit.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"client = depot.Client({daemon.socket!r})\n"
        "print('waiting', flush=True)\n"
        "try:\n"
        "    client.get('never')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == "interrupted"
        assert child.wait(5) == 0
    finally:
        child.kill()
        child.stdout.close()


def test_a_daemon_thread_in_a_call_when_the_interpreter_exits_lets_it_exit(daemon):
    """CPython ends a daemon thread that asks for the GIL back during finalization; in a
    depot call that aborted the process (std::terminate) instead of letting it exit."""
    import subprocess
    import sys

    program = (
        "import depot, threading, time\n"
        f"client = depot.Client({daemon.socket!r})\n"
        "threading.Thread(target=client.get, args=('never',), daemon=True).start()\n"
        "class Slow:\n"
        # Run while the interpreter finalizes its modules: time.sleep gives the GIL to the
        # waiting thread, whose 200 ms slice of waiting ends meanwhile.
        "    def __del__(self):\n"
        "        time.sleep(0.6)\n"
        "slow = Slow()\n"
        "time.sleep(0.1)\n"
        "print('exiting', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert "terminate called" not in done.stderr and "leaked" not in done.stderr


def test_put_many_with_a_name_per_value_missing_stores_nothing(client):
    with pytest.raises(depot.InvalidArgument, match="2 values but 1 names"):
        client.put_many([b"a", b"b"], names=["put-many/only-one"])
    assert "put-many/only-one" not in client
    assert client.status().objects_sealed == 0


def test_malformed_put_many_items_are_refused_before_anything_is_stored(client):
    good = (depot.ObjectRef.from_name("put-many/good").id, [b"x"], [0], 1, b"", "")
    with pytest.raises(ValueError, match="each item is 6 values"):
        client._native.put_many([good, (good[0], [b"x"])], False)
    with pytest.raises(ValueError, match="parts run past the object's size"):
        client._native.put_many([good, (good[0], [b"xyz"], [0], 1, b"", "")], False)
    assert client.status().objects_sealed == 0
    ref = client.put(b"still fine")  # the connection and the daemon are unharmed
    assert client.get(ref).tobytes() == b"still fine"
    status = client.status()  # the daemon's memory for clients, and for requests under way
    assert 0 < status.metadata_bytes <= status.metadata_budget_bytes
    assert status.request_bytes == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as another user")
def test_another_user_may_read_but_not_write_and_gets_permission_denied():
    """uid 65534, shared with read-only, reads an array and is refused a put and a delete."""
    with depot.start_daemon(
        memory="64MiB", args=["--socket-mode", "0666", "--share-with-uid", "65534"]
    ) as d:
        os.chmod(os.path.dirname(d.socket), 0o755)
        with d.client() as owner:
            ref = owner.put(np.arange(1000), name="shared")
            pid = os.fork()
            if pid == 0:  # the child reports through its exit code only
                code = 1
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    with depot.Client(d.socket) as other:
                        code = 2
                        assert np.array_equal(other.get(ref), np.arange(1000))
                        code = 3
                        for attempt in (lambda: other.put(1), lambda: other.delete(ref)):
                            try:
                                attempt()
                                code = 4
                                break
                            except depot.PermissionDenied as e:
                                assert isinstance(e, PermissionError) and "65534" in str(e)
                        else:
                            code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert np.array_equal(owner.get(ref), np.arange(1000))
            # Every object records its creator's uid; the shared uid created none.
            assert {o.owner_uid for o in owner.list()} == {os.getuid()}
