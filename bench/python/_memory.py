"""What the Python benchmarks count as memory (bench_dask.py, bench_dask_graphs.py,
bench_arena_pages.py): a process's private pages, and the pages allocated in depotd's files.

A process's private memory is its PSS less the shared part (Pss - Pss_Shmem in
/proc/PID/smaps_rollup): pages of its own, and its share of those it shares with its
relatives after a fork, each page counted once over all processes. The store's pages are
counted from its files (the daemon's memfds, by their allocated blocks), not from PSS:
depotd allocates a shared segment's pages ahead of use and keeps pages an object freed for
the next one, and no process's PSS counts a page that no process maps.
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple

_STORE_FILE = "/memfd:depot-"


def pss(pid: int) -> Tuple[int, int]:
    """(Pss, Pss_Shmem) of a process, in bytes; (0, 0) once it is gone."""
    total = shmem = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith("Pss_Shmem:"):
                    shmem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return total, shmem


def private_memory(pid: int) -> int:
    """Pss - Pss_Shmem of a process, in bytes; 0 once it is gone."""
    total, shmem = pss(pid)
    return total - shmem


def store_files(pid: int) -> Dict[Tuple[int, int], int]:
    """The bytes allocated in each of depot's memfds (segments, header and lease tables)
    that a process holds open, by (device, inode): each file once however many descriptors
    it has. Empty for a process that holds none, or is gone."""
    files: Dict[Tuple[int, int], int] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return files
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if not os.readlink(path).startswith(_STORE_FILE):
                continue
            st = os.stat(path)
        except OSError:  # closed since listed
            continue
        files[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return files


def store_pages(pid: int) -> int:
    """The bytes allocated in the files of a depotd (see store_files)."""
    return sum(store_files(pid).values())


def process_tree(pid: int) -> List[int]:
    """A process and every process under it (its children, theirs...), as they are now;
    empty once it is gone."""
    tree, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone
            continue
        tree.append(parent)
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
            except OSError:
                continue
    return tree


def tree_memory(pid: int) -> int:
    """The private memory of a process and every process under it, plus the pages
    allocated in every depot memfd that one of them holds (a depotd among them), each file
    once."""
    return sum(tree_memory_parts(pid))


def tree_memory_parts(pid: int) -> Tuple[int, int]:
    """tree_memory's two terms: (the private memory of the processes, the store's pages)."""
    pids = process_tree(pid)
    files: Dict[Tuple[int, int], int] = {}
    for p in pids:
        files.update(store_files(p))
    return sum(private_memory(p) for p in pids), sum(files.values())
