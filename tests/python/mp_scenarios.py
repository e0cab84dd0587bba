"""Programs for test_multiprocessing.py: each scenario runs as a process tree of its own
(`python mp_scenarios.py <scenario> <start method>`), as a user's program would, and prints
what it saw as one line of JSON. The store is the daemon at DEPOT_SOCKET (the test's, so
that it can look at the store once the tree has gone), or the module's private one."""

import gc
import json
import os
import signal
import sys
import time
import warnings

import numpy as np

import depot
import depot.multiprocessing as mp
from conftest import address_of, in_store, store_pages

MiB = 1 << 20


def arrays(seed):
    """Arrays of several dtypes, layouts and sizes, the same for a given seed."""
    rng = np.random.default_rng(seed)
    return {
        "f8_2d": rng.random((512, 300)),
        "f4_fortran": np.asfortranarray(rng.random((300, 400), dtype=np.float32)),
        "i1": rng.integers(-128, 127, size=3 * MiB + 7, dtype=np.int8),
        "bool": rng.random(MiB) > 0.5,
        "datetime": np.arange(100_000).astype("datetime64[ns]"),
        "strided": rng.random((1024, 256))[::2, ::3],
        "small": np.arange(10),
    }


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def describe(value):
    """Where a received array lies, and whether it can be written."""
    return {"in_store": in_store(address_of(value), max(value.nbytes, 1)),
            "writeable": bool(value.flags.writeable)}


def from_child(ctx, target, *args, count=1, timeout=60):
    """Runs ``target(q, *args)`` in a child of ``ctx`` and takes ``count`` items from its
    queue ``q``; returns them and the joined child."""
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(q, *args))
    p.start()
    items = [q.get(timeout=timeout) for _ in range(count)]
    p.join(60)
    return items, p


def tensors():
    """Tensors of several dtypes, layouts and kinds, the same on every call."""
    import torch

    torch.manual_seed(0)
    return {
        "f32": torch.rand(512, 512),
        "bf16": torch.rand(1024, 300).to(torch.bfloat16),
        "i64": torch.arange(200_000),
        "grad": torch.rand(300, 300, requires_grad=True),
        "param": torch.nn.Parameter(torch.rand(256, 256)),
        "small": torch.arange(5),
        "strided": torch.rand(512, 512).t(),
    }


# Children (module-level: spawn and forkserver import them).


def send_arrays(q, seed):
    q.put(arrays(seed))
    q.put({"nested": [arrays(seed)["i1"], {"deep": arrays(seed)["f8_2d"]}]})


def echo(q_in, q_out):
    while True:
        item = q_in.get()
        if item is None:
            return
        q_out.put(("sum", float(np.asarray(item, dtype=np.float64).sum()), describe(item)))


def pipe_child(conn):
    value = conn.recv()
    conn.send((describe(value), value * 2))
    conn.close()


def simple_child(q_in, q_out):
    value = q_in.get()
    q_out.put((describe(value), float(value.sum())))


def total_plus(args):
    array, i = args
    return float(array.sum()) + i


def put_and_die(q, ready):
    q.put(np.full(4 * MiB, 3.0))
    ready.set()
    time.sleep(60)  # killed before it ends


def take_and_hold(q, holding):
    value = q.get()
    holding.put(describe(value))
    time.sleep(60)  # killed holding the value


def put_many(q, n):
    for i in range(n):
        q.put(np.full(MiB, float(i)))


def send_tensors(q):
    q.put(tensors())


