"""Streaming tasks: one task computes the private work of many blocks in turn and hands on what it gave.

A reduction's partial results come from chains of tasks of their own -- a
block's read, its element-wise steps, its chunk's partial -- each feeding one
combine and nothing else. The scheduler pays for every task (distributed
spends about a millisecond of its CPU on each): a sum of a hundred thousand
storage chunks made thousands of tasks, most of them a few milliseconds of
work. Here, after dask's own optimizations, such chains are run a group at a
time inside one task, a *streaming task*: it computes them one after another,
each chain's blocks released before the next chain starts, and hands on the
tuple of what the chains produced; the tasks they fed take their inputs from
those tuples.

What is computed, and how much one thread holds at a time, is what it was:
one chain's blocks, and the small results waiting for their combine (which
waited for them before too). The graph stays dask's: a streaming task is
scheduled, retried and stolen like any other, and a lost one re-reads only
its own blocks.

A chain is streamed only where that cannot hold more than before: every task
in it feeds only the chain (or its one taker), and whatever it takes from
outside the chain (a source's description, an aggregate of an earlier pass)
is taken by every chain of its taker too, so no block waits for a streaming
task to start. A group's chains feed one taker, and groups are about as many
as give every thread of the place :data:`WAVES` tasks; chains of a block's
work each go :data:`MIN_GROUP` at least to a group: fewer would save the
scheduler little. ``daskstream.compute.streaming: false`` leaves graphs as
dask made them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dask._task_spec import GraphNode, Task, TaskRef, convert_legacy_graph, execute_graph
from dask.tokenize import tokenize
from dask.typing import Key

from daskstream.runtime.stopping import raise_if_stopped

#: Tasks per thread of the place the computation runs: enough to even out threads that finish early.
WAVES = 4
#: How the keys of streaming tasks begin.
STREAM_PREFIX = "stream-"
#: The fewest chains worth one streaming task: with fewer, the scheduler is spared too little.
MIN_GROUP = 4
#: The most tasks one chain may hold: a block's work, or a combine of a few blocks' (a tree's lowest level).
MAX_CHAIN_TASKS = 64


@dataclass(frozen=True)
class Chains:
    """The chains one streaming task computes, in order: each its output key and its tasks.

    Attributes
    ----------
    chains
        ``(output key, tasks)`` per chain, the tasks as dask's graph nodes.
    taken
        Keys computed outside the chains that they take, in the order their
        values reach :func:`run_chains`.
    ahead
        Chains computed ahead of the one whose output is awaited, each in a
        thread of its own: the next blocks' requests to an object store are
        in flight while the current block is decoded.
    """

    chains: tuple[tuple[Key, Mapping[Key, GraphNode]], ...]
    taken: tuple[Key, ...]
    ahead: int = 0

    def __repr__(self) -> str:  # dask prints the arguments of a task that failed: not every node of a chain
        return f"Chains({len(self.chains)} chains taking {len(self.taken)} keys, {self.ahead} ahead)"


def run_chains(chains: Chains, *taken_values: Any) -> tuple[Any, ...]:
    """Compute each chain of ``chains`` in turn, keeping only its output; a stop asked ends it between chains.

    With chains ahead, each runs in a thread of a pool of ``ahead + 1``; at most that many are under way.
    """
    taken = dict(zip(chains.taken, taken_values, strict=True))
    calls = (functools.partial(_run_chain, output, tasks, taken) for output, tasks in chains.chains)
    with contextlib.closing(computed_in_order(calls, chains.ahead, "daskstream-chain")) as outputs:
        return tuple(outputs)


def computed_in_order(calls: Iterable[Callable[[], Any]], ahead: int, name: str) -> Generator[Any, None, None]:
    """What each of ``calls`` gives, in order; a stop asked ends it between two.

    With ``ahead``, each runs in a thread of a pool of ``ahead + 1`` (named
    ``name``), the next ``ahead`` under way while the current one's value is
    taken: an object store's requests in flight while a block is decoded.
    Closing the iterator early cancels what has not started.
    """
    if not ahead:
        for call in calls:
            raise_if_stopped()
            yield call()
        return
    with ThreadPoolExecutor(ahead + 1, thread_name_prefix=name) as pool:
        queued = iter(calls)
        waiting: deque[Future[Any]] = deque(pool.submit(call) for call in itertools.islice(queued, ahead + 1))
        try:
            while waiting:
                raise_if_stopped()
                value = waiting.popleft().result()
                waiting.extend(pool.submit(call) for call in itertools.islice(queued, 1))
                yield value
        finally:
            for future in waiting:
                future.cancel()


def _run_chain(output: Key, tasks: Mapping[Key, GraphNode], taken: Mapping[Key, Any]) -> Any:
    # A copy per chain: execute_graph drops each value once its last taker has run.
    return execute_graph(dict(tasks), cache=dict(taken), keys={output})[output]


def stream_chains(graph: Mapping[Key, Any], outputs: Iterable[Key], *, threads: int, ahead: int = 0) -> dict[Key, Any]:
    """``graph`` with the chains that feed one task each computed in streaming tasks.

    Parameters
    ----------
    graph
        A low-level dask graph, as dask's optimizer leaves it.
    outputs
        The keys the computation returns, and any other task to keep as it
        is: never folded into a chain.
    threads
        Threads of the place the computation runs, all workers together.
    ahead
        Chains each streaming task computes ahead (:class:`Chains`).

    Returns
    -------
    dict
        A graph computing the same ``outputs``; ``graph`` itself (as a dict)
        where streaming would save too little.
    """
    nodes: dict[Key, GraphNode] = convert_legacy_graph(dict(graph))
    kept = set(outputs)
    takers: dict[Key, list[Key]] = {key: [] for key in nodes}
    for key, node in nodes.items():
        for dep in node.dependencies:
            if dep in takers:
                takers[dep].append(key)
    found, size = _streamable(nodes, takers, kept, threads)
    if not found or len(found) < 2 * size:
        return nodes
    # A group's chains feed one taker: what the group hands on is held until its last taker runs, and one
    # taker holds all its inputs anyway (a group feeding many would hold many takers' inputs at once). They
    # take the same keys from outside, which are then computed before every chain of the group, never after
    # one of them (chains of two passes in one group would wait for each other).
    alike: dict[tuple[Key, tuple[Key, ...]], list[tuple[Key, frozenset[Key]]]] = {}
    for taker, output, chain, taken in found:
        alike.setdefault((taker, taken), []).append((output, chain))
    taken_from: dict[Key, dict[Key, Key | GraphNode]] = {}
    for (taker, taken), chains_of_taker in alike.items():
        for start in range(0, len(chains_of_taker), size):
            group = chains_of_taker[start : start + size]
            stream_key = (f"{STREAM_PREFIX}{tokenize([output for output, _ in group])}", 0)
            chains = Chains(tuple((output, {k: nodes[k] for k in chain}) for output, chain in group), taken, ahead)
            nodes[stream_key] = Task(stream_key, run_chains, chains, *(TaskRef(k) for k in taken))
            for index, (output, chain) in enumerate(group):
                taken_from.setdefault(taker, {})[output] = Task(output, operator.getitem, TaskRef(stream_key), index)
                for key in chain:
                    del nodes[key]
    for taker, substitutes in taken_from.items():
        nodes[taker] = nodes[taker].substitute(substitutes)
    return nodes


def _streamable(
    nodes: Mapping[Key, GraphNode], takers: Mapping[Key, list[Key]], kept: set[Key], threads: int
) -> tuple[list[tuple[Key, Key, frozenset[Key], tuple[Key, ...]]], int]:
    """``(taker, output, chain, keys it takes from outside)`` of every chain to stream, takers and outputs in
    key order; and the chains per streaming task."""
    by_taker: dict[Key, list[tuple[Key, frozenset[Key], tuple[Key, ...]]]] = {}
    for key, node in nodes.items():
        deps = [d for d in node.dependencies if d in nodes]
        private = [d for d in deps if takers[d] == [key] and d not in kept]
        if len(private) < 2:
            continue
        found_chains = [(d, _chain(d, nodes, takers, kept)) for d in private]
        chains = [(d, c, _taken_by(c, nodes)) for d, c in found_chains if c is not None]
        # What a chain takes from outside must be taken by every chain of its taker: a value computed once
        # for all of them (a description, an aggregate), never a block that would wait for the group.
        common = set.intersection(*(set(taken) for _, _, taken in chains)) if chains else set()
        chains = [(d, c, taken) for d, c, taken in chains if set(taken) <= common]
        if chains:
            by_taker[key] = chains
    if not by_taker:
        return [], 0
    # A taker's height: 1 where its chains are a block's work each, one more than the highest taker in its
    # chains otherwise (a combine of combines). Of the levels with a chain for every task wanted, the one
    # whose chains hold the most tasks is streamed: a tree's lower combines then run inside the streaming
    # tasks too.
    height: dict[Key, int] = {}
    for taker in sorted(by_taker, key=lambda t: sum(len(c) for _, c, _ in by_taker[t])):
        inner = [height.get(t, 1) for _, chain, _ in by_taker[taker] for t in chain if t in by_taker]
        height[taker] = 1 + max(inner, default=0)
    wanted = max(1, threads * WAVES)
    chains_at: dict[int, int] = {}
    tasks_at: dict[int, int] = {}
    for taker, h in height.items():
        chains_at[h] = chains_at.get(h, 0) + len(by_taker[taker])
        tasks_at[h] = tasks_at.get(h, 0) + sum(len(chain) for _, chain, _ in by_taker[taker])
    level = max((h for h in chains_at if chains_at[h] >= wanted), key=lambda h: (tasks_at[h], -h), default=1)
    chosen = sorted((t for t, h in height.items() if h == level), key=key_order)
    found = [
        (taker, output, chain, taken)
        for taker in chosen
        for output, chain, taken in sorted(by_taker[taker], key=lambda item: key_order(item[0]))
    ]
    least = MIN_GROUP if level == 1 else 1
    return found, max(least, math.ceil(len(found) / wanted))


def _chain(
    output: Key, nodes: Mapping[Key, GraphNode], takers: Mapping[Key, list[Key]], kept: set[Key]
) -> frozenset[Key] | None:
    """``output`` and the tasks only it depends on, or None when they are more than a block's work."""
    chain = {output}
    stack = [output]
    while stack:
        for dep in nodes[stack.pop()].dependencies:
            if dep in chain or dep in kept or dep not in nodes:
                continue
            if all(taker in chain for taker in takers[dep]):
                chain.add(dep)
                stack.append(dep)
                if len(chain) > MAX_CHAIN_TASKS:
                    return None
    return frozenset(chain)


def _taken_by(chain: frozenset[Key], nodes: Mapping[Key, GraphNode]) -> tuple[Key, ...]:
    """The keys outside ``chain`` its tasks take, in a fixed order."""
    outside = {dep for key in chain for dep in nodes[key].dependencies if dep not in chain}
    return tuple(sorted(outside, key=key_order))


def key_order(key: Key) -> tuple[str, tuple[int, ...], str]:
    # Block keys are (name, i, j, ...): neighbouring blocks (neighbouring storage) next to each other.
    if isinstance(key, tuple) and key:
        rest = key[1:]
        return (str(key[0]), tuple(i if isinstance(i, int) else -1 for i in rest), str(rest))
    return (str(key), (), "")


__all__ = [
    "MAX_CHAIN_TASKS",
    "MIN_GROUP",
    "STREAM_PREFIX",
    "WAVES",
    "Chains",
    "computed_in_order",
    "key_order",
    "run_chains",
    "stream_chains",
]
