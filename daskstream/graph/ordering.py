"""Dependencies that order a computation's passes, so that what a pass reads is not read ahead of its use.

A scheduler runs whatever is ready, in an order of its own. Two kinds of
work are ready long before the data that needs them, and, run early, hold
what the pass was planned not to hold:

* **A later pass's reads** are ready from the start: nothing they take comes
  from the pass before. Read early, every block waits for the aggregate it
  is combined with. :func:`daskstream.graph.rewrites.rewrite` makes them take
  their Source through a task that waits for the aggregates of the passes
  before.
* **Work computed from aggregates alone**, such as a climatology broadcast to
  every day it is subtracted from, is ready once the aggregate is known and
  is as large as the data. dask's order runs all of it before the reads it
  meets: 700 MiB of broadcast climatology held for a 900 MiB field.
  :func:`gate_expansions` makes each piece of it wait for a block that the
  work taking it reads.

A wait costs no data movement: what is waited for is a ``None`` made where
the block is (:func:`nothing`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dask._task_spec import Alias, GraphNode, Task, TaskRef
from dask.graph_manipulation import clone_key
from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.typing import Key

from daskstream.graph.layers import as_node, passed_after, sources_read_by
from daskstream.planning.passes import LayerFacts, PassPlan

#: The most tasks of work computed from aggregates alone that are ordered after reads, per computation:
#: beyond it (listing them would cost more than a plan may), the scheduler's own order is kept.
ORDERED_TASKS_LIMIT = 200_000


def nothing(block: object) -> None:
    """What a ``done`` task gives: the block it waits for stays where it was made."""
    return None


def done_layer(layers: dict[str, Layer], dependencies: dict[str, set[str]], name: str, keys: Iterable[Key]) -> str:
    """A layer of one ``None`` per key of ``keys`` (all of layer ``name``), made where that key's block is."""
    done = f"done-{name}"
    tasks = dict(layers[done]) if done in layers else {}
    for key in keys:
        renamed = clone_key(key, "done")
        if renamed not in tasks:
            tasks[renamed] = Task(renamed, nothing, TaskRef(key))
    layers[done] = MaterializedLayer(tasks)
    dependencies[done] = {name}
    return done


def gate_expansions(
    graph: HighLevelGraph, facts: Sequence[LayerFacts], plan: PassPlan, hold_limit: int
) -> HighLevelGraph:
    """``graph`` (rewritten for ``plan``) with each piece of work computed from aggregates alone waiting for
    a block read for it.

    Such work is a layer of a later pass of ``plan`` (planned before the
    graph was rewritten, on ``facts``) that reads nothing and is larger in
    all than ``hold_limit``. It is followed task by task to the first tasks
    taking it that read; the piece waits for a block one of those reads.
    """
    by_name = {f.name: f for f in facts}
    expansions = {
        f.name
        for f in facts
        if f.kind == "compute"
        and plan.levels.get(f.name, 0) >= 1
        and plan.reach.get(f.name, 0) == 0
        and f.name not in plan.shared
        and f.block_bytes * f.blocks > hold_limit
        and f.name in graph.layers
    }
    if not expansions or sum(by_name[n].blocks for n in expansions) > ORDERED_TASKS_LIMIT:
        return graph
    # What reads in the rewritten graph: the reads (those of later passes renamed) and what takes them.
    reading = _reading(graph, expansions)
    tasks = _Tasks(graph)
    owner: dict[Key, str] = {}
    dependents: dict[Key, list[Key]] = {}
    for name in expansions:
        for key, layer_name, deps in tasks.of_layer(name):
            owner[key] = layer_name
            for dep, holder in deps:
                if holder in expansions:
                    dependents.setdefault(dep, []).append(key)
    takers = {name for name, deps in graph.dependencies.items() if name in reading and deps & expansions}
    read_for: dict[Key, Key] = {}
    for name in takers:
        for _, _, deps in tasks.of_layer(name):
            outside = [(d, h) for d, h in deps if h in reading]
            if not outside:
                continue
            block = tasks.read_block(*outside[0], reading)
            if block is None:
                continue
            for dep, holder in deps:
                if holder in expansions:
                    read_for.setdefault(dep, block)
    # Every piece waits, not only the first ones: a piece several others take would release them all.
    gates = {key: block for key, block in _first_reads(owner, dependents, read_for).items() if block is not None}
    if not gates:
        return graph
    layers, dependencies = dict(graph.layers), {n: set(d) for n, d in graph.dependencies.items()}
    by_read: dict[str, list[Key]] = {}
    for block in gates.values():
        by_read.setdefault(_layer_of(block), []).append(block)
    done_of: dict[Key, Key] = {}
    for read, blocks in by_read.items():
        done = done_layer(layers, dependencies, read, blocks)
        done_of.update({block: clone_key(block, "done") for block in blocks})
        for name in {owner[k] for k, b in gates.items() if _layer_of(b) == read}:
            dependencies[name].add(done)
    for name in {owner[k] for k in gates}:
        layer = layers[name]
        materialized = {key: as_node(key, value, layer, graph) for key, value in layer.items()}
        for key, block in gates.items():
            if owner[key] == name:
                materialized[key] = _waiting(key, materialized[key], done_of[block])
        layers[name] = MaterializedLayer(
            materialized, annotations=layer.annotations, collection_annotations=dict(layer.collection_annotations or {})
        )
    return HighLevelGraph(layers, dependencies)