class Squares:
    """A dataset of ``n`` 1 MiB tensors."""

    def __init__(self, n=8):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        return torch.full((MiB // 4,), float(i), dtype=torch.float32)


def array_sum(array):
    return float(array.sum()), describe(array)


def add_one_in_place(tensor, done):
    tensor.add_(1)
    done.set()


def write_received(q_in, q_out):
    """Writes every array it receives in place; answers with what it then holds."""
    while True:
        item = q_in.get()
        if item is None:
            return
        item += 1
        q_out.put((float(item.sum()), describe(item)))


def read_received(q_in, q_out):
    item = q_in.get()
    q_out.put(float(item.sum()))


def add_one_to_received(q, out):
    """The issue's program: a child that writes a received tensor in place."""
    t = q.get()
    t.add_(1)
    out.put(float(t.sum()))


def paddle_tensors():
    """Paddle tensors of several dtypes and kinds, the same on every call."""
    import paddle

    paddle.seed(0)
    grad = paddle.rand([300, 300])
    grad.stop_gradient = False
    param = paddle.create_parameter([256, 256], "float32")
    param.set_value(paddle.rand([256, 256]))
    return {
        "f32": paddle.rand([512, 512]),
        "bf16": paddle.rand([1024, 300]).astype("bfloat16"),
        "i64": paddle.arange(200_000),
        "bool": paddle.rand([300_000]) > 0.5,
        "c64": paddle.complex(paddle.rand([100_000]), paddle.rand([100_000])),
        "grad": grad,
        "param": param,
        "small": paddle.arange(5),
        "strided": paddle.rand([512, 512]).t(),
        "empty": paddle.zeros([0, 3]),
    }


def send_paddle(q):
    """Sends the tensors, then exits before they are received."""
    q.put(paddle_tensors())


def send_gpu(q):
    from dlpack_util import FakeCudaArray

    array = np.arange(MiB, dtype=np.float32)
    q.put(FakeCudaArray(array, 0))


# Scenarios (in the tree's first process).


def scenario_queue(method):
    ctx = mp.get_context(method)
    (first, second), p = from_child(ctx, send_arrays, 7, count=2)
    expected = arrays(7)
    out = {
        "exact": all(same(first[k], expected[k]) for k in expected)
        and same(second["nested"][0], expected["i1"])
        and same(second["nested"][1]["deep"], expected["f8_2d"]),
        "received": {k: describe(v) for k, v in first.items()},
        "exitcode": p.exitcode,
    }
    # The other way: parent to child, and back.
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo, args=(q_in, q_out))
    p.start()
    for k in ("f8_2d", "i1"):
        q_in.put(expected[k])
    echoed = [q_out.get(timeout=60) for _ in range(2)]
    q_in.put(None)
    p.join(60)
    out["echoed"] = [e[1] for e in echoed]
    out["echo_expected"] = [float(expected[k].astype(np.float64).sum()) for k in ("f8_2d", "i1")]
    out["child_in_store"] = [e[2]["in_store"] for e in echoed]
    del first, second, echoed
    return out


def scenario_pipe(method):
    ctx = mp.get_context(method)
    parent, child = ctx.Pipe()
    p = ctx.Process(target=pipe_child, args=(child,))
    p.start()
    value = np.arange(MiB, dtype=np.float64)
    parent.send(value)
    seen, doubled = parent.recv()
    p.join(60)
    q_in, q_out = ctx.SimpleQueue(), ctx.SimpleQueue()
    p = ctx.Process(target=simple_child, args=(q_in, q_out))
    p.start()
    q_in.put(value)
    simple_seen, total = q_out.get()
    p.join(60)
    return {"child": seen, "doubled": same(doubled, value * 2), "returned": describe(doubled),
            "simple_child": simple_seen, "simple_total": total == float(value.sum())}


def scenario_pool(method):
    ctx = mp.get_context(method)
    big = np.random.default_rng(1).random(4 * MiB // 8)
    calls = {"handoff": 0, "again": 0}
    handoff, again = depot.Client._handoff, depot.Client.handoff_again

    def counting_handoff(self, value, *args, **kw):
        calls["handoff"] += 1
        return handoff(self, value, *args, **kw)

    def counting_again(self, ref, **kw):
        calls["again"] += 1
        return again(self, ref, **kw)

    depot.Client._handoff, depot.Client.handoff_again = counting_handoff, counting_again
    with ctx.Pool(2) as pool:
        # chunksize 1: each task pickles the array anew (in the pool's task thread).
        results = pool.map(total_plus, [(big, i) for i in range(8)], chunksize=1)
    expected = [float(big.sum()) + i for i in range(8)]
    return {"results": results == expected, "copies": calls["handoff"], "again": calls["again"]}


def scenario_sender_killed(method):
    ctx = mp.get_context(method)
    q, ready = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=put_and_die, args=(q, ready))
    p.start()
    ready.wait(60)
    # The feeder thread may still be writing: the value is whole once get returns it.
    value = q.get(timeout=60)
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    ok = bool((value == 3.0).all()) and value.size == 4 * MiB
    return {"value": ok, "received": describe(value), "exitcode": p.exitcode}


def scenario_receiver_killed(method):
    ctx = mp.get_context(method)
    q, holding = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=take_and_hold, args=(q, holding))
    p.start()
    q.put(np.full(2 * MiB, 5.0))
    seen = holding.get(timeout=60)
    objects_while_held = mp.store().status().objects_sealed
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    return {"child": seen, "objects_while_held": objects_while_held, "exitcode": p.exitcode}


