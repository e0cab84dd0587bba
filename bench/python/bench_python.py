#!/usr/bin/env python3
"""Benchmarks of the Python client, each against baselines run in the same process.

  python bench/python/bench_python.py [--sizes 100MB,1GB] [--repeat 5] [--no-gpu | --gpu-only]

Needs the depot package installed (`pip install .`, or `make test-python`'s venv:
build-py/venv/bin/python) and numpy. It starts a private depotd.

1. get of a small object (100 bytes), each result dropped before the next get: leased (the
   client has seen the object, so it takes a lease in shared memory with no round trip, the
   default), and over the socket (from a second daemon started with --lease-entries 0, so
   every get is a round trip); and warm (the object is still held elsewhere in the process:
   answered from the client's own table). Against the binding's raw get (no decoding), a
   Unix socket round trip between two threads of this process and, if Ray is installed,
   ray.get of a small object.
2. put, then get, of an N-byte numpy array: against memcpy into a preallocated array (the
   floor for a put), multiprocessing.shared_memory (create a segment, copy the array in, which
   faults in its fresh pages; attach by name and view it) and pickle through a pipe
   (multiprocessing.Pipe, another thread receiving). Every get reads the array (a sum over one
   element per page), so no baseline gets away without touching its memory. If Ray is
   installed (`pip install ray`), ray.put and ray.get of the same array in a local Ray
   instance (its plasma store, started once, untimed) are added as a reference.

   Then the first full read of the array (get and a sum over every element) by a fresh
   process (a new spawned process each time, timed inside it), with and without
   populate=True, and Ray's first ray.get and sum in a Ray worker of a fresh object,
   against a sum of a private, warm array in this process (the floor for any read).

3. put_many of 10,000 small values (1 KiB numpy arrays) against a loop of put: the batch
   sends a few hundred puts per write instead of one round trip each. Then a list of 100
   named objects under one prefix among 100,000 others: list(prefix), which the daemon
   filters, against the whole list filtered in Python.

4. GPU objects (skipped with --no-gpu): get(..., device=0) of a small object (a
   depot.DeviceArray; plus a DLPack capsule of it) against a host get, on the host's CUDA GPUs
   if the daemon finds any, else on a simulated GPU; with CuPy or PyTorch on a real GPU, put
   and get-on-device of an N-byte GPU array (largest of --sizes, at most 1 GB) against a
   device-to-device copy in that library (the floor for a put).

Times are medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import statistics
import threading
import time
from multiprocessing import Pipe, shared_memory

import numpy as np

import depot
from echo import EchoSocket


def median_time(fn, repeat, before=None):
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_op(fn, n):
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n


def touch(array):
    """Reads one element per page, so a view must have its pages mapped."""
    flat = array.reshape(-1)
    step = max(1, 4096 // flat.itemsize)
    return float(flat[::step].sum())


def bench_small_get(client, socket_client, n, ray=None):
    def gets_of(c):
        ref = c.put(b"x" * 100)

        def run(k):
            for _ in range(k):
                c.get(ref)

        run(1000)  # the first get shows the client where the object lies
        return ref, run

    ref, leased = gets_of(client)
    _, round_trip_get = gets_of(socket_client)
    raw = socket_client._native  # the binding, without decoding
    raw_ref = socket_client.put(b"y" * 100)

    def binding(k):
        for _ in range(k):
            raw.get(raw_ref.id, 0)

    t_leased = min(per_op(leased, n) for _ in range(3))
    t_cold = min(per_op(round_trip_get, n) for _ in range(3))
    t_binding = min(per_op(binding, n) for _ in range(3))
    held = client.get(ref)  # noqa: F841 - keeps a reference: later gets are answered locally
    t_warm = min(per_op(leased, n) for _ in range(3))
    del held

    with EchoSocket() as echo:

        def round_trip(k):
            for _ in range(k):
                echo.round_trip()

        round_trip(1000)
        t_socket = min(per_op(round_trip, n) for _ in range(3))

    t_ray = None
    if ray is not None:
        ray_ref = ray.put(b"x" * 100)

        def ray_get(k):
            for _ in range(k):
                ray.get(ray_ref)

        ray_get(1000)
        t_ray = min(per_op(ray_get, min(n, 5000)) for _ in range(3))

    print("get of a 100-byte object (µs per get; ratio to the baseline)")
    print(f"  depot get, leased (no round trip) {t_leased * 1e6:6.2f} µs")
    print(f"  depot get, over the socket        {t_cold * 1e6:6.2f} µs   "
          f"leased is {t_cold / t_leased:.1f}x faster")
    print(f"  depot get, warm (held: local)     {t_warm * 1e6:6.2f} µs")
    print(f"  baseline: binding's raw get       {t_binding * 1e6:6.2f} µs   "
          f"depot socket / raw = {t_cold / t_binding:.2f}x")
    print(f"  baseline: socket round trip       {t_socket * 1e6:6.2f} µs   "
          f"depot socket / socket = {t_cold / t_socket:.2f}x, "
          f"leased / socket = {t_leased / t_socket:.2f}x  (two Python threads)")
    if t_ray is not None:
        print(f"  reference: ray.get               {t_ray * 1e6:6.2f} µs   "
              f"leased is {t_ray / t_leased:.1f}x faster")


def bench_put_many(client, n, repeat):
    values = [np.full(128, i, dtype=np.float64) for i in range(n)]  # 1 KiB each

    def one_by_one():
        refs = [client.put(v) for v in values]
        client.delete(refs)

    def batched():
        client.delete(client.put_many(values))

    t_loop = median_time(one_by_one, repeat) / n
    t_many = median_time(batched, repeat) / n
    print(f"put of {n} 1 KiB arrays (µs per value, including deleting them afterwards)")
    print(f"  depot put_many                  {t_many * 1e6:8.2f} µs")
    print(f"  baseline: a loop of put         {t_loop * 1e6:8.2f} µs   "
          f"put_many is {t_loop / t_many:.1f}x faster")


def bench_list_prefix(client, others, keys, repeat):
    """A store's keys (``keys`` named objects under one prefix) among ``others`` objects of
    other names: listed by the daemon with a prefix, against the whole list filtered here."""
    client.put_many([b"x"] * others, names=[f"bench-list/other/{i}" for i in range(others)])
    client.put_many([b"y"] * keys, names=[f"bench-list/store/c/{i}" for i in range(keys)])
    whole = median_time(
        lambda: [o for o in client.list() if o.name.startswith("bench-list/store/")], repeat)
    prefixed = median_time(lambda: client.list("bench-list/store/"), repeat)
    assert len(client.list("bench-list/store/")) == keys
    print(f"list of {keys} keys among {others:,} other objects (depot.zarr.Store's listings)")
    print(f"  depot list(prefix)              {prefixed * 1e3:8.2f} ms")
    print(f"  baseline: list() filtered here  {whole * 1e3:8.2f} ms   "
          f"list(prefix) is {whole / prefixed:.1f}x faster")
    names = [o.name for o in client.list("bench-list/")]
    for start in range(0, len(names), 10_000):
        client.delete(names[start : start + 10_000])


def start_ray(memory):
    """Starts a local Ray instance whose object store holds `memory` bytes, or returns None
    (and says why) if Ray is not installed or does not start."""
    try:
        import ray
    except ImportError:
        print("\n(ray is not installed: no Ray reference; pip install ray to add one)")
        return None
    try:
        ray.init(num_cpus=1, object_store_memory=memory, include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False)
    except Exception as e:  # a reference only: its failure must not stop the benchmark
        print(f"\n(ray did not start: {type(e).__name__}: {e}; no Ray reference)")
        return None
    return ray


def bench_ray(ray, array, expected, repeat):
    """Median ray.put and ray.get (+ reading the array) times of `array`."""
    put_times, get_times = [], []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        ref = ray.put(array)
        put_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert touch(ray.get(ref)) == expected
        get_times.append(time.perf_counter() - start)
        del ref
    return statistics.median(put_times), statistics.median(get_times)


def bench_array(client, size, repeat, ray=None):
    array = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).view(np.uint8)
    expected = touch(array)

    # depot
    refs = []

    def depot_put():
        refs.append(client.put(array))

    def depot_get():
        assert touch(client.get(refs[-1])) == expected

    put_times, get_times = [], []
    for _ in range(repeat):
        put_times.append(median_time(depot_put, 1))
        get_times.append(median_time(depot_get, 1))
        client.delete(refs.pop())
    d_put, d_get = statistics.median(put_times), statistics.median(get_times)

    # multiprocessing.shared_memory with a copy in
    put_times, get_times = [], []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        shm = shared_memory.SharedMemory(create=True, size=size)
        np.ndarray(array.shape, array.dtype, buffer=shm.buf)[:] = array
        put_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        other = shared_memory.SharedMemory(name=shm.name)
        view = np.ndarray(array.shape, array.dtype, buffer=other.buf)
        assert touch(view) == expected
        get_times.append(time.perf_counter() - start)
        del view
        other.close()
        shm.close()
        shm.unlink()
    s_put, s_get = statistics.median(put_times), statistics.median(get_times)

    # memcpy: a copy into a preallocated, already-touched array (the floor for any put)
    target = np.empty_like(array)
    target[:] = 0
    m_copy = median_time(lambda: np.copyto(target, array), repeat)
    del target

    # pickle through a pipe: send (put) and receive + unpickle (get) overlap, so only the
    # total is meaningful.
    totals = []
    for _ in range(repeat):
        receiver, sender = Pipe(duplex=False)
        got = []
        gc.collect()
        start = time.perf_counter()
        thread = threading.Thread(target=lambda: got.append(receiver.recv()))
        thread.start()
        sender.send(array)
        thread.join()
        assert touch(got[0]) == expected
        totals.append(time.perf_counter() - start)
        del got
        receiver.close()
        sender.close()
    p_total = statistics.median(totals)

    r_put = r_get = None
    if ray is not None:
        r_put, r_get = bench_ray(ray, array, expected, repeat)

    mb = size / 1e6
    d_total, s_total = d_put + d_get, s_put + s_get
    print(f"\nput + get of a {mb:.0f} MB numpy array (ms; GB/s of the total; ratio: baseline / depot)")
    print(f"  depot               put {d_put * 1e3:8.2f}  get {d_get * 1e3:7.3f}  "
          f"total {d_total * 1e3:8.2f} ms  {size / d_total / 1e9:6.2f} GB/s")
    print(f"  baseline: memcpy    put {m_copy * 1e3:8.2f}                                "
          f"       depot put / memcpy = {d_put / m_copy:.2f}x")
    print(f"  shared_memory+copy  put {s_put * 1e3:8.2f}  get {s_get * 1e3:7.3f}  "
          f"total {s_total * 1e3:8.2f} ms  {size / s_total / 1e9:6.2f} GB/s   "
          f"depot is {s_total / d_total:.2f}x faster")
    print(f"  pickle via pipe                                   "
          f"total {p_total * 1e3:8.2f} ms  {size / p_total / 1e9:6.2f} GB/s   "
          f"depot is {p_total / d_total:.2f}x faster")
    if r_put is not None:
        r_total = r_put + r_get
        print(f"  ray.put + ray.get   put {r_put * 1e3:8.2f}  get {r_get * 1e3:7.3f}  "
              f"total {r_total * 1e3:8.2f} ms  {size / r_total / 1e9:6.2f} GB/s   "
              f"depot is {r_total / d_total:.2f}x faster")


_reader = None


def first_read(socket, ref, populate, keep_client=False):
    """Seconds from a get of `ref` to the end of a sum over it, and the sum; with
    `keep_client`, through a client this process keeps between calls."""
    global _reader
    client = _reader if keep_client and _reader is not None else depot.Client(socket)
    try:
        start = time.perf_counter()
        value = client.get(ref, populate=populate)
        total = float(value.sum())
        return time.perf_counter() - start, total
    finally:
        del value
        if keep_client:
            _reader = client
        else:
            client.close()


def bench_first_read(client, size, repeat, ray=None):
    """A fresh process's first full read of an array of `size` bytes, depot with and
    without populate and Ray, against a sum of a warm private array."""
    pages = client.status().arena_page_bytes
    array = np.random.default_rng(1).random(size // 8)  # float64: a sum runs at memory speed
    expected = float(array.sum())
    floor = median_time(array.sum, repeat)
    spawn = multiprocessing.get_context("spawn")
    times = {False: [], True: []}
    with spawn.Pool(1, maxtasksperchild=1) as pool:
        for _ in range(repeat):
            ref = client.put(array)
            for populate in (False, True):
                seconds, total = pool.apply(first_read, (client.socket, ref, populate))
                assert np.isclose(total, expected, rtol=1e-9)
                times[populate].append(seconds)
            client.delete(ref)
    # A reader that lives on, as a worker does: each object is a new one (put after the last
    # was deleted), read once; its first read is left out, as Ray's workers' are below.
    kept_times = []
    with spawn.Pool(1) as pool:
        for i in range(repeat + 1):
            ref = client.put(array)
            seconds, total = pool.apply(first_read, (client.socket, ref, False, True))
            assert np.isclose(total, expected, rtol=1e-9)
            if i > 0:
                kept_times.append(seconds)
            client.delete(ref)
    r_first = None
    if ray is not None:
        @ray.remote
        def ray_first_read(refs):
            start = time.perf_counter()
            total = float(ray.get(refs[0]).sum())
            return time.perf_counter() - start, total

        r_times = []
        for i in range(repeat + 1):
            ref = ray.put(array)
            seconds, total = ray.get(ray_first_read.remote([ref]))
            assert np.isclose(total, expected, rtol=1e-9)
            if i > 0:
                r_times.append(seconds)
            del ref
        r_first = statistics.median(r_times)
    plain, populated = statistics.median(times[False]), statistics.median(times[True])
    kept = statistics.median(kept_times)
    print(f"\nfirst full read (get + sum) of a new {size / 1e6:.0f} MB array, an arena of "
          f"{pages >> 10} KiB pages (ms; ratio to the floor)")
    print(f"  baseline: sum of a warm private array        {floor * 1e3:8.2f}")
    print(f"  depot get, a fresh process                   {plain * 1e3:8.2f}   "
          f"{plain / floor:5.2f}x")
    print(f"  depot get(populate=True), a fresh process    {populated * 1e3:8.2f}   "
          f"{populated / floor:5.2f}x")
    print(f"  depot get, a reader that read the last one   {kept * 1e3:8.2f}   "
          f"{kept / floor:5.2f}x")
    if r_first is not None:
        print(f"  ray.get in a Ray worker that read the last  {r_first * 1e3:8.2f}   "
              f"{r_first / floor:5.2f}x   depot's reader is {r_first / kept:.2f}x faster")


def free_huge_page_bytes():
    """Bytes of the host's reserved huge pages that are free (/proc/meminfo)."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info[key] = int(value.split()[0])
    return info.get("HugePages_Free", 0) * info.get("Hugepagesize", 0) * 1024


