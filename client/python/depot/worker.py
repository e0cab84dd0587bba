"""The depot-worker command: worker processes for depotd's scheduler.

    depot-worker [--socket PATH] [--cpus N] [--gpus 0,1] [--resource NAME=AMOUNT]...
                 [--preload MODULE]... [--pid-file PATH] [MODULE]...

Imports each MODULE (a module name, or the path of a .py file) and registers the functions
in it marked with ``@depot.task``; functions sent by value (``client.submit(callable)``)
run in any case. Each CPU slot is a process of its own, so that tasks do not share an
interpreter: ``--cpus 4 --gpus 0,1`` starts four processes, the first two also offering
GPU 0 and GPU 1 (a GPU task asking for no CPU can run there beside a CPU task). Custom
resources go to the first process. SIGTERM or Ctrl-C drains the workers: they take no new
task and exit once their running ones are done.

Several processes are forked from this one once it has imported each ``--preload`` module
(numpy, pandas, dask.array, ...; one that fails to import is named on stderr and left to the
workers): the pages of those modules' code and data are then shared between the workers
(copy-on-write), not loaded again by each. The parent stays, holding nothing else: it waits
for its workers, and passes SIGTERM on to them; a worker whose parent dies is sent SIGTERM
(and drains). A worker killed by a signal (the OOM killer, a crash) is forked again, at most
five times a minute. Each forked worker seeds numpy's global random state afresh, as a
spawned one would. One process (``--cpus 1``) runs its worker itself. ``--pid-file`` names a file to
write the workers' process ids to, one a line, once they are started.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any, Deque, Dict, List, Optional, Sequence

from ._worker import Worker


def _load(module: str) -> ModuleType:
    if module.endswith(".py"):
        name = os.path.splitext(os.path.basename(module))[0]
        spec = importlib.util.spec_from_file_location(name, module)
        if spec is None or spec.loader is None:
            raise SystemExit(f"depot-worker: cannot load {module}")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded  # so that pickles naming its functions find them
        spec.loader.exec_module(loaded)
        return loaded
    return importlib.import_module(module)


def _stop_on_sigterm() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def _stop_with_parent() -> None:
    """Has the kernel send this process SIGTERM when its parent exits (Linux's
    PR_SET_PDEATHSIG), so that no forked worker outlives its launcher unseen."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")


def _forked_serve(parent: int, **plan: Any) -> None:
    _stop_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return
    # CPython seeds `random` afresh in a forked child; numpy's global RandomState is not,
    # and every worker would draw the same numbers.
    if sys.modules.get("numpy.random") is not None:
        sys.modules["numpy.random"].seed()
    plan["name"] = f"{plan['name']}, pid {os.getpid()}"
    serve(**plan)