def scenario_unclaimed(method):
    # One claimed; four left in the pipe, never taken.
    (first,), _ = from_child(mp.get_context(method), put_many, 5)
    return {"first": float(first[0]), "objects_in_flight": mp.store().status().objects_sealed - 1}


def scenario_full(method):
    ctx = mp.get_context(method)
    q = ctx.Queue()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        big = np.full(48 * MiB // 8, 2.0)  # larger than the test's 32 MiB store
        q.put(big)
        q.put(big)
        a, b = q.get(timeout=60), q.get(timeout=60)  # the feeder thread has warned by now
    messages = [str(w.message) for w in caught if issubclass(w.category, mp.StoreUnavailableWarning)]
    return {"exact": same(a, big) and same(b, big), "received": describe(a), "warnings": messages}


def scenario_threshold(method):
    ctx = mp.get_context(method)
    q = ctx.Queue()
    small, large = np.ones(1000), np.ones(MiB)
    q.put(small)
    q.put(large)
    out = {"default": mp.get_threshold(), "small": describe(q.get(timeout=60)),
           "large": describe(q.get(timeout=60))}
    mp.set_threshold(0)
    q.put(small)
    out["small_at_0"] = describe(q.get(timeout=60))
    return out


def scenario_torch(method):
    import torch

    (got,), _ = from_child(mp.get_context(method), send_tensors, timeout=120)
    out = {}
    for k, e in tensors().items():
        g = got[k]
        out[k] = {
            "exact": g.dtype == e.dtype and g.shape == e.shape and bool(torch.equal(g.detach(), e.detach())),
            "in_store": in_store(g.data_ptr(), g.element_size() * g.numel()),
            "type": type(g).__name__,
            "requires_grad": g.requires_grad,
        }
    return out


def scenario_paddle(method):
    import paddle

    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=send_paddle, args=(q,))
    p.start()
    p.join(120)  # the producer has exited before anything is received
    got = q.get(timeout=120)
    out = {"producer_exitcode": p.exitcode}
    for k, e in paddle_tensors().items():
        g = got[k]
        exact = g.dtype == e.dtype and list(g.shape) == list(e.shape)
        if exact and e.size:
            exact = bool(paddle.equal_all(g.astype("float32"), e.astype("float32")))
        out[k] = {"exact": exact, "type": type(g).__name__, "place": str(g.place),
                  "stop_gradient": g.stop_gradient,
                  "in_store": bool(g.size) and in_store(g.data_ptr(), g.size * g.element_size())}
    # In place: the receiver's own; a second receiver of the same value sees it as sent.
    f = got["f32"]
    before = float(f.sum())
    f.add_(paddle.ones_like(f))
    out["written"] = abs(float(f.sum()) - before - f.size) < 1.0
    out["param_name"] = got["param"].name
    out["param_trainable"] = got["param"].trainable
    value = paddle_tensors()["f32"]
    q.put(value)
    mine = q.get(timeout=60)
    mine.scale_(0.0)
    q.put(value)
    again = q.get(timeout=60)
    out["second_exact"] = bool(paddle.equal_all(again, paddle_tensors()["f32"]))
    out["sender_exact"] = bool(paddle.equal_all(value, paddle_tensors()["f32"]))
    return out


def scenario_dataloader(method):
    from torch.utils.data import DataLoader

    loader = DataLoader(Squares(), batch_size=2, num_workers=2,
                        multiprocessing_context=mp.get_context(method))
    batches = []
    for batch in loader:
        batches.append({
            "values": sorted(set(batch[:, 0].tolist())),
            "in_store": in_store(batch.data_ptr(), batch.element_size() * batch.numel()),
        })
    return {"batches": batches}


