"""Folded blocks: a reduction's combines compute the blocks they take, so no scheduler handles a block.

Streaming tasks (:mod:`daskstream.compute.streaming.chains`) fold what dask
built, but building it still cost a fraction of a millisecond a block, and a
scheduler of ``dask.distributed`` loads every task of a graph and sends each
to its worker: a sum of a million storage chunks spent about two seconds of
its CPU that way. So before dask builds the blocks' tasks, a blockwise layer
whose blocks each feed one combine is folded into the combines' layer
(:func:`fold_blocks`), and that one into the next level of the tree while
tasks enough are left: each task left computes its blocks itself
(:func:`run_folded`), one after another, from the layer, which it makes into
tasks for just those blocks where it runs.

What a thread holds is what it held: one block's work, and the partial
results waiting for their combine; with blocks computed ahead (sources on an
object store) that many more blocks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from dask._task_spec import DataNode, GraphNode, Task, TaskRef, convert_legacy_task
from dask.blockwise import Blockwise, fuse_roots, optimize_blockwise
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.typing import Key

from daskstream.compute.streaming.chains import WAVES, computed_in_order, key_order

#: The most keys a layer the folded blocks take from may have: one value for every block (a source, an aggregate).
MAX_SHARED_KEYS = 16
#: How the keys holding a folded blockwise layer begin.
FOLDED_PREFIX = "blocks-of-"


@dataclass(frozen=True)
class FoldedLayer:
    """A blockwise layer whose blocks are computed by the combines taking them (:func:`fold_blocks`)."""

    layer: Blockwise

    def __dask_tokenize__(self) -> str:  # the layer's name says what it computes; tokenizing its tasks costs
        return f"{FOLDED_PREFIX}{self.layer.output}"

    def __repr__(self) -> str:
        return f"FoldedLayer({self.layer.output!r})"


@dataclass(frozen=True)
class Folded:
    """A combine computing what it takes itself: blocks of a folded layer, and combines folded below it.

    Attributes
    ----------
    key
        The combine's key.
    combine
        Its task, as dask built it: the blocks it takes are read from it
        where it runs. (A legacy tuple pickles and loads many times faster
        than a task object, and a scheduler loads every one.)
    below
        The combines folded below it that it takes.
    """

    key: Key
    combine: Any
    below: tuple[Folded, ...] = ()

    def __repr__(self) -> str:  # dask prints the arguments of a task that failed: not every block
        return f"Folded({self.key!r}, {len(self.below)} combines below)"


class _KeysOf:
    """The keys a folded combine may take: the blocks of ``layer``, and ``others``."""

    def __init__(self, layer: Blockwise, others: Iterable[Key]) -> None:
        self.name, self.others = layer.output, set(others)
        self.numblocks = tuple(layer.dims[index] for index in layer.output_indices)

    def block(self, key: Any) -> bool:
        return (
            isinstance(key, tuple)
            and len(key) == len(self.numblocks) + 1
            and key[0] == self.name
            and all(isinstance(i, int) and 0 <= i < n for i, n in zip(key[1:], self.numblocks))
        )

    def __contains__(self, key: Any) -> bool:
        return key in self.others or self.block(key)


class _Resolved(NamedTuple):
    """A combine as it runs: its task, and what it takes in order (block keys, or the combines below)."""

    combine: GraphNode
    inputs: list[Any]


def _resolved(folded: Folded, known: _KeysOf) -> _Resolved:
    below = {item.key: item for item in folded.below}
    combine = folded.combine
    if not isinstance(combine, GraphNode):
        known.others.update(below)
        combine = convert_legacy_task(folded.key, combine, known)
    inputs: list[Any] = []
    for dep in sorted(combine.dependencies, key=key_order):
        if dep in below:
            inputs.append(_resolved(below[dep], known))
        elif known.block(dep):
            inputs.append(dep)
    return _Resolved(combine, inputs)


def _blocks_of(resolved: _Resolved) -> list[Key]:
    return [key for item in resolved.inputs for key in (_blocks_of(item) if isinstance(item, _Resolved) else [item])]


def run_folded(folded: Folded, taken_keys: tuple[Key, ...], ahead: int, layer: FoldedLayer, *taken_values: Any) -> Any:
    """Compute ``folded``'s blocks one after another from ``layer`` (with ``ahead`` more under way in threads
    of their own), each combine as soon as what it takes is done; a stop asked ends it between blocks."""
    taken = dict(zip(taken_keys, taken_values, strict=True))
    resolved = _resolved(folded, _KeysOf(layer.layer, taken))
    order = _blocks_of(resolved)
    # The blocks' tasks, made here rather than by the scheduler: only these.
    culled, _ = layer.layer.cull(set(order), ())
    tasks = dict(culled)
    calls = (functools.partial(_computed, tasks[key], taken) for key in order)
    with contextlib.closing(computed_in_order(calls, ahead, "daskstream-block")) as blocks:
        return _combined(resolved, blocks, taken)


def _computed(task: GraphNode, taken: Mapping[Key, Any]) -> Any:
    return task({dep: taken[dep] for dep in task.dependencies})


def _combined(resolved: _Resolved, blocks: Iterator[Any], taken: Mapping[Key, Any]) -> Any:
    """A combine of what it takes: its blocks, the next of ``blocks`` each, and the combines below it."""
    combine, inputs = resolved
    values = dict(taken)
    for item in inputs:
        if isinstance(item, _Resolved):
            values[item.combine.key] = _combined(item, blocks, taken)
        else:
            values[item] = next(blocks)
    return combine({dep: values[dep] for dep in combine.dependencies})


def fold_blocks(graph: Any, keys: list[Key], *, threads: int, ahead: int = 0) -> Any:
    """``graph`` with each blockwise layer whose blocks feed one combine each folded into the combines' layer.

    Dask's blockwise fusion runs first, so a block's read and element-wise
    steps are one layer. A layer is folded where every one of its blocks is
    taken by one task of one materialized layer (a reduction's first
    combines), none is asked for, the blocks take only values computed once
    for all of them (a source, an earlier pass's aggregate), and the combines
    are at least as many as give every thread of the place :data:`WAVES`
    tasks: folding into fewer would leave threads idle. The combines' layer is
    then folded into the layer taking it on the same terms (a tree's next
    level), while that leaves tasks enough. Each task left computes its
    blocks itself (:func:`run_folded`), one at a time (``ahead`` more under
    way), each combine as soon as what it takes is done: it holds what the
    tasks it replaces held at once, one block's work and the partial results
    waiting for a combine.

    Returns ``graph`` as dask's blockwise fusion leaves it where there is
    nothing to fold.
    """
    if not isinstance(graph, HighLevelGraph):
        return graph
    graph = fuse_roots(optimize_blockwise(graph, keys=keys), keys=keys)
    asked = {str(key[0]) if isinstance(key, tuple) else str(key) for key in keys}
    layers = dict(graph.layers)
    dependencies = {name: set(deps) for name, deps in graph.dependencies.items()}
    wanted = max(1, threads * WAVES)
    for name, layer in graph.layers.items():
        if not isinstance(layer, Blockwise) or name in asked or layer.annotations:
            continue
        shared = dependencies[name]
        if any(len(layers[d]) > MAX_SHARED_KEYS for d in shared):
            continue
        below, top, taken = name, None, {key for d in shared for key in layers[d]}
        passed: list[str] = [name]
        inputs: dict[Key, Any] = {key: key for key in layer.get_output_keys()}
        # Up the tree while its next level leaves tasks enough: each combine of it folds the level below.
        while (taker := _sole_taker(layers, dependencies, below, asked, wanted)) is not None:
            # What the combines take besides the level below: values computed once for all of them, or nothing.
            besides = dependencies[taker] - {below}
            if any(len(layers[d]) > MAX_SHARED_KEYS for d in besides):
                break
            found = _folded_combines(layers[taker], inputs, taken | {key for d in besides for key in layers[d]})
            if found is None:
                break
            inputs, taken = found
            shared = shared | besides
            if top is not None:
                passed.append(top)
            below, top = taker, taker
        if top is None:
            continue
        holder = f"{FOLDED_PREFIX}{name}"
        order = tuple(sorted(taken, key=key_order))
        tasks = {
            key: Task(key, run_folded, folded, order, ahead, TaskRef(holder), *(TaskRef(k) for k in order))
            for key, folded in inputs.items()
        }
        layers[top] = MaterializedLayer(tasks, collection_annotations=layers[top].collection_annotations)
        layers[holder] = MaterializedLayer({holder: DataNode(holder, FoldedLayer(layer))})
        dependencies[holder] = set()
        dependencies[top] = (dependencies[top] - set(passed)) | shared | {holder}
        for gone in passed:
            del layers[gone], dependencies[gone]
    if len(layers) == len(graph.layers) and all(layers[n] is graph.layers[n] for n in graph.layers):
        return graph
    return HighLevelGraph(layers, dependencies)


def _sole_taker(
    layers: Mapping[str, Any], dependencies: Mapping[str, set[str]], name: str, asked: set[str], wanted: int
) -> str | None:
    """The one layer taking ``name``, where that is a materialized layer of combines, unannotated, not asked
    for, with at least ``wanted`` tasks; else None."""
    takers = [n for n, deps in dependencies.items() if name in deps]
    if len(takers) != 1 or name in asked:
        return None
    (taker,) = takers
    combines = layers[taker]
    if not isinstance(combines, MaterializedLayer) or combines.annotations or len(combines) < wanted:
        return None
    return taker


def _folded_combines(
    combines: MaterializedLayer, inputs: Mapping[Key, Any], taken: set[Key]
) -> tuple[dict[Key, Folded], set[Key]] | None:
    """Each task of ``combines`` folding the ``inputs`` it takes (blocks, or combines folded below), and the keys
    taken from outside by all; None where an input is taken twice, a combine takes from elsewhere what the
    others do not, or every combine takes one input (folding it would spare nothing)."""
    raw = dict(combines)
    known = set(raw) | set(inputs) | taken
    seen: set[Key] = set()
    outside: set[Key] | None = None
    folded: dict[Key, Folded] = {}
    for key, task in raw.items():
        deps = _keys_in(task, known)
        mine = [d for d in deps if d in inputs]
        others = deps - set(mine)
        outside = set(others) if outside is None else outside
        if others != outside or seen.intersection(mine):
            return None
        seen.update(mine)
        below = tuple(inputs[d] for d in _in_key_order(mine) if isinstance(inputs[d], Folded))
        folded[key] = Folded(key, task, below)
    if len(seen) <= len(folded):
        return None
    return folded, taken | (outside or set())


def _keys_in(task: Any, known: set[Key]) -> set[Key]:
    """The keys of ``known`` that ``task`` (dask's legacy tuple, or a graph node) takes: found by walking it,
    which costs a fraction of making it a task object."""
    if isinstance(task, GraphNode):
        return set(task.dependencies)
    found: set[Key] = set()
    stack = [task]
    while stack:
        item = stack.pop()
        if isinstance(item, GraphNode):
            found.update(item.dependencies)
            continue
        try:
            if item in known:
                found.add(item)
                continue
        except TypeError:  # a list, or another value no key can be
            pass
        if isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


def _in_key_order(keys: list[Key]) -> list[Key]:
    try:  # one layer's block keys compare as tuples: neighbouring blocks next to each other
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=key_order)


__all__ = ["FOLDED_PREFIX", "MAX_SHARED_KEYS", "Folded", "FoldedLayer", "fold_blocks", "run_folded"]