def _gpu_library():
    """(name, module) of CuPy or PyTorch if one sees a CUDA device, else (None, None)."""
    for name in ("torch", "cupy"):
        try:
            module = __import__(name)
            count = (module.cuda.device_count() if module.cuda.is_available() else 0) \
                if name == "torch" else module.cuda.runtime.getDeviceCount()
        except Exception:
            continue
        if count:
            return name, module
    return None, None


def bench_gpu(size, repeat, n):
    with depot.start_daemon(memory=size + (256 << 20), segment_size=size + (64 << 20)) as d:
        with d.client() as client:
            real = bool(client.gpus())
    simulate = None if real else "1:256MiB"
    with depot.start_daemon(memory=size + (256 << 20), segment_size=size + (64 << 20),
                            simulate_gpus=simulate) as daemon, daemon.client() as client:
        ref = client.put(b"x" * 100)
        # With CUDA GPUs a worker of the daemon page-locks the host arena after start-up,
        # which takes the driver about 0.6 s per GiB: measure after it, not alongside.
        deadline = time.monotonic() + 30
        while real and time.monotonic() < deadline:
            status = client.status()
            if status.arena_page_locked_bytes >= status.mapped_bytes:
                break
            time.sleep(0.05)

        def host_get(k):
            for _ in range(k):
                client.get(ref)

        def device_get(k):
            for _ in range(k):
                client.get(ref, device=0)

        def device_get_dlpack(k):
            for _ in range(k):
                client.get(ref, device=0).__dlpack__(max_version=(1, 0))

        device_get(100)
        t_host = min(per_op(host_get, n) for _ in range(3))
        t_dev = min(per_op(device_get, n) for _ in range(3))
        t_cap = min(per_op(device_get_dlpack, n) for _ in range(3))
        where = "a CUDA GPU" if real else "a simulated GPU"
        print(f"get of a 100-byte object on {where} (µs per get, cold)")
        print(f"  depot get(device=0): DeviceArray {t_dev * 1e6:8.2f} µs")
        print(f"  ... and a DLPack capsule         {t_cap * 1e6:8.2f} µs")
        print(f"  baseline: host get               {t_host * 1e6:8.2f} µs   "
              f"device / host = {t_dev / t_host:.2f}x")
        name, lib = _gpu_library()
        if not real or lib is None:
            print("  (no CuPy/PyTorch on a real GPU: GPU array put/get skipped)")
            return
        if name == "torch":
            x = lib.ones(size // 4, dtype=lib.float32, device="cuda:0")
            sync = lib.cuda.synchronize
            as_lib = lib.from_dlpack
        else:
            x = lib.ones(size // 4, dtype=lib.float32)
            sync = lib.cuda.runtime.deviceSynchronize
            as_lib = lib.from_dlpack
        refs = []

        def put_growing():
            # Every earlier object is kept: each put takes memory the pool has never had, so
            # it includes allocating a chunk (cuMemCreate, map, export) and importing it here.
            refs.append(client.put(x))

        warm = []

        def put_warm():
            # The previous object is deleted first (untimed), so the pool has room: a put
            # into memory the pool and this process already have, the steady state.
            warm.append(client.put(x))

        def delete_warm():
            while warm:
                client.delete(warm.pop())

        def get():
            y = as_lib(client.get(refs[-1], device=0))
            sync()
            return y

        def copy():
            # The library's caching allocator reuses the memory of the previous copy: the
            # steady state, like put_warm.
            y = x.clone() if name == "torch" else x.copy()
            sync()
            return y

        def delete_warm_and_sync():
            delete_warm()
            sync()

        # Each timing starts with the GPU idle (sync first, untimed), so that no earlier
        # work, the array's own initialisation included, is counted.
        t_grow = median_time(put_growing, repeat, before=sync)
        t_get = median_time(get, repeat, before=sync)
        for r in refs:
            client.delete(r)
        put_warm()
        t_warm = median_time(put_warm, repeat, before=delete_warm_and_sync)
        delete_warm()
        t_copy = median_time(copy, repeat, before=sync)
        gb = size / 1e9
        print(f"put / get(device=0) of a {size / 1e6:.0f} MB {name} array on GPU 0")
        print(f"  depot put, warm pool            {t_warm * 1e3:8.2f} ms  {gb / t_warm:6.1f} GB/s"
              f"   put / copy = {t_warm / t_copy:.2f}x")
        print(f"  depot put, pool growing         {t_grow * 1e3:8.2f} ms  {gb / t_grow:6.1f} GB/s"
              f"   put / copy = {t_grow / t_copy:.2f}x  (a new chunk each)")
        print(f"  depot get + {name}.from_dlpack   {t_get * 1e3:8.2f} ms  (no copy)")
        print(f"  baseline: {name} DtoD copy      {t_copy * 1e3:8.2f} ms  {gb / t_copy:6.1f} GB/s")


def parse_size(text):
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    t = text.strip().upper()
    for u, f in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * f)
    return int(t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100MB,1GB", help="array sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gets", type=int, default=20000, help="small gets per measurement")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU benchmarks")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU benchmarks (part 4; scripts/gpu-check.sh run)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray reference")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    largest = max(sizes)
    if args.gpu_only:
        bench_gpu(min(largest, 1 << 30), args.repeat, min(args.gets, 5000))
        return
    memory = 2 * largest + (256 << 20)
    ray = None if args.no_ray else start_ray(memory)
    with depot.start_daemon(memory=memory, segment_size=largest + (64 << 20)) as daemon:
        with daemon.client() as client:
            with depot.start_daemon(memory="64MiB", args=["--lease-entries", "0"]) as plain:
                with plain.client() as socket_client:
                    bench_small_get(client, socket_client, args.gets, ray)
            bench_put_many(client, 10_000, args.repeat)
            bench_list_prefix(client, 100_000, 100, args.repeat)
            for size in sizes:
                bench_array(client, size, args.repeat, ray)
            bench_first_read(client, largest, args.repeat, ray)
    huge_memory = memory - memory % (2 << 20)
    if free_huge_page_bytes() >= huge_memory:
        with depot.start_daemon(memory=huge_memory, segment_size=largest + (64 << 20),
                                args=["--huge-pages"]) as daemon, daemon.client() as client:
            bench_first_read(client, largest, args.repeat)
    else:
        print(f"\n(no first read with 2 MiB pages: {free_huge_page_bytes() >> 20} MiB of huge "
              f"pages reserved and free, {huge_memory >> 20} MiB needed: vm.nr_hugepages)")
    if ray is not None:
        ray.shutdown()
    if not args.no_gpu:
        bench_gpu(min(largest, 1 << 30), args.repeat, min(args.gets, 5000))


if __name__ == "__main__":
    main()