def _until(predicate, timeout):
    """Seconds until ``predicate()`` holds (None: not within ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        gc.collect()
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def _until_empty(timeout):
    """Seconds until the store holds no object (None: not within ``timeout``)."""
    return _until(lambda: mp.store().status().objects_sealed == 0, timeout)


def scenario_dataloader_left(method):
    """DataLoaders left early, while the program goes on: by a break, by a worker killed,
    and by being collected. What their workers prefetched goes within the ttl."""
    import torch
    from torch.utils.data import DataLoader

    ttl = 2.0
    mp.set_handoff_ttl(ttl)
    out = {"ttl": mp.get_handoff_ttl()}
    loader = DataLoader(Squares(64), batch_size=2, num_workers=2, prefetch_factor=4,
                        multiprocessing_context=mp.get_context(method))
    for i, batch in enumerate(loader):
        if i == 1:
            # The workers prefetch: batches wait in the store (besides the one held here).
            out["prefetched"] = _until(lambda: mp.store().status().objects_sealed >= 3, 60)
            # Counted before the break: shutting the loader's workers down after it can take
            # longer than the ttl on a busy machine, and the batches are gone by then.
            out["break_left"] = mp.store().status().objects_sealed - 1  # less the one held
            break
    del batch
    out["break_empty_after"] = _until_empty(20 * ttl)

    it = iter(loader)
    first = next(it)
    out["first_exact"] = bool(torch.equal(first[:, 0], torch.tensor([0.0, 1.0])))
    del first
    os.kill(it._workers[0].pid, signal.SIGKILL)
    try:
        for _ in range(64):
            next(it)
        out["killed_error"] = None
    except RuntimeError as e:
        out["killed_error"] = str(e)
    del it
    out["killed_empty_after"] = _until_empty(20 * ttl)
    if out["killed_empty_after"] is None:  # what is left, for the test's message
        out["killed_left"] = [str(o) for o in mp.store().list()]
        out["killed_clients"] = [str(c) for c in mp.store().clients()]

    it = iter(loader)
    next(it)
    del it, loader
    out["collected_empty_after"] = _until_empty(20 * ttl)
    return out


def scenario_dataloader_graced(method):
    """A DataLoader left early with no ttl set: what its workers prefetched waits while they
    live, and goes within their grace (DATALOADER_GRACE) once they have exited."""
    import torch
    from torch.utils.data import DataLoader

    from depot.multiprocessing import _store

    out = {"ttl": mp.get_handoff_ttl(), "grace": _store.DATALOADER_GRACE}
    loader = DataLoader(Squares(64), batch_size=2, num_workers=2, prefetch_factor=4,
                        multiprocessing_context=mp.get_context(method))
    it = iter(loader)
    first = next(it)
    out["first_exact"] = bool(torch.equal(first[:, 0], torch.tensor([0.0, 1.0])))
    del first
    out["prefetched"] = _until(lambda: mp.store().status().objects_sealed >= 3, 60)
    # No ttl: what waits stays while the workers live (they are not told to stop yet).
    workers = list(it._workers)
    out["workers_alive"] = all(w.is_alive() for w in workers)
    out["waiting"] = mp.store().status().objects_sealed
    del it  # the loop left early: the workers are told to stop, and exit
    out["workers_exited_after"] = _until(lambda: not any(w.is_alive() for w in workers), 60)
    out["empty_after"] = _until_empty(20 * _store.DATALOADER_GRACE)
    del loader
    return out


def scenario_late_receiver(method):
    """A value received after its ttl: a clear error, and nothing left."""
    mp.set_handoff_ttl(0.2)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    q.put(np.ones(MiB))
    # The feeder thread stores it; it goes once it has waited its ttl.
    stored = _until(lambda: mp.store().status().objects_sealed == 1, 60)
    empty_after = _until_empty(20)
    try:
        q.get(timeout=60)
        error = None
    except depot.DepotError as e:
        error = f"{type(e).__name__}: {e}"
    bad = []
    for wrong in (0, -1, "10", True, 1e10):
        try:
            mp.set_handoff_ttl(wrong)
        except ValueError as e:
            bad.append(str(e))
    return {"stored": stored, "empty_after": empty_after, "error": error, "bad": bad}


def scenario_bad_send(method):
    """Values that fail to pickle, beside arrays: refused as the standard module refuses
    them, and no send is left counted as under way (the process's exit would wait)."""
    from depot.multiprocessing import _reductions

    import threading

    ctx = mp.get_context(method)
    q = ctx.Queue()
    reported = threading.Event()
    report = type(q)._on_queue_feeder_error

    def feeder_error(e, obj):
        report(e, obj)
        reported.set()

    q._on_queue_feeder_error = feeder_error  # what the feeder thread calls, once started
    q.put([np.ones(MiB), lambda: 0])  # the last item: the feeder fails on it, and says so
    out = {"reported": reported.wait(60), "queue_under_way": _reductions._sending}
    q.put(np.full(MiB, 2.0))
    out["good"] = float(q.get(timeout=60)[0])
    a, b = ctx.Pipe()
    try:
        a.send([np.ones(MiB), lambda: 0])
        out["pipe_error"] = None
    except Exception as e:
        out["pipe_error"] = type(e).__name__
    out["pipe_under_way"] = _reductions._sending
    return out


def scenario_gpu(method):
    from dlpack_util import host_view

    (got,), _ = from_child(mp.get_context(method), send_gpu)
    view = host_view(got.ptr, got.nbytes, np.float32, got.shape)
    return {"type": type(got).__name__, "device": got.device, "simulated": got.simulated,
            "exact": same(view, np.arange(MiB, dtype=np.float32))}


def scenario_private(method):
    """No DEPOT_SOCKET: the module starts a daemon of its own, and says where."""
    (first, _), _ = from_child(mp.get_context(method), send_arrays, 3, count=2)
    daemon = mp._store._daemon
    return {"exact": same(first["i1"], arrays(3)["i1"]), "received": describe(first["i1"]),
            "daemon_pid": daemon.pid, "socket": daemon.socket,
            "store_pages": store_pages(daemon.pid)}


def scenario_standard(method):
    """The standard module's own contexts, and concurrent.futures, once depot.multiprocessing
    is imported: unchanged, unless enable_everywhere() (DEPOT_TEST_EVERYWHERE=1) opts in."""
    import concurrent.futures
    import multiprocessing

    if os.environ.get("DEPOT_TEST_EVERYWHERE") == "1":
        mp.enable_everywhere()
    ctx = multiprocessing.get_context(method)
    (first, _), _ = from_child(ctx, send_arrays, 5, count=2)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        total, seen = pool.submit(array_sum, np.full(MiB, 2.0)).result(timeout=120)
    return {"exact": same(first["i1"], arrays(5)["i1"]), "received": describe(first["i1"]),
            "pool_total": total, "pool_child": seen,
            "objects": mp.store().status().objects_sealed if mp._store._client else None}


def scenario_write(method):
    """Received arrays written in place: the writer's own; the sender's array, the store's
    object (the same array sent again is the same object) and a second receiver's value
    stay as they were."""
    ctx = mp.get_context(method)
    a = np.arange(MiB, dtype=np.float64)
    q_in, q_out = ctx.Queue(), ctx.Queue()
    writer = ctx.Process(target=write_received, args=(q_in, q_out))
    writer.start()
    q_in.put(a)
    written, seen = q_out.get(timeout=60)
    q_in.put(None)
    writer.join(60)
    reader = ctx.Process(target=read_received, args=(q_in, q_out))
    reader.start()
    q_in.put(a)  # sent again: handed off again, no new copy
    second = q_out.get(timeout=60)
    reader.join(60)
    # Here too: a received array written in place, then the store's object read again.
    q = ctx.Queue()
    q.put(a)
    mine = q.get(timeout=60)
    mine[:] = -1.0
    q.put(a)
    again = q.get(timeout=60)
    return {"written": written, "expected_written": float((a + 1).sum()), "seen": seen,
            "sender_unchanged": bool((a == np.arange(MiB)).all()), "second": second,
            "expected": float(a.sum()), "mine": float(mine.sum()), "again": float(again.sum()),
            "again_in_store": describe(again)["in_store"]}


def _write_in_child(ctx):
    import torch

    q, back = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=add_one_to_received, args=(q, back))
    child.start()  # before this process runs torch's thread pool: fork would inherit it
    t = torch.zeros(1 << 20)
    q.put(t)
    total = back.get(timeout=120)
    child.join(60)
    return {"exitcode": child.exitcode, "total": total, "sender_unchanged": float(t.sum()) == 0.0}


