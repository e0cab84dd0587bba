"""A Dask graph's memory, projected before anything runs (``depot.dask.plan``).

The projection runs the graph in the order depot's scheduler takes ready tasks (higher
priority first, then the deepest: consumers of data before producers of more, then the
order submitted), one task at a time, counting what is live: the graph's data, the outputs
of tasks until their last reader has run (the results asked for until the end), and the
output of the task running. Its peak is the least memory the graph needs in that order;
with several workers the scheduler runs more at once only while the outputs it reserves
(the sizes declared from the graph's metadata) fit the store's room. Sizes come from
:mod:`._dask_sizes`; a task with no metadata counts as the sum of its inputs. The items of
a split task's value (``getitem`` readers made its outputs, ``_Plan._split``) count as even
parts of it, and not as tasks.
"""

import heapq
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from ._codec import parse_size
from ._dask_sizes import Sizes
from ._errors import InvalidArgument

Key = Any


class Stage(NamedTuple):
    """The tasks of one layer of the graph (their keys' name)."""

    name: str
    tasks: int
    each: int  # the most one of its tasks makes, in bytes
    total: int  # what all of them make
    known: bool  # from the graph's metadata (else counted from their inputs)


class Fused(NamedTuple):
    """Tasks of one stage run inside the tasks of another: their outputs are never stored."""

    stage: str
    tasks: int
    into: str
    bytes: int  # what they make, all of them


class GraphPlan:
    """What :func:`depot.dask.plan` found: ``peak`` (bytes, projected), ``memory`` (the
    bound), ``fits``, the ``stages``, the task that needs most at once (``largest``, with
    its inputs and output: no order can run the graph in less), where the peak is reached
    (``peak_key``), how many tasks had no metadata (``unknown``) and which stages were
    fused into others (``fused``)."""

    def __init__(
        self, memory: int, peak: int, peak_key: Key, largest: Tuple[Key, int],
        stages: List[Stage], tasks: int, unknown: int, fused: List[Fused],
    ) -> None:
        self.memory = memory
        self.peak = peak
        self.peak_key = peak_key
        self.largest = largest
        self.stages = stages
        self.tasks = tasks
        self.unknown = unknown
        self.fused = fused

    @property
    def fits(self) -> bool:
        return self.peak <= self.memory and self.largest[1] <= self.memory

    def reason(self) -> str:
        """Why it does not fit, naming the stage ('' when it fits)."""
        key, need = self.largest
        if need > self.memory:
            return (
                f"task {key!r} (stage {_name(key)}) needs {_bytes(need)} at once, its inputs "
                f"and output, more than the bound of {_bytes(self.memory)}"
            )
        if self.peak > self.memory:
            return (
                f"its projected peak is {_bytes(self.peak)}, reached at task "
                f"{self.peak_key!r} (stage {_name(self.peak_key)}), more than the bound of "
                f"{_bytes(self.memory)}"
            )
        return ""

    def __str__(self) -> str:
        verdict = "fits" if self.fits else "does not fit: " + self.reason()
        lines = [
            f"{self.tasks} tasks in {len(self.stages)} stages; projected peak "
            f"{_bytes(self.peak)} of a bound of {_bytes(self.memory)}: {verdict}",
            f"largest task: {self.largest[0]!r}, {_bytes(self.largest[1])} with its inputs",
        ]
        if self.unknown:
            lines.append(
                f"{self.unknown} tasks without metadata, each counted as the sum of its inputs"
            )
        for f in self.fused:
            lines.append(
                f"fused: {f.tasks} tasks of {f.stage} into {f.into}, their "
                f"{_bytes(f.bytes)} never stored"
            )
        width = min(60, max((len(s.name) for s in self.stages), default=5))
        lines.append(f"{'stage':<{width}}  {'tasks':>6}  {'each':>10}  {'all':>10}")
        for s in self.stages:
            mark = "" if s.known else "  (from inputs)"
            lines.append(
                f"{_cut(s.name, width):<{width}}  {s.tasks:>6}  {_bytes(s.each):>10}  "
                f"{_bytes(s.total):>10}{mark}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"<GraphPlan {self.tasks} tasks, peak {_bytes(self.peak)} of "
            f"{_bytes(self.memory)}: {'fits' if self.fits else 'does not fit'}>"
        )