def serve(
    socket: Optional[str],
    cpus: float,
    gpus: Sequence[int],
    resources: Dict[str, float],
    modules: Sequence[str],
    name: str,
) -> None:
    """One worker process: registers the modules' tasks and runs until drained."""
    _stop_on_sigterm()
    with Worker(socket, cpus=cpus, gpus=gpus, resources=resources, name=name) as worker:
        for module in modules:
            worker.register_module(_load(module))
        try:
            worker.run()
        except KeyboardInterrupt:
            pass  # run() drained the worker first


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="depot-worker", description="Runs tasks for depotd's scheduler."
    )
    parser.add_argument("modules", nargs="*", metavar="MODULE",
                        help="modules (or .py files) whose @depot.task functions to register")
    parser.add_argument("--socket", help="the daemon's socket (default: as depot.Client)")
    parser.add_argument("--cpus", type=int, default=1,
                        help="CPU slots, a process each (default 1)")
    parser.add_argument("--gpus", default="",
                        help="GPU ordinals to offer, comma-separated, a process each")
    parser.add_argument("--resource", action="append", default=[], metavar="NAME=AMOUNT",
                        help="a custom resource (repeatable), offered by the first process")
    parser.add_argument("--name", default="", help="for depotctl workers")
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE",
                        help="a module (repeatable, or comma-separated) to import once, "
                             "before the worker processes are forked, so that they share it")
    parser.add_argument("--pid-file", metavar="PATH",
                        help="where to write the worker processes' ids, one a line")
    args = parser.parse_args(argv)
    if args.cpus < 0:
        parser.error("--cpus is 0 or more")
    try:
        args.gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        parser.error(f"--gpus takes ordinals such as 0,1, not {args.gpus!r}")
    resources: Dict[str, float] = {}
    for r in args.resource:
        key, sep, amount = r.partition("=")
        try:
            resources[key] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not key:
            parser.error(f"--resource takes NAME=AMOUNT, not {r!r}")
    args.resources = resources
    args.preload = [m.strip() for p in args.preload for m in p.split(",") if m.strip()]
    if args.cpus == 0 and not args.gpus and not resources:
        parser.error("a worker offers something: --cpus, --gpus or --resource")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(argv)
    count = max(args.cpus, len(args.gpus), 1)
    plans = [
        dict(
            socket=args.socket,
            cpus=1 if i < args.cpus else 0,
            gpus=[args.gpus[i]] if i < len(args.gpus) else [],
            resources=args.resources if i == 0 else {},
            modules=args.modules,
            name=f"{args.name or 'depot-worker'} {i + 1}/{count}" if count > 1 else args.name,
        )
        for i in range(count)
    ]
    if count == 1:
        _write_pids(args.pid_file, [os.getpid()])
        serve(**plans[0])
        return 0
    for module in args.preload:
        try:
            importlib.import_module(module)
        except Exception as e:  # its workers import what they need themselves
            print(f"depot-worker: cannot preload {module}: {e}", file=sys.stderr, flush=True)
    # What is loaded now is shared by the forked workers until one writes it: the collector
    # is told to leave these objects alone, so that its passes do not write every page.
    gc.collect()
    gc.freeze()
    _stop_on_sigterm()  # after the preloads: one of them may have set a handler of its own
    fork = multiprocessing.get_context("fork")
    parent = os.getpid()

    def start(plan: Dict[str, Any]) -> multiprocessing.process.BaseProcess:
        process = fork.Process(target=_forked_serve, args=(parent,), kwargs=plan,
                               name=plan["name"])
        process.start()
        return process

    running: Dict[int, multiprocessing.process.BaseProcess] = {}  # by slot
    ended: List[int] = []  # exit statuses of those not started again
    restarts: Deque[float] = collections.deque()
    try:
        for slot, plan in enumerate(plans):
            running[slot] = start(plan)
        _write_pids(args.pid_file, [p.pid for p in running.values() if p.pid is not None])
        while running:
            ready = multiprocessing.connection.wait([p.sentinel for p in running.values()])
            for slot, process in list(running.items()):
                if process.sentinel not in ready:
                    continue
                process.join()
                del running[slot]
                code = process.exitcode or 0
                if code < 0 and _may_restart(restarts):
                    # Killed (the OOM killer, a crash): its slot gets a fresh fork; its
                    # tasks the daemon retries elsewhere, or on it.
                    print(f"depot-worker: {process.name} was killed by signal {-code}; "
                          "starting another", file=sys.stderr, flush=True)
                    running[slot] = start(plans[slot])
                    _write_pids(args.pid_file,
                                [p.pid for p in running.values() if p.pid is not None])
                else:
                    ended.append(code)
    except KeyboardInterrupt:
        for p in running.values():
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p in running.values():
            p.join()
            ended.append(p.exitcode or 0)
    return 0 if all(code == 0 for code in ended) else 1


# At most this many workers started again in a minute: past that, one that is killed stays
# gone (a crash at every start would otherwise fork for ever).
_RESTARTS_A_MINUTE = 5


def _may_restart(restarts: Deque[float]) -> bool:
    now = time.monotonic()
    while restarts and restarts[0] < now - 60:
        restarts.popleft()
    if len(restarts) >= _RESTARTS_A_MINUTE:
        print(f"depot-worker: {_RESTARTS_A_MINUTE} workers started again within a minute; "
              "no more", file=sys.stderr, flush=True)
        return False
    restarts.append(now)
    return True


def _write_pids(path: Optional[str], pids: Sequence[int]) -> None:
    if path is None:
        return
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        f.write("".join(f"{pid}\n" for pid in pids))
    os.replace(partial, path)  # whole, or not there


if __name__ == "__main__":
    sys.exit(main())
