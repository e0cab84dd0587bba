"""The info records (StoreStatus, GpuInfo, ObjectInfo, ClientInfo): every field of the C++
struct is a property, the repr names every field, and to_dict() holds every field as a plain
value (ids and GPU uuids as hex strings, nested records as dicts)."""

import json
import os
import re
import time

import pytest

import depot

RECORDS = [depot.StoreStatus, depot.GpuInfo, depot.ObjectInfo, depot.ClientInfo]
# Properties computed from fields, not fields themselves (not in repr or to_dict).
COMPUTED = {depot.ObjectInfo: {"sealed"}}


@pytest.fixture
def gpu_daemon():
    with depot.start_daemon(
        memory="64MiB", segment_size="16MiB", simulate_gpus="2:64MiB", args=["--max-objects", "500"]
    ) as d:
        yield d


@pytest.fixture
def gpu_client(gpu_daemon):
    with gpu_daemon.client(name="test-info") as c:
        yield c


def properties(cls):
    return {name for name in dir(cls) if isinstance(getattr(cls, name), property)}


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_field_is_a_property_and_nothing_else_is(cls):
    # _fields comes from the same table as the C++ conversion, which a static_assert checks
    # against the struct's members: a member missing in Python cannot compile.
    assert len(cls._fields) == len(set(cls._fields)) > 0
    assert properties(cls) == set(cls._fields) | COMPUTED.get(cls, set())


def test_fields_new_to_python_are_there():
    assert "header_slots" in depot.StoreStatus._fields
    assert "connected_time_ns" in depot.ClientInfo._fields
    assert {"state", "has_checksum", "checksum", "segment", "offset"} <= set(
        depot.ObjectInfo._fields
    )


def check_record(record):
    """repr names every field in order with its value; to_dict has every field."""
    cls = type(record)
    text = repr(record)
    assert text.startswith(cls.__name__ + "(") and text.endswith(")")
    assert "object at 0x" not in text
    positions = [text.find(f"{name}=") for name in cls._fields]
    assert -1 not in positions and positions == sorted(positions), text
    d = record.to_dict()
    assert list(d) == list(cls._fields)
    json.dumps(d)  # plain values only
    for name, value in d.items():
        prop = getattr(record, name)
        if isinstance(prop, bytes):
            continue  # ids and uuids: hex in to_dict, checked where they are known
        if isinstance(prop, list) and prop and hasattr(prop[0], "to_dict"):
            assert value == [p.to_dict() for p in prop]
        elif hasattr(prop, "to_dict"):  # a nested record (StoreStatus.scheduler)
            assert value == check_record(prop), name
            assert f"{name}={prop!r}" in text
        else:
            assert value == prop, name
            if not isinstance(prop, list):
                assert f"{name}={prop!r}" in text
    return d


def test_store_status(gpu_client, gpu_daemon):
    gpu_client.put(b"x" * 1000, name="one")
    status = gpu_client.status()
    d = check_record(status)
    assert d["header_slots"] == status.header_slots == 500
    assert d["pid"] == gpu_daemon.pid
    assert d["socket_path"] == gpu_daemon.socket
    assert d["capacity_bytes"] == 64 << 20
    assert d["objects_sealed"] == d["objects_on_host"] == 1
    assert d["clients"] == 1
    assert d["gpu_backend"] == "simulated"
    assert "header_slots=500" in repr(status)
    assert f"socket_path='{gpu_daemon.socket}'" in repr(status)
    assert [g["ordinal"] for g in d["gpus"]] == [0, 1]
    assert "gpus=[GpuInfo(ordinal=0, " in repr(status)
    assert isinstance(status.scheduler, depot.SchedulerStatus)
    assert d["scheduler"]["workers"] == status.scheduler.workers == 0
    assert d["scheduler"]["bandwidths_measured"] is True


def test_list_with_a_prefix_has_only_the_names_that_start_with_it(client):
    for name in ("runs/7/a", "runs/7/b", "runs/8/a", "runs/70"):
        client.put(b"x", name=name)
    assert sorted(o.name for o in client.list(prefix="runs/7/")) == ["runs/7/a", "runs/7/b"]
    assert sorted(o.name for o in client.list("runs/7")) == ["runs/7/a", "runs/7/b", "runs/70"]
    assert len(client.list()) == 4 and client.list("nothing/") == []
    with pytest.raises(depot.InvalidArgument, match="longer than the longest name"):
        client.list("r" * 5000)