def parse_memory(memory: Union[str, int]) -> int:
    """A bound given as bytes or a size as depotd reads one (``"8GiB"``, ``"500M"``: powers
    of 1024); InvalidArgument for anything else."""
    try:
        return parse_size(memory)
    except InvalidArgument:
        raise InvalidArgument(
            f"memory is a size such as '8GiB' or a number of bytes above 0, not {memory!r}"
        ) from None


def project(plan: Any, keys: Sequence[Key], memory: int) -> GraphPlan:
    """The plan of ``plan`` (a :class:`._dask_graphs._Plan`) for ``keys`` within
    ``memory`` bytes."""
    sizes: Sizes = plan.sizes
    wanted = {plan.resolve(k) for k in keys}
    size: Dict[Key, int] = {}
    inputs: Dict[Key, List[Key]] = {}
    consumers: Dict[Key, List[Key]] = {}
    depth: Dict[Key, int] = {}
    tasks: List[Key] = []
    live = 0
    for key in plan.order:
        if key in plan.aliases:
            continue
        if key in plan.data:
            size[key] = _nbytes(plan.graph[key].value)
            live += size[key]
            continue
        ins = list(dict.fromkeys(plan.resolve(d) for d in plan.deps[key]))
        inputs[key] = ins
        item = plan.items.get(key)
        if item is None:
            size[key] = sizes.projected(key, (size[d] for d in ins))
        else:  # an item of a split task's value, made by it (one of its outputs): a part of it
            size[key] = size[item[0]] // len(plan.split[item[0]])
        depth[key] = 1 + max((depth[d] for d in ins if d in depth), default=-1)
        for d in ins:
            consumers.setdefault(d, []).append(key)
        tasks.append(key)

    transient = plan.fused_bytes
    fused: Dict[Tuple[str, str], List[int]] = {}
    for leader, members in plan.fused.items():
        for m in members[1:]:
            entry = fused.setdefault((_name(m), _name(leader)), [0, 0])
            entry[0] += 1
            entry[1] += sizes.known.get(m, 0)
    readers = {k: len(v) for k, v in consumers.items()}
    place = {k: i for i, k in enumerate(tasks)}
    waiting = {k: sum(1 for d in inputs[k] if d in depth) for k in tasks}
    ready: List[Tuple[int, int, int, Key]] = []

    def push(key: Key) -> None:
        priority = plan.options(key).get("priority", 0)
        heapq.heappush(ready, (-priority, -depth[key], place[key], key))

    for key in tasks:
        if waiting[key] == 0:
            push(key)
    peak, peak_key = live, None
    largest: Tuple[Key, int] = (None, 0)
    while ready:
        key = heapq.heappop(ready)[3]
        live += size[key]
        if live > peak:
            peak, peak_key = live, key
        # Outputs made inside a fused task live while it runs.
        inside = transient.get(key, 0)
        if live + inside > peak:
            peak, peak_key = live + inside, key
        need = size[key] + sum(size[d] for d in inputs[key]) + inside
        if need > largest[1]:
            largest = (key, need)
        for d in inputs[key]:
            readers[d] -= 1
            if readers[d] == 0 and d not in wanted:
                live -= size[d]
        for c in consumers.get(key, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                push(c)

    tasks = [k for k in tasks if k not in plan.items]  # those are outputs, not tasks
    stages: Dict[str, List[Any]] = {}
    for key in tasks:
        stage = stages.setdefault(_name(key), [0, 0, 0, True])
        stage[0] += 1
        stage[1] = max(stage[1], size[key])
        stage[2] += size[key]
        stage[3] = stage[3] and key in sizes.known
    return GraphPlan(
        memory, peak, peak_key, largest,
        [Stage(name, *values) for name, values in stages.items()],
        len(tasks), sum(1 for k in tasks if k not in sizes.known),
        [Fused(stage, n, into, total) for (stage, into), (n, total) in fused.items()],
    )


def _nbytes(value: Any) -> int:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return sys.getsizeof(value)


def _name(key: Key) -> str:
    if isinstance(key, tuple) and key and isinstance(key[0], str):
        return key[0]
    return key if isinstance(key, str) else repr(key)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


__all__ = ["Fused", "GraphPlan", "Stage", "parse_memory", "project"]

