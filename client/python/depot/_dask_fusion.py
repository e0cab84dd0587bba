"""Fusion of what fits: tasks of a Dask graph run inside the one task that reads them, so that
their outputs are never stored (``depot.dask``'s part of issue 40).

Dask fuses chains of blockwise operations before a scheduler sees the graph, but only
between stages with the same number of tasks. A rechunk is cut into pieces (its "splits",
slices of the input chunks) that the next stage's tasks read several at a time: Dask stores
each piece. Here a task is absorbed into its reader when

- it has one reader, among the tasks (an alias to it counts as its target), and is neither
  a result asked for nor data;
- absorbing it serialises no work: it only slices a chunk (``getitem`` with slices and
  integers: a view, or a small copy), or it is the only input of the task reading it (a
  chain); or it is a level of a tree reduction read by the next (Dask's ``partial_reduce``
  layers, named ``<function>-partial``, read by ``-partial`` or ``-aggregate`` ones): their
  work is the small combining of partial results, and folding levels together gives the
  reduction a fan-in chosen by the bound, whatever ``split_every`` the graph was built
  with: fewer tasks, and no partial result stored. A fused task waits for all its inputs,
  which are held meanwhile beside those of the other levels' tasks: folded levels take at
  most an eighth of the share (_COMBINED), so that small partial results (a sum, a row of
  moments) fold into one task and large ones keep the graph's fan-in (folding up to the
  whole share, a sum of 64 rows of 1 MiB in a 24 MiB store on two workers ran out of room
  every time, where fan-in 2 never did); and a folded task reads at most 1,000 inputs
  (_COMBINED_INPUTS: a sum of 100,000 chunks folded into one task of 100,000 inputs);
- it is annotated as its reader is (the same resources, priority and retries);
- and the fused task still fits its share of the bound: its inputs, every output made
  inside it and its own output, by the sizes of :mod:`._dask_sizes` (a task without
  metadata counted as the sum of its inputs), at most ``share`` bytes (the bound over the
  workers).

One block's work that branches and joins again is fused whole, though its join combines
several inputs and its branches share a producer (several readers): a frame's column
computed apart and assigned back (``df.assign(k=f(df.b))``, before a groupby or a set_index,
is eight tasks a partition when Dask cannot fuse it, each storing a frame). Such a group is
kept only when one member, its source, is the only one reading no other member and the only
one reading from outside the group (:func:`_one_source`); else it is made again by the
rules above.

Absorbed tasks are absorbed in turn into nothing else; their own producers may join the
same fused task by the same rules (a slice of a slice). The fused task is Dask's
``Task.fuse`` of its members (a subgraph run by ``execute_graph`` on the worker), under the
key of the task that read them, which makes the same output: results are unchanged.
"""

from typing import AbstractSet, Any, Callable, Dict, Iterable, List, Mapping, Sequence, Set, Tuple

from ._dask_sizes import Sizes, is_slice

Key = Any

_COMBINED = 8
"""Folded levels of a tree reduction take at most the share over this."""

_COMBINED_INPUTS = 1000
"""Inputs of a task that folded levels of a tree reduction at most: one task combining more
serialises too much, and past depot's 4,000 inputs a task (``_MOST_INPUTS``) its inputs would
travel through gather tasks."""


