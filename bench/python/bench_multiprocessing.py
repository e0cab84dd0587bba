#!/usr/bin/env python3
"""Arrays and tensors through a multiprocessing Queue (issue 17): depot.multiprocessing
against the standard multiprocessing and torch.multiprocessing, in the same run.

  python bench/python/bench_multiprocessing.py [--mb 1,100,1000] [--repeat 5] [--method fork]

Each implementation runs in a process of its own (importing depot.multiprocessing or
torch.multiprocessing changes how every multiprocessing pickler sends arrays, so they must
not share one). There, a child process takes values from a Queue and answers each with a
few bytes; timed: from `q.put(value)` in the parent to the child's answer, for a fresh
value each time (made before the clock starts), median of --repeat after one warm-up. The
child reads one element of what it got, then drops it.

- std: `multiprocessing`, which pickles the bytes through a pipe. (Importing torch gives the
  standard module torch.multiprocessing's reducers; for tensors they are removed again, so
  that std pickles tensors by value as it does anything else.)
- depot: `depot.multiprocessing` (its private daemon): one copy into the store, the child
  maps it.
- torch: `torch.multiprocessing` (tensors only: it sends numpy arrays as std does), which
  moves a tensor's storage into shared memory and sends a file descriptor.

Baseline in the same run: np.copyto of one value into a preallocated array (memcpy).

Then two faults. A child sends a tensor and exits before the parent takes it: with
torch.multiprocessing the receiver must fetch the storage's descriptor from the (gone)
sender. And the leak check: a child sends a tensor (or array), the parent receives it, and both
are killed with SIGKILL; counted afterwards: torch's shared-memory files left in /dev/shm
with its `file_system` sharing strategy, and the objects left in the store with depot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

MB = 1_000_000


# In the measuring process.


def _echo(q, answers):
    while True:
        value = q.get()
        if value is None:
            return
        first = float(value.reshape(-1)[0])
        del value
        answers.put(first)


def _measure(impl: str, kind: str, mb: float, repeat: int, method: str) -> dict:
    import numpy as np

    if impl == "depot":
        import depot.multiprocessing as mp
    elif impl == "torch":
        import torch.multiprocessing as mp
    else:
        import multiprocessing as mp
    if kind == "tensor":
        import torch

        torch.set_num_threads(1)
        if impl == "std":
            # Importing torch registered torch.multiprocessing's reducers with the standard
            # module's pickler: without them it pickles tensors by value, as it would
            # anything else.
            from multiprocessing.reduction import ForkingPickler

            ForkingPickler._extra_reducers.clear()
    n = int(mb * MB) // 8
    ctx = mp.get_context(method)
    q, answers = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_echo, args=(q, answers), daemon=True)
    child.start()

    def fresh(i):
        array = np.full(n, float(i))
        return torch.from_numpy(array) if kind == "tensor" else array

    times = []
    for i in range(repeat + 1):
        value = fresh(i + 1)
        start = time.perf_counter()
        q.put(value)
        got = answers.get(timeout=600)
        elapsed = time.perf_counter() - start
        assert got == float(i + 1), (got, i + 1)
        del value
        if i > 0:
            times.append(elapsed)
    q.put(None)
    child.join(60)
    src = np.full(n, 1.0)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copies = []
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "memcpy_s": min(copies)}


def _leak(impl: str, kind: str, method: str) -> None:
    """Child sends, parent receives, then this process kills the child and itself."""
    if impl == "depot":
        import depot.multiprocessing as mp
    else:
        import torch.multiprocessing as mp

        mp.set_sharing_strategy("file_system")
    ctx = mp.get_context(method)
    q, ready = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_send_and_wait, args=(q, ready, kind))
    child.start()
    value = q.get(timeout=120)
    assert float(value.reshape(-1)[0]) == 1.0
    ready.wait(120)
    os.kill(child.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _send_and_exit(q, kind):
    import numpy as np

    array = np.full(8 * MB // 8, 1.0)
    if kind == "tensor":
        import torch

        array = torch.from_numpy(array)
    q.put(array)
    q.close()
    q.join_thread()  # sent: the process then exits


def _sender_gone(impl: str, method: str) -> str:
    """A child sends a tensor and exits; the parent takes it only then."""
    if impl == "depot":
        import depot.multiprocessing as mp
    else:
        import torch.multiprocessing as mp
    ctx = mp.get_context(method)
    q = ctx.Queue()
    child = ctx.Process(target=_send_and_exit, args=(q, "tensor"))
    child.start()
    child.join(120)
    try:
        value = q.get(timeout=120)
        return "received intact" if float(value.reshape(-1)[0]) == 1.0 else "received wrong"
    except Exception as e:  # what the receiver sees
        return f"lost: {type(e).__name__}: {e}"


def _send_and_wait(q, ready, kind):
    import numpy as np

    array = np.full(8 * MB // 8, 1.0)
    if kind == "tensor":
        import torch

        q.put(torch.from_numpy(array))
    else:
        q.put(array)
    ready.set()
    time.sleep(600)


# The driver.


def _run(*args: str, env=None) -> str:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          env=env, timeout=3600)
    if done.returncode != 0 and args[0] != "--leak":
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _torch_shm_files() -> int:
    return sum(1 for f in os.listdir("/dev/shm") if f.startswith("torch_"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", default="1,100,1000", help="value sizes, MB (10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--method", default="fork", choices=["fork", "spawn", "forkserver"])
    args = parser.parse_args()
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    print(f"# {args.method}, median of {args.repeat} sends of a fresh value (10x more below 10 MB, "
          "half at 1000 MB); speed-up over std, and time as a multiple of one memcpy of the value")
    print(f"{'value':>14} {'impl':>6} {'ms':>9} {'speed-up':>8} {'x memcpy':>9}")
    for mb in (float(x) for x in args.mb.split(",")):
        repeat = args.repeat * 10 if mb < 10 else args.repeat if mb < 1000 else max(2, args.repeat // 2)
        for kind in ("ndarray", "tensor") if have_torch else ("ndarray",):
            impls = ["std", "depot"] + (["torch"] if kind == "tensor" else [])
            results = {}
            for impl in impls:
                out = _run("--measure", impl, kind, repr(mb), str(repeat), args.method)
                results[impl] = json.loads(out.strip().splitlines()[-1])
            base = results["std"]["median_s"]
            for impl in impls:
                r = results[impl]
                print(f"{f'{mb:g} MB {kind}':>14} {impl:>6} {r['median_s'] * 1e3:9.2f} "
                      f"{base / r['median_s']:8.2f} {r['median_s'] / r['memcpy_s']:9.2f}")
    if have_torch:
        print("\n# a sender that exits as soon as it has sent a tensor")
        for impl in ("torch", "depot"):
            out = _run("--sender-gone", impl, args.method).strip().splitlines()
            print(f"{impl}: {out[-1] if out else 'no answer'}")
    print("\n# leaks after SIGKILL of sender and receiver")
    if have_torch:
        before = _torch_shm_files()
        _run("--leak", "torch", "tensor", args.method)
        time.sleep(1)  # torch_shm_manager, if any, cleans up asynchronously
        print(f"torch.multiprocessing (file_system): {_torch_shm_files() - before} "
              "shared-memory files left in /dev/shm")
    import depot

    with depot.start_daemon(memory="1GiB") as daemon:
        env = dict(os.environ, DEPOT_SOCKET=daemon.socket)
        _run("--leak", "depot", "ndarray", args.method, env=env)
        with daemon.client() as client:
            deadline = time.monotonic() + 10
            while client.status().objects_sealed and time.monotonic() < deadline:
                time.sleep(0.01)
            print(f"depot.multiprocessing: {client.status().objects_sealed} objects left in "
                  "the store")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        impl, kind, mb, repeat, method = sys.argv[2:7]
        print(json.dumps(_measure(impl, kind, float(mb), int(repeat), method)))
    elif len(sys.argv) > 1 and sys.argv[1] == "--sender-gone":
        print(_sender_gone(*sys.argv[2:4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--leak":
        _leak(*sys.argv[2:5])
    else:
        main()