def scenario_torch_write(method):
    """The issue's first program: a child writes a tensor received through
    depot.multiprocessing in place."""
    return _write_in_child(mp.get_context(method))


def scenario_torch_write_torch(method):
    """The issue's second: the same through torch.multiprocessing, depot.multiprocessing
    imported (and unused)."""
    import torch.multiprocessing

    return _write_in_child(torch.multiprocessing.get_context(method))


def scenario_torch_cuda_write(method):
    """A CUDA tensor received and written in place (a real GPU): the writer's own copy; the
    sender's tensor and the store's object (the same tensor sent again) stay zeros."""
    import torch

    ctx = mp.get_context(method)
    q, back = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=add_one_to_received, args=(q, back))
    child.start()
    t = torch.zeros(1 << 20, device="cuda")
    q.put(t)
    total = back.get(timeout=120)
    child.join(60)
    q.put(t)
    again = q.get(timeout=60)
    again.add_(2)  # this process's own copy too
    q.put(t)
    third = q.get(timeout=60)
    return {"exitcode": child.exitcode, "total": total, "sender": float(t.sum()),
            "again": float(again.sum()), "third": float(third.sum()),
            "device": str(third.device)}


def scenario_strategies(method):
    """torch.multiprocessing's sharing-strategy functions, and what each strategy does."""
    import torch

    ctx = mp.get_context(method)
    out = {"default": mp.get_sharing_strategy(),
           "all": sorted(mp.get_all_sharing_strategies())}
    try:
        mp.set_sharing_strategy("carrier_pigeon")
    except ValueError as e:
        out["unknown"] = str(e)
    q = ctx.Queue()
    t = torch.rand(1 << 18)
    q.put(t)
    got = q.get(timeout=60)
    out["depot_in_store"] = in_store(got.data_ptr(), got.nbytes)
    mp.set_sharing_strategy("file_system")
    out["now"] = mp.get_sharing_strategy()
    out["torch_now"] = torch.multiprocessing.get_sharing_strategy()
    q.put(t)
    got = q.get(timeout=60)
    out["file_system_in_store"] = in_store(got.data_ptr(), got.nbytes)
    out["file_system_exact"] = bool(torch.equal(got, t))
    return out


