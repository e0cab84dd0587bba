"""How a Python benchmark measures one run (bench_dask_graphs.py, bench_cubed.py): in a fresh
process of the benchmark's own script, started with ``--child``, which the benchmark samples
from outside.

The run says how it goes in lines of JSON on what was its stdout (:func:`channel`): "ready"
once its workers are up and warm; then, told "go" on its stdin, "done" when the timed part
is over and "result" with its figures; or "error". :func:`run_child` measures the idle
memory at "ready" and the peak from "go" to "done" (bench/python/_memory.py's count of the
run's process tree, every 20 ms), and kills the run's process group when it is over, or
after ``timeout`` seconds. :func:`run_apart` times one run and samples another, as the
sampling itself takes CPU time from the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import _memory  # beside this script


class RunFailed(Exception):
    pass


class PeakSampler(threading.Thread):
    """The peak of _memory.tree_memory(pid), sampled every ``interval`` s until stop(); and
    the peak of its first term alone, the processes' private memory (``private_peak``)."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.private_peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            private, store = _memory.tree_memory_parts(self.pid)
            self.peak = max(self.peak, private + store)
            self.private_peak = max(self.private_peak, private)
            self._done.wait(self.interval)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def _expect(proc: subprocess.Popen, event: str) -> Dict[str, Any]:
    line = proc.stdout.readline()
    if not line:
        raise RunFailed(f"the run ended (status {proc.wait()}) before saying {event!r}")
    message = json.loads(line)
    if message["event"] == "error":
        raise RunFailed(message["error"])
    if message["event"] != event:
        raise RunFailed(f"the run said {message['event']!r}, not {event!r}")
    return message


def run_apart(script: str, child: str, argv: List[str], timeout: float) -> Dict[str, Any]:
    """Two runs of ``script --child CHILD ARGV...`` (run_child): one sampled for its
    memory, one not, for its times. Reading /proc/PID/smaps_rollup of every process of a
    run costs 1.4-3.9 ms of CPU per Python process on this project's 2-core machine, so a
    sample every 20 ms took a third of a core from a run of four Python processes, more
    from runs of more: the times of the unsampled run, the memory of the sampled one
    (``digest`` and ``objects_left`` from both: the worse). {"error": why} if either
    failed."""
    timed = run_child(script, child, argv, timeout, sample=False)
    if "error" in timed:
        return timed
    sampled = run_child(script, child, argv, timeout)
    if "error" in sampled:
        return sampled
    why = differs(sampled.get("digest", []), timed.get("digest", []), rel_tol=1e-9)
    if why:
        return {"error": f"the timed run and the sampled run: {why}"}
    merged = dict(sampled)
    for key in ("seconds", "warm_seconds"):
        merged[key] = timed[key]
        merged[f"sampled_{key}"] = sampled[key]
    left = [r.get("objects_left") for r in (timed, sampled) if r.get("objects_left") is not None]
    if left:
        merged["objects_left"] = max(left)
    return merged


def run_child(
    script: str, child: str, argv: List[str], timeout: float, sample: bool = True
) -> Dict[str, Any]:
    """One run: ``script --child CHILD ARGV...``. Returns its "result" message's fields with
    ``idle_memory`` and ``peak_memory`` (_memory.tree_memory), ``idle_private`` and
    ``peak_private`` (its processes' private memory alone, without the store's pages), or
    {"error": why} if it failed or took longer than ``timeout`` seconds. Not ``sample``:
    the peaks are not sampled (None), so that the sampling takes no time from the run."""
    command = [sys.executable, os.path.abspath(script), "--child", child, *argv]
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        start_new_session=True,  # its process group: everything it started, to stop at once
    )
    timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
    timer.start()
    try:
        _expect(proc, "ready")
        idle_private, idle_store = _memory.tree_memory_parts(proc.pid)
        idle = idle_private + idle_store
        sampler = PeakSampler(proc.pid) if sample else None
        if sampler is not None:
            sampler.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        try:
            _expect(proc, "done")
        finally:
            peak = sampler.stop() if sampler is not None else None
        result = _expect(proc, "result")
        if proc.wait() != 0:
            raise RunFailed(f"the run exited with status {proc.returncode}")
    except RunFailed as error:
        timed_out = not timer.is_alive()
        return {"error": f"timed out after {timeout} s" if timed_out else str(error)}
    finally:
        timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left running, if anything
        proc.wait()
    del result["event"]
    return {**result, "idle_memory": idle, "peak_memory": peak, "idle_private": idle_private,
            "peak_private": sampler.private_peak if sampler is not None else None}


def channel() -> Callable[..., None]:
    """In a run: the ``say(event, **fields)`` that writes to what was stdout; whatever else
    writes to stdout, here or in processes the run starts, goes to stderr from now on."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def say(event: str, **fields: Any) -> None:
        out.write(json.dumps({"event": event, **fields}) + "\n")

    return say


def go(say: Callable[..., None]) -> None:
    """In a run: says "ready" and waits for "go"."""
    say("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the benchmark went away")


def child_main(run: Callable[[Callable[..., None]], None]) -> None:
    """In a run: ``run(say)``, saying "error" with what it raised."""
    say = channel()
    try:
        run(say)
    except BaseException as error:
        say("error", error=f"{type(error).__name__}: {error}")
        raise


def differs(digest: List[float], reference: List[float], rel_tol: float) -> Optional[str]:
    """Why two runs' digests (lists of sums) disagree beyond ``rel_tol``; None if they
    agree."""
    if all(math.isclose(a, b, rel_tol=rel_tol) for a, b in zip(digest, reference)):
        return None
    return f"values differ from the reference run's: {digest} against {reference}"


def check_choices(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  choices: Dict[str, Sequence[str]]) -> None:
    """Refuses (parser.error) a comma-separated option naming what it does not know."""
    for name, known in choices.items():
        unknown = set(getattr(args, name).split(",")) - set(known)
        if unknown:
            parser.error(f"unknown {name}: {', '.join(sorted(unknown))}; known: {', '.join(known)}")


def finish(args: argparse.Namespace, figures: Dict[str, Dict[str, List[Dict[str, Any]]]]) -> None:
    """Prints every run's figures as JSON with --json, and exits: 1 if a run failed."""
    if args.json:
        json.dump({"args": vars(args), "runs": figures}, sys.stdout, indent=1)
        print()
    failed = any("error" in r for runs in figures.values() for rs in runs.values() for r in rs)
    sys.exit(1 if failed else 0)