def test_status_lists_the_daemons_settings(client, tmp_path):
    status = client.status()
    settings = {s.name: s.value for s in status.settings}
    assert isinstance(status.settings[0], depot.Setting)
    assert settings["memory"] == "256MiB"  # conftest's daemon
    assert settings["segment-size"] == "64MiB"
    assert settings["log-level"] == "warn"
    assert status.config_file == ""
    # From a configuration file: its path, and its values under the flags'.
    config = tmp_path / "depotd.toml"
    config.write_text('client-max-objects = 9\nmemory = "128MiB"\n')
    with depot.start_daemon(memory="32MiB", args=["--config", str(config)]) as d, d.client() as c:
        status = c.status()
        settings = {s.name: s.value for s in status.settings}
        assert status.config_file == str(config)
        assert settings["client-max-objects"] == "9"
        assert settings["memory"] == "32MiB"  # start_daemon's flag wins
        assert status.capacity_bytes == 32 << 20


def test_gpu_info(gpu_client):
    for gpu in gpu_client.gpus():
        d = check_record(gpu)
        assert isinstance(gpu.uuid, bytes) and len(gpu.uuid) == 16
        hex_uuid = gpu.uuid.hex()
        expected = "GPU-" + "-".join(
            [hex_uuid[:8], hex_uuid[8:12], hex_uuid[12:16], hex_uuid[16:20], hex_uuid[20:]]
        )
        assert d["uuid"] == expected
        assert f"uuid={expected}," in repr(gpu)
        assert d["simulated"] is True and d["name"] == gpu.name


def test_object_info(client):
    ref = client.put(b"payload", name="listed", pin=True)
    info = next(i for i in client.list() if i.name == "listed")
    d = check_record(info)
    assert info.id == ref.id and isinstance(info.id, bytes)  # the property stays bytes
    assert d["id"] == ref.id.hex() == ref.hex
    assert repr(info).startswith(f"ObjectInfo(id={ref.hex}, name='listed', state='sealed', ")
    assert d["state"] == "sealed" and info.sealed is True
    assert d["data_size"] == 7 and d["pinned"] is True and d["on_host"] is True
    assert d["owner_uid"] == os.getuid() and d["gpus"] == []
    assert d["has_checksum"] is False and d["checksum"] == 0
    assert d["segment"] == 0 and d["offset"] % 64 == 0


def test_an_object_being_created_says_so(client):
    buffer = client.create(16, name="unsealed")
    info = next(i for i in client.list() if i.name == "unsealed")
    assert info.state == "creating" and not info.sealed
    assert "state='creating'" in repr(info)
    assert info.to_dict()["ref_count"] == 1
    del buffer


def test_client_info(daemon):
    before = time.time_ns()
    with daemon.client(name="info-client") as c:
        after = time.time_ns()
        me = next(i for i in c.clients() if i.client_name == "info-client")
        d = check_record(me)
        assert before <= d["connected_time_ns"] == me.connected_time_ns <= after
        assert d["client_name"] == "info-client" and "client_name='info-client'" in repr(me)
        assert d["pid"] == os.getpid() and d["uid"] == os.getuid()
        assert re.search(r"connected_time_ns=\d+\)$", repr(me))


def _depotctl():
    import shutil
    import sys

    return shutil.which("depotctl") or os.path.join(os.path.dirname(sys.executable), "depotctl")


def test_names_that_are_not_utf8_read_as_replacement_characters(client, tmp_path):
    # What other clients name things is not trusted to be UTF-8: an object's name given as
    # bytes (depotctl takes argv as it is), a process's command as it named itself. Listing
    # them must work for everyone, with U+FFFD for the bytes that are not UTF-8.
    import subprocess
    import sys

    data = tmp_path / "data"
    data.write_bytes(b"x" * 100)
    subprocess.run(
        [_depotctl().encode(), b"--socket", client.socket.encode(), b"put", bytes(data),
         b"--name", b"bad\xff\xfename"],
        check=True, capture_output=True, timeout=60,
    )
    (listed,) = [o for o in client.list() if o.name.startswith("bad")]
    assert listed.name == "bad\ufffd\ufffdname"
    assert "bad" in repr(listed) and "bad" in json.dumps(listed.to_dict())

    # A client whose process named itself with bytes that are not UTF-8, and stays.
    renamed = (
        "import ctypes, sys, depot\n"
        "ctypes.CDLL(None).prctl(15, b'odd\\xff\\xfe', 0, 0, 0)\n"  # PR_SET_NAME
        "c = depot.Client(sys.argv[1])\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", renamed, client.socket], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        commands = [c.command for c in client.clients()]
        assert "odd\ufffd\ufffd" in commands, commands
        assert all(isinstance(c.to_dict()["command"], str) for c in client.clients())
    finally:
        child.stdin.close()
        child.wait(timeout=60)
