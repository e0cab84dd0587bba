#!/usr/bin/env python3
"""Arrays and tensors through a multiprocessing Queue (issues 17 and 38): depot.multiprocessing
against the standard multiprocessing, torch.multiprocessing and Paddle's, in the same run.

  python bench/python/bench_multiprocessing.py [--mb 1,100,1000] [--repeat 5] [--method fork]
      [--write] [--dataloader-mb 64]

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
- paddle: `paddle.incubate.multiprocessing` (Paddle tensors only), Paddle's own: its
  storage moved into shared memory, sent by name or descriptor.

With --write the child writes every element of what it got in place (`+= 1`, `add_`)
before it answers: the time to the receiver's first in-place write included. depot's
received values are private copy-on-write views, so this counts the pages they copy;
torch's and Paddle's are their shared memory, written in place.

With --dataloader-mb N, an epoch of a torch DataLoader (num_workers 2, 8 batches of N MB)
with and without depot's context.

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


def _echo(q, answers, write):
    if write:
        import numpy  # noqa: F401 - imported before the clock runs, as torch and paddle are
    while True:
        value = q.get()
        if value is None:
            return
        if write:  # every element, in place
            if hasattr(value, "scale_"):
                value.scale_(1.0, 1.0)  # paddle: x * 1 + 1
            elif hasattr(value, "add_"):
                value.add_(1.0)  # torch
            else:
                value += 1.0
        first = float(value.reshape([-1])[0])
        del value
        answers.put(first)


def _measure(impl: str, kind: str, mb: float, repeat: int, method: str, write: bool) -> dict:
    import numpy as np

    if impl == "depot":
        import depot.multiprocessing as mp
    elif impl == "torch":
        import torch.multiprocessing as mp
    elif impl == "paddle":
        import paddle.incubate.multiprocessing as mp
    else:
        import multiprocessing as mp
    if kind == "tensor":
        import torch

        torch.set_num_threads(1)
    if kind == "paddle":
        import paddle

        paddle.set_device("cpu")
    if kind != "ndarray" and impl == "std":
        # Importing torch or paddle registered its reducers with the standard module's
        # pickler: without them it pickles tensors by value, as it would anything else.
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler._extra_reducers.clear()
    n = int(mb * MB) // 8
    ctx = mp.get_context(method)
    q, answers = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_echo, args=(q, answers, write), daemon=True)
    child.start()

    def fresh(i):
        array = np.full(n, float(i))
        if kind == "tensor":
            return torch.from_numpy(array)
        if kind == "paddle":
            return paddle.to_tensor(array)
        return array

    times = []
    for i in range(repeat + 1):
        value = fresh(i + 1)
        start = time.perf_counter()
        q.put(value)
        got = answers.get(timeout=600)
        elapsed = time.perf_counter() - start
        assert got == float(i + 1) + (1.0 if write else 0.0), (got, i + 1)
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


class _Batches:
    """A dataset of ``n`` batches of ``mb`` MB each (float64 tensors)."""

    def __init__(self, n: int, mb: float) -> None:
        self.n, self.mb = n, mb

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        return torch.full((int(self.mb * MB) // 8,), float(i), dtype=torch.float64)


def _dataloader(impl: str, mb: float, repeat: int, method: str) -> dict:
    """Epochs of a DataLoader (num_workers 2, batch_size None: each item a batch), with
    torch.multiprocessing's context or depot's; the loop adds 1 to each batch in place."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    if impl == "depot":
        import depot.multiprocessing as mp
    else:
        import torch.multiprocessing as mp
    loader = DataLoader(_Batches(8, mb), batch_size=None, num_workers=2,
                        multiprocessing_context=mp.get_context(method), persistent_workers=True)
    times = []
    for epoch in range(repeat + 1):
        start = time.perf_counter()
        for i, batch in enumerate(loader):
            batch.add_(1.0)
            assert float(batch[0]) == i + 1.0
            del batch
        if epoch > 0:
            times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times)}


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
    parser.add_argument("--write", action="store_true",
                        help="the receiver writes every element in place before answering")
    parser.add_argument("--kinds", default="ndarray,tensor,paddle",
                        help="what is sent (those whose library is missing are left out)")
    parser.add_argument("--dataloader-mb", type=float, default=0,
                        help="also time DataLoader epochs with batches of this many MB")
    args = parser.parse_args()
    import importlib.util

    have = {"ndarray": True, "tensor": importlib.util.find_spec("torch") is not None,
            "paddle": importlib.util.find_spec("paddle") is not None}
    have_torch = have["tensor"]
    kinds = [k for k in args.kinds.split(",") if have.get(k)]
    own = {"ndarray": [], "tensor": ["torch"], "paddle": ["paddle"]}
    print(f"# {args.method}, median of {args.repeat} sends of a fresh value (10x more below 10 MB, "
          "half at 1000 MB)" + (", the receiver writing it in place" if args.write else "")
          + "; speed-up over std, and time as a multiple of one memcpy of the value")
    print(f"{'value':>14} {'impl':>6} {'ms':>9} {'speed-up':>8} {'x memcpy':>9}")
    for mb in (float(x) for x in args.mb.split(",")):
        repeat = args.repeat * 10 if mb < 10 else args.repeat if mb < 1000 else max(2, args.repeat // 2)
        for kind in kinds:
            impls = ["std", "depot"] + own[kind]
            results = {}
            for impl in impls:
                out = _run("--measure", impl, kind, repr(mb), str(repeat), args.method,
                           "1" if args.write else "0")
                results[impl] = json.loads(out.strip().splitlines()[-1])
            base = results["std"]["median_s"]
            for impl in impls:
                r = results[impl]
                print(f"{f'{mb:g} MB {kind}':>14} {impl:>6} {r['median_s'] * 1e3:9.2f} "
                      f"{base / r['median_s']:8.2f} {r['median_s'] / r['memcpy_s']:9.2f}")
    if args.dataloader_mb and have_torch:
        print(f"\n# DataLoader epochs: 8 batches of {args.dataloader_mb:g} MB, num_workers 2, "
              f"each batch written in place; median of {args.repeat}")
        epochs = {impl: json.loads(_run("--dataloader", impl, repr(args.dataloader_mb),
                                        str(args.repeat), args.method).strip().splitlines()[-1])
                  for impl in ("torch", "depot")}
        for impl, r in epochs.items():
            print(f"{impl}: {r['median_s'] * 1e3:.1f} ms "
                  f"({epochs['torch']['median_s'] / r['median_s']:.2f}x torch)")
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
        impl, kind, mb, repeat, method, write = sys.argv[2:8]
        print(json.dumps(_measure(impl, kind, float(mb), int(repeat), method, write == "1")))
    elif len(sys.argv) > 1 and sys.argv[1] == "--dataloader":
        impl, mb, repeat, method = sys.argv[2:6]
        print(json.dumps(_dataloader(impl, float(mb), int(repeat), method)))
    elif len(sys.argv) > 1 and sys.argv[1] == "--sender-gone":
        print(_sender_gone(*sys.argv[2:4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--leak":
        _leak(*sys.argv[2:5])
    else:
        main()
