"""depot.multiprocessing: arrays and tensors between processes through the store.

Each scenario (mp_scenarios.py) runs as a process tree of its own against the test's daemon,
so that the test can check the store once the whole tree has gone: empty, whatever was
killed or left unclaimed."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import depot
from conftest import wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["fork", "spawn", "forkserver"]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_PADDLE = importlib.util.find_spec("paddle") is not None


def run(scenario, method, socket=None, timeout=240, **env):
    environ = dict(os.environ)
    environ.pop("DEPOT_SOCKET", None)
    environ.pop("DEPOT_MP_GROUP", None)
    environ.pop("DEPOT_MP_THRESHOLD", None)
    if socket is not None:
        environ["DEPOT_SOCKET"] = socket
    environ["PYTHONPATH"] = HERE + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(env)
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "mp_scenarios.py"), scenario, method],
        env=environ, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, f"{scenario}/{method} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def store_empties(daemon):
    """The store ends empty once the tree has gone (the daemon ends sessions asynchronously)."""
    with daemon.client() as client:
        return wait_for(lambda: client.status().objects_sealed == 0, timeout=20)


@pytest.fixture
def mp_daemon():
    with depot.start_daemon(memory="512MiB", segment_size="64MiB") as d:
        yield d


def test_everything_the_standard_module_exports_is_there(mp_daemon):
    out, _ = run("exports", "forkserver", mp_daemon.socket)
    assert out["missing"] == []
    assert out["context"] == out["nested_context"] == out["default_process"] == "depot.multiprocessing"
    assert out["start_method"] == out["standard_start_method"]


@pytest.mark.parametrize("method", METHODS)
def test_arrays_through_a_queue_arrive_exact_writable_and_in_the_store(mp_daemon, method):
    out, _ = run("queue", method, mp_daemon.socket)
    assert out["exact"] and out["exitcode"] == 0
    received = out["received"]
    for name in ("f8_2d", "f4_fortran", "i1", "bool", "datetime"):
        assert received[name] == {"in_store": True, "writeable": True}, name
    # Non-contiguous arrays are copied into the store in C order; small ones stay inline.
    assert received["strided"] == {"in_store": True, "writeable": True}
    assert received["small"] == {"in_store": False, "writeable": True}
    # Parent to child as well.
    assert out["echoed"] == pytest.approx(out["echo_expected"])
    assert out["child_in_store"] == [True, True]
    assert store_empties(mp_daemon)


@pytest.mark.parametrize("method", METHODS)
def test_pipes_and_simple_queues_carry_store_references(mp_daemon, method):
    out, _ = run("pipe", method, mp_daemon.socket)
    assert out["child"] == {"in_store": True, "writeable": True}
    assert out["doubled"] and out["returned"] == {"in_store": True, "writeable": True}
    assert out["simple_child"] == {"in_store": True, "writeable": True} and out["simple_total"]
    assert store_empties(mp_daemon)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_importing_the_module_leaves_the_standard_contexts_as_they_are(mp_daemon, method):
    out, _ = run("standard", method, mp_daemon.socket)
    assert out["exact"] and out["received"] == {"in_store": False, "writeable": True}
    assert out["pool_total"] == 2.0 * (1 << 20)
    assert out["pool_child"] == {"in_store": False, "writeable": True}
    assert out["objects"] is None  # never even connected to the store
    assert store_empties(mp_daemon)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_enable_everywhere_sends_the_standard_contexts_through_the_store(mp_daemon, method):
    out, _ = run("standard", method, mp_daemon.socket, DEPOT_TEST_EVERYWHERE="1")
    assert out["exact"] and out["received"] == {"in_store": True, "writeable": True}
    assert out["pool_total"] == 2.0 * (1 << 20)
    assert out["pool_child"] == {"in_store": True, "writeable": True}
    assert store_empties(mp_daemon)


@pytest.mark.parametrize("method", METHODS)
def test_a_received_array_written_in_place_changes_only_its_receivers_copy(mp_daemon, method):
    out, _ = run("write", method, mp_daemon.socket)
    assert out["written"] == out["expected_written"]
    assert out["seen"] == {"in_store": True, "writeable": True}
    # The sender's array, a second receiver's and the store's object are as sent.
    assert out["sender_unchanged"]
    assert out["second"] == out["expected"] and out["again"] == out["expected"]
    assert out["mine"] == -float(1 << 20) and out["again_in_store"]
    assert store_empties(mp_daemon)


def test_an_array_sent_again_with_another_shape_or_dtype_arrives_as_it_is_now(mp_daemon):
    out, _ = run("relayout", "fork", mp_daemon.socket)
    assert out["shapes"] == [[4, 16384], [16384, 4], [16384, 4]]
    assert out["dtypes"] == ["<f8", "<f8", "<i8"]
    assert out["exact"]
    assert store_empties(mp_daemon)


def test_a_client_without_a_group_cannot_hand_off_and_leaves_nothing(client):
    import numpy as np

    with pytest.raises(depot.InvalidArgument, match="joined no group"):
        client.handoff(np.ones(1 << 16))
    assert client.status().objects_sealed == 0


def test_a_pool_broadcasting_an_argument_stores_it_once(mp_daemon):
    out, _ = run("pool", "fork", mp_daemon.socket)
    assert out["results"]
    # 8 tasks pickle the same array: copied once, and handed off again 7 times (the sender
    # keeps its copy while the array lives, however fast the workers claim).
    assert (out["copies"], out["again"]) == (1, 7), out
    assert store_empties(mp_daemon)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_sender_killed_after_sending_loses_nothing_and_leaks_nothing(mp_daemon, method):
    out, _ = run("sender_killed", method, mp_daemon.socket)
    assert out["value"] and out["received"]["in_store"]
    assert out["exitcode"] == -9
    assert store_empties(mp_daemon)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_receiver_killed_holding_a_value_leaks_nothing(mp_daemon, method):
    out, _ = run("receiver_killed", method, mp_daemon.socket)
    assert out["child"] == {"in_store": True, "writeable": True}
    assert out["objects_while_held"] == 1 and out["exitcode"] == -9
    assert store_empties(mp_daemon)


def test_values_never_received_go_with_the_tree(mp_daemon):
    out, _ = run("unclaimed", "spawn", mp_daemon.socket)
    assert out["first"] == 0.0
    assert out["objects_in_flight"] == 4  # held by the group while the tree lives
    assert store_empties(mp_daemon)


def test_a_full_store_falls_back_to_pickling_with_one_warning():
    with depot.start_daemon(memory="32MiB", segment_size="16MiB") as small:
        out, _ = run("full", "fork", small.socket)
        assert out["exact"]
        assert out["received"] == {"in_store": False, "writeable": True}
        assert len(out["warnings"]) == 1, out["warnings"]
        assert "pickled and copied instead" in out["warnings"][0]
        assert store_empties(small)


def test_no_store_falls_back_to_pickling_with_one_warning(tmp_path):
    out, err = run("queue", "fork", str(tmp_path / "nobody.sock"))
    assert out["exact"]
    assert out["received"]["i1"] == {"in_store": False, "writeable": True}
    assert err.count("StoreUnavailableWarning") == 1, err
    assert "no depot daemon is listening" in err


def test_small_values_stay_inline_and_the_threshold_is_settable(mp_daemon):
    out, _ = run("threshold", "fork", mp_daemon.socket)
    assert out["default"] == 64 * 1024
    assert out["small"]["in_store"] is False and out["large"]["in_store"] is True
    assert out["small_at_0"]["in_store"] is True
    out, _ = run("threshold", "fork", mp_daemon.socket, DEPOT_MP_THRESHOLD="16")
    assert out["default"] == 16 and out["small"]["in_store"] is True


def test_a_bad_threshold_is_refused_naming_it(mp_daemon):
    with pytest.raises(AssertionError, match="DEPOT_MP_THRESHOLD='lots'"):
        run("threshold", "fork", mp_daemon.socket, DEPOT_MP_THRESHOLD="lots")


def test_without_a_socket_the_tree_gets_a_private_daemon_that_stops_with_it():
    out, _ = run("private", "spawn")
    assert out["exact"] and out["received"] == {"in_store": True, "writeable": True}
    # It allocates pages as objects use them (--no-prefault), not a segment ahead.
    assert out["store_pages"] < 64 << 20, out["store_pages"]
    assert wait_for(lambda: not os.path.exists(f"/proc/{out['daemon_pid']}"), timeout=20)
    assert not os.path.exists(os.path.dirname(out["socket"]))


def test_gpu_arrays_travel_as_handles_on_simulated_gpus():
    with depot.start_daemon(memory="64MiB", simulate_gpus="1:64MiB") as gpu_daemon:
        out, _ = run("gpu", "spawn", gpu_daemon.socket)
        assert out == {"type": "DeviceArray", "device": 0, "simulated": True, "exact": True}
        assert store_empties(gpu_daemon)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
@pytest.mark.parametrize("method", METHODS)
def test_torch_cpu_tensors_arrive_exact_in_the_store(mp_daemon, method):
    out, _ = run("torch", method, mp_daemon.socket)
    for name, seen in out.items():
        assert seen["exact"], name
    for name in ("f32", "bf16", "i64", "grad", "param", "strided"):
        assert out[name]["in_store"], name
    assert out["small"]["in_store"] is False
    assert out["grad"]["requires_grad"] and out["param"]["type"] == "Parameter"
    assert store_empties(mp_daemon)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
def test_conjugate_views_arrive_and_torch_shared_tensors_stay_shared(mp_daemon):
    out, _ = run("torch_odd", "spawn", mp_daemon.socket)
    assert out == {"conj_exact": True, "shared_updated": True}


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
def test_a_dataloader_left_early_killed_or_collected_leaves_nothing_within_its_ttl(mp_daemon):
    out, err = run("dataloader_left", "spawn", mp_daemon.socket)
    # Workers told to stop in the middle of a send exit, never abort (ReleaseGil).
    assert "terminate called" not in err and "Aborted" not in err, err
    assert out["ttl"] == 2.0 and out["first_exact"] and out["prefetched"] is not None
    assert out["break_left"] > 0  # prefetched batches waited in the store...
    for case in ("break", "killed", "collected"):  # ...and went within the ttl (2 s), plus slack
        assert out[case + "_empty_after"] is not None, case
    assert "exited unexpectedly" in out["killed_error"] or "killed" in out["killed_error"]
    assert store_empties(mp_daemon)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
def test_a_dataloader_left_early_with_no_ttl_leaves_nothing_once_its_workers_have_gone(mp_daemon):
    out, err = run("dataloader_graced", "spawn", mp_daemon.socket)
    assert "terminate called" not in err and "Aborted" not in err, err
    assert out["ttl"] is None and out["first_exact"] and out["prefetched"] is not None, out
    assert out["workers_alive"] and out["waiting"] >= 3, out  # prefetched, waiting
    assert out["workers_exited_after"] is not None, out
    # Gone within the workers' grace after they exited (20 graces of slack on a busy machine),
    # though the tree lives on and no ttl was set.
    assert out["empty_after"] is not None, out
    assert store_empties(mp_daemon)


def test_values_that_fail_to_pickle_are_refused_and_leave_no_send_under_way(mp_daemon):
    out, err = run("bad_send", "fork", mp_daemon.socket)
    assert out["reported"] and out["good"] == 2.0
    assert out["pipe_error"] in ("PicklingError", "AttributeError")  # a local function
    assert out["queue_under_way"] == 0 and out["pipe_under_way"] == 0, out
    assert "Can't pickle" in err or "PicklingError" in err  # the feeder's report
    assert store_empties(mp_daemon)


def test_a_value_received_after_its_ttl_is_a_clear_error_and_bad_ttls_are_refused(mp_daemon):
    out, _ = run("late_receiver", "fork", mp_daemon.socket)
    assert out["stored"] is not None and out["empty_after"] is not None
    assert out["error"].startswith("NotHeld: depot.multiprocessing received a value the store")
    assert "set_handoff_ttl" in out["error"]
    assert len(out["bad"]) == 5
    assert all("a handoff ttl is seconds from 0.001 to 4294967" in b for b in out["bad"]), out["bad"]
    assert store_empties(mp_daemon)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
def test_a_dataloader_with_two_workers_delivers_batches_in_the_store(mp_daemon):
    out, _ = run("dataloader", "spawn", mp_daemon.socket)
    batches = out["batches"]
    assert [b["values"] for b in batches] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    assert all(b["in_store"] for b in batches)
    assert store_empties(mp_daemon)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
@pytest.mark.parametrize("method", METHODS)
def test_a_child_writing_a_received_tensor_in_place_runs_through_depot_and_torch(
    mp_daemon, method
):
    out, _ = run("torch_write", method, mp_daemon.socket)
    assert out == {"exitcode": 0, "total": float(1 << 20), "sender_unchanged": True}
    # torch.multiprocessing keeps its own semantics: the tensor moved to torch's shared
    # memory, which the child's write changes for the sender too.
    out, _ = run("torch_write_torch", method, mp_daemon.socket)
    assert out == {"exitcode": 0, "total": float(1 << 20), "sender_unchanged": False}
    assert store_empties(mp_daemon)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs PyTorch (pip install torch)")
def test_torchs_sharing_strategy_functions_are_there_and_do_what_they_say(mp_daemon):
    out, _ = run("strategies", "spawn", mp_daemon.socket)
    assert out["default"] == "depot"
    assert out["all"] == ["depot", "file_descriptor", "file_system"]
    assert "unknown sharing strategy 'carrier_pigeon'" in out["unknown"]
    assert out["depot_in_store"] is True
    assert out["now"] == out["torch_now"] == "file_system"
    assert out["file_system_in_store"] is False and out["file_system_exact"]
    assert store_empties(mp_daemon)


@pytest.mark.skipif(not HAVE_PADDLE, reason="needs Paddle (pip install paddlepaddle)")
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_paddle_tensors_arrive_exact_writable_and_in_the_store_after_their_sender_exits(
    mp_daemon, method
):
    out, _ = run("paddle", method, mp_daemon.socket)
    assert out.pop("producer_exitcode") == 0
    assert out.pop("written") and out.pop("second_exact") and out.pop("sender_exact")
    assert out.pop("param_name") == "create_parameter_0.w_0" and out.pop("param_trainable")
    for name, seen in out.items():
        assert seen["exact"] and seen["place"] == "Place(cpu)", name
    for name in ("f32", "bf16", "i64", "bool", "c64", "grad", "param", "strided"):
        assert out[name]["in_store"], name
    assert not out["small"]["in_store"] and not out["empty"]["in_store"]
    assert out["param"]["type"] == "EagerParamBase" and not out["param"]["stop_gradient"]
    assert not out["grad"]["stop_gradient"] and out["f32"]["stop_gradient"]
    assert store_empties(mp_daemon)
