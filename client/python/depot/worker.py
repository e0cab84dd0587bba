"""The depot-worker command: worker processes for depotd's scheduler.

    depot-worker [--socket PATH] [--cpus N] [--gpus 0,1] [--resource NAME=AMOUNT]... [MODULE]...

Imports each MODULE (a module name, or the path of a .py file) and registers the functions
in it marked with ``@depot.task``; functions sent by value (``client.submit(callable)``)
run in any case. Each CPU slot is a process of its own, so that tasks do not share an
interpreter: ``--cpus 4 --gpus 0,1`` starts four processes, the first two also offering
GPU 0 and GPU 1 (a GPU task asking for no CPU can run there beside a CPU task). Custom
resources go to the first process. SIGTERM or Ctrl-C drains the workers: they take no new
task and exit once their running ones are done.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import importlib.util
import multiprocessing
import os
import signal
import sys
from types import ModuleType
from typing import Dict, List, Optional, Sequence

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
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: a parent's SIGTERM still reaches them
        pass


def _forked_serve(parent: int, **plan: object) -> None:
    _stop_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return
    serve(**plan)  # type: ignore[arg-type]


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
        serve(**plans[0])
        return 0
    _stop_on_sigterm()
    for module in args.preload:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise SystemExit(f"depot-worker: cannot preload {module}: {e}") from None
    # What is loaded now is shared by the forked workers until one writes it: the collector
    # is told to leave these objects alone, so that its passes do not write every page.
    gc.collect()
    gc.freeze()
    fork = multiprocessing.get_context("fork")
    processes: List[multiprocessing.process.BaseProcess] = []
    for plan in plans:
        process = fork.Process(target=_forked_serve, args=(os.getpid(),), kwargs=plan,
                               name=plan["name"])
        process.start()
        processes.append(process)
    try:
        for p in processes:
            p.join()
    except KeyboardInterrupt:
        for p in processes:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        for p in processes:
            p.join()
    return max((p.exitcode or 0) for p in processes)


if __name__ == "__main__":
    sys.exit(main())