def groups(
    order: Sequence[Key],
    graph: Mapping[Key, Any],
    deps: Mapping[Key, Sequence[Key]],
    resolve: Callable[[Key], Key],
    aliases: Mapping[Key, Key],
    data: Set[Key],
    wanted: Set[Key],
    sizes: Sizes,
    options: Callable[[Key], Dict[str, Any]],
    share: int,
    kept: AbstractSet[Key] = frozenset(),
) -> Tuple[Dict[Key, List[Key]], Dict[Key, int]]:
    """The tasks to fuse: by the key of the task that runs them, its members (itself first),
    only groups of two or more; and by the same key, what its absorbed members make (their
    sizes as above). Tasks in ``kept`` are absorbed into none (they may absorb others)."""
    # Each task's inputs, by resolved key, once each; and the tasks reading each key.
    inputs: Dict[Key, List[Key]] = {}
    readers: Dict[Key, Set[Key]] = {}
    for key in order:
        if key in aliases or key in data:
            continue
        inputs[key] = list(dict.fromkeys(resolve(d) for d in deps[key]))
        for d in inputs[key]:
            readers.setdefault(d, set()).add(key)

    size: Dict[Key, int] = {}

    def size_of(key: Key) -> int:
        if key not in size:
            if key in data or key not in inputs:
                size[key] = sizes.known.get(key, 0)
            else:
                size[key] = sizes.projected(key, (size_of(d) for d in inputs[key]))
        return size[key]

    for key in order:  # producers first: no deep recursion
        if key not in aliases:
            size_of(key)

    leader_of: Dict[Key, Key] = {}
    out: Dict[Key, List[Key]] = {}
    inside: Dict[Key, int] = {}

    def absorbable(p: Key) -> bool:
        return not (p not in inputs or p in leader_of or p in wanted or p in data or p in kept)

    def grow(key: Key, joins: bool) -> Tuple[List[Key], bool]:
        """The members of the group ``key`` leads (itself first), and whether a join was
        taken in: with ``joins``, tasks the rules above would leave out because their
        reader combines several inputs, or because several members read them."""
        members = [key]
        taken = {key}
        joined = False
        outside = dict.fromkeys(inputs[key])  # the group's inputs from outside it
        held = size_of(key) + sum(size_of(d) for d in outside)
        candidates = list(inputs[key])
        # Read by members and by tasks not (yet) in the group, in the order met.
        waiting: Dict[Key, None] = {}
        while candidates or waiting:
            if not candidates:
                # Those whose readers have all joined since; the rest stay out.
                candidates = [p for p in waiting if readers[p] <= taken]
                if not candidates:
                    break
                for p in candidates:
                    del waiting[p]
            p = candidates.pop()
            if p in taken or not absorbable(p):
                continue
            shared = len(readers[p]) != 1
            if shared and not joins:
                continue
            if shared and not readers[p] <= taken:
                waiting[p] = None
                continue
            if any(getattr(graph[k], "block_fusion", False) for k in (p, *readers[p])):
                continue
            if any(options(p) != options(r) for r in readers[p]):
                continue
            reader = next(iter(readers[p]))
            combines = not shared and not (is_slice(graph[p]) or len(inputs[reader]) == 1)
            if combines and not _combines(p, reader):
                if not joins:
                    continue
                combines, shared = False, True  # a join: kept only if the group has one source
            fresh = [d for d in inputs[p] if d not in outside and d not in taken]
            if held + sum(size_of(d) for d in fresh) > (share // _COMBINED if combines else share):
                continue
            if combines and len(outside) - 1 + len(fresh) > _COMBINED_INPUTS:
                continue
            held += sum(size_of(d) for d in fresh)
            # p's output is made inside now, no longer read from outside: it stays counted.
            outside.pop(p, None)
            outside.update(dict.fromkeys(fresh))
            members.append(p)
            taken.add(p)
            joined = joined or shared
            candidates.extend(inputs[p])
        return members, joined

    for key in reversed(order):  # readers before what they read
        if key not in inputs or key in leader_of:
            continue
        members, joined = grow(key, joins=True)
        if joined and not _one_source(members, inputs):
            members, _ = grow(key, joins=False)
        for m in members:
            leader_of[m] = key
        if len(members) > 1:
            out[key] = members
            inside[key] = sum(size_of(m) for m in members[1:])
    return out, inside


def _one_source(members: List[Key], inputs: Mapping[Key, List[Key]]) -> bool:
    """Whether one member, the group's source, is the only one that reads no other member
    and the only one that reads anything from outside the group: one block's work that
    branches and joins again (a frame's column computed apart and assigned back). Fused,
    its branches run one after the other, as they would on one worker each where there are
    other blocks for the other workers. Groups that join several sources (the blocks a
    reduction combines), or a branch with what other tasks make, are left to the rules
    above: fused, they would hold up work that can run beside them."""
    taken = set(members)
    sources = [m for m in members if not any(d in taken for d in inputs[m])]
    return len(sources) == 1 and all(
        d in taken for m in members if m != sources[0] for d in inputs[m]
    )


def _name(key: Key) -> str:
    """A key's layer name without its token: ``("sum-partial-<token>", 0)`` -> ``sum-partial``."""
    name = key[0] if isinstance(key, tuple) and key else key
    return str(name).rsplit("-", 1)[0]


def _combines(p: Key, reader: Key) -> bool:
    """Whether ``p`` is a level of a tree reduction that ``reader``, the next level, reads."""
    if not _name(p).endswith("-partial"):
        return False
    name = _name(reader)
    return "-partial" in name or "-aggregate" in name


def fused_nodes(
    graph: Mapping[Key, Any], members: List[Key], aliases: Iterable[Key]
) -> Tuple[Any, Set[Key]]:
    """The node that runs ``members`` (its key first) as one task: Dask's Task.fuse of them
    and of those of ``aliases`` (of members absorbed) they read; and those aliases."""
    from dask._task_spec import Task

    nodes = [graph[m] for m in members]
    needed: Set[Key] = set()
    for node in nodes:
        needed |= set(node.dependencies)
    pending = list(aliases)
    taken: Set[Key] = set()
    changed = True
    while changed:  # an alias read by a member, or by an alias taken (a chain of them)
        changed = False
        for a in pending:
            if a in needed and a not in taken:
                taken.add(a)
                needed |= set(graph[a].dependencies)
                changed = True
    nodes += [graph[a] for a in taken]
    return Task.fuse(*nodes, key=members[0]), taken
