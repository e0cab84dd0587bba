"""start_daemon: a private depotd for notebooks, scripts and tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket as _socket
import subprocess
import sys
import tempfile
import time
import weakref
from typing import List, Optional, Sequence, Union

from ._client import Client
from ._errors import DepotError


def find_depotd() -> str:
    """The depotd to run: ``$DEPOT_DAEMON``, else the one installed with this package (the
    interpreter's scripts directory), else the first on PATH."""
    explicit = os.environ.get("DEPOT_DAEMON")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "depotd")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("depotd")
    if found:
        return found
    raise DepotError(
        "depotd not found: install depot with `pip install .`, put depotd on PATH, or set "
        "DEPOT_DAEMON to its path"
    )


# The thread counts of OpenMP, OpenBLAS, MKL, Accelerate and numexpr (which numpy, SciPy
# and PyTorch read when they load), set to 1 for start_daemon's workers.
_THREAD_COUNTS = (
    "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


# The libraries that start_daemon's workers import before they are forked, where this
# process has imported them: their pages are then shared by the workers rather than loaded
# by each (about 90 MiB a worker for numpy, pandas and dask.array). Not the GPU libraries
# (CuPy, PyTorch, Paddle): a process must not fork once CUDA is initialised.
_PRELOADS = (
    "numpy", "scipy", "pandas", "pyarrow", "dask", "dask.array", "dask.dataframe", "xarray",
    "zarr", "cubed",
)


def _worker_pids(launcher: subprocess.Popen, pid_file: str) -> List[int]:
    """The worker processes `launcher` (a depot-worker command) started and that still run:
    those its pid file lists that are alive (not zombies) and its children, or itself when
    it is its one worker."""
    try:
        with open(pid_file) as f:
            listed = [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []
    running = []
    for pid in listed:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if state not in ("Z", "X") and (pid == launcher.pid or parent == launcher.pid):
            running.append(pid)
    return running


class Daemon:
    """A depotd started by :func:`start_daemon`. Stops it on :meth:`close`, on leaving a
    ``with`` block, or when the interpreter exits."""

    def __init__(self, process: subprocess.Popen, socket: str, directory: str, log_path: str):
        self._process = process
        self.socket = socket
        """The daemon's socket: pass it to depot.Client (or set DEPOT_SOCKET)."""
        self.log_path = log_path
        """The daemon's log (its stdout and stderr)."""
        self._directory = directory
        self._workers: List[subprocess.Popen] = []
        self._finalizer = weakref.finalize(
            self, Daemon._stop, process, directory, self._workers, self._pid_file
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def client(self, **kwargs) -> Client:
        """A new Client connected to this daemon."""
        return Client(self.socket, **kwargs)

    def log(self) -> str:
        """What the daemon has written to its log so far."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self) -> None:
        """Stops its workers, then the daemon (each SIGTERM, then SIGKILL after 5 s: a worker
        finishes its running task if it can in that time), and removes its directory.
        Objects in it are gone; values still viewing them stay readable."""
        self._finalizer()

    @property
    def workers(self) -> List[int]:
        """The process ids of the worker processes started with it (``workers=N``) that
        still run."""
        return [pid for w in self._workers for pid in _worker_pids(w, self._pid_file)]

    @property
    def _pid_file(self) -> str:
        return os.path.join(self._directory, "workers.pids")

    def _start_workers(self, count: int, gpus: Sequence[int], timeout: float) -> None:
        # Each worker offers one CPU: its numerical libraries use one thread each, unless
        # this process's environment says otherwise (as Dask's nannies do for their workers).
        env = dict(os.environ)
        for variable in _THREAD_COUNTS:
            env.setdefault(variable, "1")
        argv = [sys.executable, "-m", "depot.worker", "--socket", self.socket,
                "--cpus", str(count)]
        if gpus:
            argv += ["--gpus", ",".join(str(int(g)) for g in gpus[:count])]
        preload = [m for m in _PRELOADS if sys.modules.get(m) is not None]
        if preload:
            argv += ["--preload", ",".join(preload)]
        argv += ["--pid-file", self._pid_file]
        with open(self.log_path, "ab") as log:
            self._workers.append(
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
            )
        # The preloads (a few seconds of imports on a busy machine) come before any attaches.
        timeout = max(timeout, 60.0)
        deadline = time.monotonic() + timeout
        with self.client(name="start_daemon") as client:
            while client.status().scheduler.workers < count:
                if time.monotonic() > deadline or any(w.poll() is not None for w in self._workers):
                    raise DepotError(
                        f"{count} worker processes did not attach within {timeout} s; the "
                        f"log:\n{self.log()}"
                    )
                time.sleep(0.01)

    @staticmethod
    def _stop(
        process: subprocess.Popen, directory: str, workers: List[subprocess.Popen], pid_file: str
    ) -> None:
        for w in workers:  # first: they drain, and exit once their tasks are done
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(5)
            except subprocess.TimeoutExpired:
                # A task still running: its worker goes, and then the command that forked it.
                for pid in _worker_pids(w, pid_file):
                    if pid != w.pid:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass  # gone meanwhile
                w.kill()
                w.wait()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(directory, ignore_errors=True)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<depot.Daemon pid={self.pid} {state} on {self.socket!r}>"


def _accepts(path: str) -> bool:
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def start_daemon(
    memory: Union[str, int] = "1GiB",
    *,
    segment_size: Union[str, int, None] = None,
    prefault: bool = True,
    socket: Optional[str] = None,
    args: Sequence[str] = (),
    executable: Optional[str] = None,
    log_level: str = "warn",
    timeout: float = 10.0,
    simulate_gpus: Union[int, str, None] = None,
    workers: int = 0,
    worker_gpus: Sequence[int] = (),
    stop_with_parent: bool = False,
) -> Daemon:
    """Starts a private depotd and waits until it accepts connections.

    ``memory`` is the arena's capacity (``"4GiB"``, a byte count, or a share of RAM such as
    ``"25%"``); ``segment_size`` the size of its shared segments (default: 1 GiB, or the
    capacity if smaller): larger objects get a segment of their own. With ``prefault=False``
    (``depotd --no-prefault``) the arena's pages are allocated as objects first use them,
    not 64 MiB ahead of them in each segment: the daemon then holds only the memory its
    objects have used. The socket is in a new temporary directory unless ``socket`` is
    given; ``args`` are further depotd flags (``depotd --help``). The
    daemon is the one installed with this package (see :func:`find_depotd`) unless
    ``executable`` names another. ``simulate_gpus`` serves simulated GPUs backed by host
    memory instead of the host's real ones (``depotd --simulate-gpus``): a count, or
    ``"N:SIZE"`` such as ``"2:256MiB"``; their device pointers are host addresses, for tests
    of GPU code paths on machines without a GPU.

    ``workers`` starts that many Python worker processes attached to it (``depot-worker
    --cpus N``: several are forked from one parent that has first imported those of numpy,
    SciPy, pandas, pyarrow, Dask, xarray, Zarr and Cubed that this process has imported, so
    that the workers share those modules' memory), which run the functions clients submit by
    value: tasks with no other set-up. Each offers one CPU, so its numerical libraries run
    on one thread (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
    ``VECLIB_MAXIMUM_THREADS`` and ``NUMEXPR_NUM_THREADS`` are 1 in its environment, except
    those this process's environment sets). Worker i also offers GPU ``worker_gpus[i]``
    (this process's ordinal), if the list has that many. They stop with the daemon.

    ``stop_with_parent`` has the daemon shut down when this process exits, even if it is
    killed (``depotd --exit-with-pid``; its temporary directory then stays behind).

    Returns a :class:`Daemon`; use it as a context manager, or call ``close()``. It is
    stopped at interpreter exit in any case. Raises DepotError with the daemon's log if it
    does not start within ``timeout`` seconds, or its workers within ``timeout`` or a
    minute, whichever is longer.
    """
    program = executable or find_depotd()
    directory = tempfile.mkdtemp(prefix="depot-")
    path = socket or os.path.join(directory, "depot.sock")
    log_path = os.path.join(directory, "depotd.log")
    argv = [program, "--socket", path, "--memory", str(memory), "--log-level", log_level]
    if segment_size is not None:
        argv += ["--segment-size", str(segment_size)]
    if not prefault:
        argv.append("--no-prefault")
    if simulate_gpus is not None:
        argv += ["--simulate-gpus", str(simulate_gpus)]
    if stop_with_parent:
        argv += ["--exit-with-pid", str(os.getpid())]
    argv += list(args)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    daemon = Daemon(process, path, directory, log_path)
    deadline = time.monotonic() + timeout
    while not _accepts(path):
        if process.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with status {process.returncode}"
                if process.poll() is not None
                else f"did not accept connections within {timeout} s"
            )
            output = daemon.log()
            daemon.close()
            raise DepotError(f"depotd ({' '.join(argv)}) {why}; its log:\n{output}")
        time.sleep(0.005)
    if workers > 0:
        try:
            daemon._start_workers(workers, worker_gpus, timeout)
        except BaseException:
            daemon.close()
            raise
    return daemon