def _waiting(key: Key, node: GraphNode, done: Key) -> GraphNode:
    """``node`` under ``key``, run once ``done`` is."""
    inner: object = TaskRef(node.target) if isinstance(node, Alias) else node
    return Task(key, passed_after, inner, TaskRef(done))


def _first_reads(
    keys: Iterable[Key], dependents: Mapping[Key, list[Key]], read_for: Mapping[Key, Key]
) -> dict[Key, Key | None]:
    """For each of ``keys``: the read block of the first task that takes work computed from it (taken
    directly, ``read_for``; else the first one any of its ``dependents`` has), resolved once each."""
    found: dict[Key, Key | None] = {}
    for start in keys:
        stack: list[tuple[Key, bool]] = [(start, False)]
        while stack:
            key, expanded = stack.pop()
            if key in found:
                continue
            if key in read_for:
                found[key] = read_for[key]
                continue
            takers = dependents.get(key, [])
            if not expanded:
                stack.append((key, True))
                stack.extend((t, False) for t in takers if t not in found)
                continue
            found[key] = next((b for t in takers if (b := found.get(t)) is not None), None)
    return found


class _Tasks:
    """A graph's tasks, materialized layer by layer as asked for, with what each depends on."""

    def __init__(self, graph: HighLevelGraph) -> None:
        self.graph = graph

    def of_layer(self, name: str) -> Iterable[tuple[Key, str, list[tuple[Key, str]]]]:
        """Each task of layer ``name`` (its inner keys too), with its dependencies and the layers holding them."""
        layer = self.graph.layers[name]
        for key, value in layer.items():
            yield key, name, self.dependencies(name, layer, value)

    def dependencies(self, name: str, layer: Layer, value: object) -> list[tuple[Key, str]]:
        node = as_node(None, value, layer, self.graph)
        deps = node.dependencies if isinstance(node, GraphNode) else ()
        # A layer's inner keys (a rechunk's pieces) belong to it; others to the layer they name.
        return [(dep, name if dep in layer else _layer_of(dep)) for dep in deps]

    def read_block(self, key: Key, holder: str, reading: Mapping[str, bool]) -> Key | None:
        """The block of a read layer that ``key`` (a task depending on data read) first depends on."""
        for _ in range(10_000):  # far deeper than any chain of steps after a read
            if reading[holder]:
                return key
            layer = self.graph.layers[holder]
            following = [(d, h) for d, h in self.dependencies(holder, layer, layer[key]) if h in reading]
            if not following:
                return None
            key, holder = following[0]
        return None


def _reading(graph: HighLevelGraph, expansions: set[str]) -> dict[str, bool]:
    """The layers that read a source (``True``) or take what one reads (``False``), short of ``expansions``."""
    reading: dict[str, bool] = {}
    order = graph._toposort_layers()
    for name in order:
        if name in expansions:
            continue
        if sources_read_by(graph, graph.layers[name]):
            reading[name] = True
        elif any(dep in reading for dep in graph.dependencies.get(name, ())):
            reading[name] = False
    return reading


def _layer_of(key: Key) -> str:
    return key[0] if isinstance(key, tuple) else key  # type: ignore[return-value]


__all__ = ["ORDERED_TASKS_LIMIT", "done_layer", "gate_expansions", "nothing"]
