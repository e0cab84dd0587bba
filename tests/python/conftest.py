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


def store_pages(pid):
    """The bytes allocated in the files of the depotd ``pid`` (its memfds: segments, header
    and lease tables), each file once: what it holds of the machine's memory, whether a
    process maps those pages or not."""
    import os

    files = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:depot-"):
                st = os.stat(path)
                files[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        except OSError:  # closed since listed
            continue
    return sum(files.values())


def address_of(array):
    return array.__array_interface__["data"][0]


def frame_of_every_kind(n):
    """A pandas DataFrame of ``n`` rows with a column of each kind depot stores with no copy
    (tests need pandas and pyarrow): datetimes (with and without a time zone), timedeltas,
    periods, Arrow strings (pandas' default "str" with pyarrow) and floats, categories,
    nullable integers and booleans; indexed by time."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    times = pd.date_range("2026-01-01", periods=n, freq="s", name="t")
    return pd.DataFrame(
        {
            "at": times.tz_localize("UTC"),
            "took": pd.to_timedelta(np.arange(n), unit="ms"),
            "day": pd.period_range("2026-01-01", periods=n, freq="D"),
            "name": pd.array([f"name-{i % 1000}" for i in range(n)], dtype="str"),
            "kind": pd.Categorical([f"kind-{i % 7}" for i in range(n)]),
            "count": pd.array(np.arange(n), dtype="Int64"),
            "even": pd.array(np.arange(n) % 2 == 0, dtype="boolean"),
            "load": pd.array(
                pa.array(np.arange(n, dtype=np.float32)), dtype=pd.ArrowDtype(pa.float32())
            ),
        },
        index=times,
    )


def pandas_buffers(value):
    """(address, size) of every non-empty buffer a pandas DataFrame, Series or Index keeps
    its rows in, index and categories included, following the layouts pandas uses: numpy
    arrays, masked arrays (nullable Int64, boolean), datetime-likes, Arrow arrays."""
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return pandas_buffers(value.index) + [
            b for _, column in value.items() for b in pandas_buffers(column)
        ]
    if isinstance(value, pd.MultiIndex):
        return [b for level in value.levels for b in pandas_buffers(level)] + [
            (address_of(codes), codes.nbytes) for codes in value.codes
        ]
    found = []
    if isinstance(value, pd.Series) and type(value.index) is not pd.RangeIndex:
        found += pandas_buffers(value.index)
    array, dtype = value.array, value.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        arrays = [array.codes]
        found += pandas_buffers(dtype.categories)
    elif isinstance(dtype, (pd.ArrowDtype, pd.StringDtype)):
        return found + [
            (b.address, b.size)
            for chunk in array.__arrow_array__().chunks
            for b in chunk.buffers()
            if b is not None and b.size
        ]
    elif hasattr(array, "_mask"):  # pandas' masked arrays: values and mask
        arrays = [array._data, array._mask]
    elif hasattr(array, "asi8"):  # datetimes, timedeltas, periods: a view as int64
        arrays = [array.asi8]
    else:
        arrays = [value.to_numpy()]
    return found + [(address_of(a), a.nbytes) for a in arrays if a.nbytes]


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
