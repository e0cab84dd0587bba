"""Fixtures: every test gets its own depotd (started with depot.start_daemon) and a Client."""

import time

import pytest

import depot


@pytest.fixture
def daemon():
    with depot.start_daemon(memory="256MiB", segment_size="64MiB") as d:
        yield d


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


def wait_for(predicate, timeout=5.0, interval=0.005):
    """Polls until predicate() is true; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def store_mappings(pid="self"):
    """(start, end) of each mapping of an arena segment in a process (/proc/<pid>/maps):
    shared segments (depot-segment-N) and an object's own (depot-object-N)."""
    ranges = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and ("depot-segment-" in fields[5] or "depot-object-" in fields[5]):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def in_store(address, size, pid="self"):
    """Whether [address, address + size) lies inside one mapping of an arena segment."""
    return any(start <= address and address + size <= end for start, end in store_mappings(pid))


def address_of(array):
    return array.__array_interface__["data"][0]


def memory_kib(field, pid="self"):
    """A field of /proc/<pid>/status in KiB, e.g. RssAnon, RssShmem, VmRSS."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpu: needs a real CUDA GPU and CuPy or PyTorch (skipped, saying why, without them)",
    )