def scenario_relayout(method):
    """The same array object sent with another shape, then another dtype, bytes unchanged."""
    ctx = mp.get_context(method)
    q = ctx.Queue()
    a = np.arange(4 * 16384, dtype=np.float64).reshape(4, 16384)
    q.put(a)
    first = q.get(timeout=60)
    a.shape = (16384, 4)
    q.put(a)
    second = q.get(timeout=60)
    a.dtype = np.int64
    q.put(a)
    third = q.get(timeout=60)
    return {"shapes": [list(first.shape), list(second.shape), list(third.shape)],
            "dtypes": [first.dtype.str, second.dtype.str, third.dtype.str],
            "exact": same(third, a)}


def scenario_torch_odd(method):
    """Tensors the store path must not break: a conjugate view, and a tensor in torch's
    shared memory, which must stay shared (Hogwild)."""
    import torch

    ctx = mp.get_context(method)
    q = ctx.Queue()
    z = torch.randn(1 << 16, dtype=torch.complex64)
    q.put(z.conj())
    conj = q.get(timeout=60)
    shared = torch.zeros(1 << 16)
    shared.share_memory_()
    done = ctx.Event()
    p = ctx.Process(target=add_one_in_place, args=(shared, done))
    p.start()
    done.wait(60)
    p.join(60)
    return {"conj_exact": bool(torch.equal(conj, z.conj())),
            "shared_updated": float(shared.sum()) == float(1 << 16)}


def scenario_exports(method):
    """Everything the standard module exports, and contexts of this module's own."""
    import multiprocessing

    ctx = mp.get_context(method)
    return {
        "missing": sorted(set(multiprocessing.__all__) - set(mp.__all__)),
        "context": type(ctx).__module__,
        "nested_context": type(ctx.get_context("spawn")).__module__,
        "default_process": mp.Process.__module__,
        "start_method": mp.get_start_method(),
        "standard_start_method": multiprocessing.get_start_method(),
    }


if __name__ == "__main__":
    name, method = sys.argv[1], sys.argv[2]
    result = globals()["scenario_" + name](method)
    gc.collect()
    print(json.dumps(result), flush=True)
