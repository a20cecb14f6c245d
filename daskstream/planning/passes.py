"""Passes over the data: which parts of a computation wait for others, and which reads happen again.

A computation over files is a graph of layers: reads of sources, work on the
blocks read, and aggregates (a mean, a maximum, a quantile's state) that later
work takes as constants. When the same blocks feed both an aggregate and work
that needs the aggregate's result (``x - x.mean()``), a scheduler that shares
the read keeps every block in memory until the aggregate is known: the whole
array. This module plans instead:

* **Barriers.** A layer one of whose blocks depends on more source data than
  one task may hold (``hold_limit``) is a barrier: work after it waits for it.
  Whatever it produces is computed once, and what comes after treats it as a
  constant.
* **Passes.** The pass of a layer is the number of barriers on its longest
  path back to the reads. Reads and streaming work (everything that is not a
  barrier) are recomputed in every pass that needs them, from the sources,
  instead of being held from one pass to the next: *re-read instead of hold*.
* **Fewest passes.** Work needed in one pass shares its reads; a source is
  read once per pass that needs it, never once per consumer.

Everything here is a pure function of :class:`LayerFacts`; the dask graph is
described and rewritten in :mod:`daskstream.graph.layers` and :mod:`daskstream.graph.rewrites`.

>>> facts = [
...     LayerFacts("read", "read", block_bytes=100, sources=("x.npy",)),
...     LayerFacts("mean", "compute", block_bytes=8, inputs=(("read", 10),)),
...     LayerFacts("centred", "compute", block_bytes=100, inputs=(("read", 1), ("mean", 1))),
... ]
>>> plan = plan_passes(facts, hold_limit=300)
>>> plan.passes, sorted(plan.barriers), plan.recomputed
(2, ['mean'], {1: ('read',)})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

KINDS = ("read", "constant", "compute")


@dataclass(frozen=True)
class LayerFacts:
    """What the pass planner needs to know of one layer of a computation.

    Attributes
    ----------
    name
        The layer's name.
    kind
        ``"read"`` (reads blocks of sources), ``"constant"`` (a value in the
        graph, such as the source's description) or ``"compute"``.
    block_bytes
        Bytes of the layer's largest output block.
    blocks
        Number of output blocks.
    inputs
        ``(input layer, blocks of it that one output block needs)``, in the
        order given; an input used whole counts all its blocks.
    sources
        For reads: the names of the sources read.
    """

    name: str
    kind: str
    block_bytes: int = 0
    blocks: int = 1
    inputs: tuple[tuple[str, int], ...] = ()
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {KINDS}")


@dataclass(frozen=True)
class PassPlan:
    """The passes a computation makes over its sources.

    Attributes
    ----------
    levels
        The pass (from 0) each layer is computed in.
    barriers
        Layers whose results later passes take as constants.
    shared
        Layers computed once and taken as they are by every pass: the barriers,
        the constants, and what is computed from them alone when it is small
        (a state derived from an aggregate). Everything else streams: it is
        computed again in each pass that needs it.
    reach
        Bytes of source data one block of each layer depends on within its pass.
    recomputed
        For each pass from 1 on, the layers of earlier passes it computes again
        from the sources (in the order given), rather than holding them.
    read_passes
        For each source, the passes that read it.
    hold_limit
        The bytes one block may depend on before its layer is a barrier.
    """

    levels: Mapping[str, int]
    barriers: frozenset[str]
    shared: frozenset[str]
    reach: Mapping[str, int]
    recomputed: Mapping[int, tuple[str, ...]]
    read_passes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    hold_limit: int = 0

    @property
    def passes(self) -> int:
        """Passes over the data: the most times any source is read (0 when nothing is read)."""
        return max((len(p) for p in self.read_passes.values()), default=0)


def plan_passes(
    facts: Sequence[LayerFacts], *, hold_limit: int, linked: Callable[[str, Set[str], int], bool] | None = None
) -> PassPlan:
    """Plan the passes over the sources of the layers described, in dependency order.

    Parameters
    ----------
    facts
        Every layer of the computation, each after the layers it takes as input.
    hold_limit
        Bytes of source data one output block may depend on and still be
        computed in the pass that reads them (typically one task's share of
        the memory budget).
    linked
        ``linked(layer, barriers, limit)``: whether the source blocks that
        the layer's blocks join, not looking into ``barriers``, hold more than
        ``limit`` bytes (:func:`daskstream.graph.linking.source_links`). A block read
        for an aggregate and for work after it waits until every aggregate
        block it feeds is known, and so do the blocks those depend on: an
        aggregate whose blocks join more than ``hold_limit`` is a barrier,
        however little one of its blocks depends on. Without it, only what
        one block depends on counts.

    Returns
    -------
    PassPlan

    Raises
    ------
    ValueError
        For an input that is not described before the layer taking it.

    Examples
    --------
    Two consumers of a read in one pass share it: one pass.

    >>> facts = [
    ...     LayerFacts("read", "read", block_bytes=100, sources=("x.npy",)),
    ...     LayerFacts("sum", "compute", block_bytes=8, inputs=(("read", 10),)),
    ...     LayerFacts("max", "compute", block_bytes=8, inputs=(("read", 10),)),
    ... ]
    >>> plan_passes(facts, hold_limit=300).passes
    1
    """
    by_name: dict[str, LayerFacts] = {}
    for layer in facts:
        for name, _ in layer.inputs:
            if name not in by_name:
                raise ValueError(f"layer {layer.name!r} takes {name!r}, which is not described before it")
        by_name[layer.name] = layer
    levels, reach, barriers = _barriers(facts, hold_limit)
    on_diamond = _on_diamond(facts, barriers) if linked is not None else frozenset()
    if linked is not None and on_diamond:
        # Work that joins an aggregate with the data read for it, other than through a barrier, holds what
        # the aggregate links: measured task by task, only there (planning otherwise walks layers alone).
        def links_too_much(name: str, before: Set[str]) -> bool:
            return name in on_diamond and linked(name, before, hold_limit)

        levels, reach, barriers = _barriers(facts, hold_limit, links_too_much)

    shared = barriers | {
        layer.name
        for layer in facts
        if layer.kind == "constant"
        or (layer.kind == "compute" and reach[layer.name] == 0 and layer.block_bytes * layer.blocks <= hold_limit)
    }
    needed = _needed_copies(facts, by_name, levels, shared)
    held = _held_instead(facts, reach, needed, shared, hold_limit)
    if held:
        shared |= held
        needed = _needed_copies(facts, by_name, levels, shared)
    recomputed: dict[int, list[str]] = {}
    read_passes: dict[str, set[int]] = {}
    for layer in facts:
        for level in sorted(needed.get(layer.name, ())):
            if level != levels[layer.name]:
                recomputed.setdefault(level, []).append(layer.name)
            if layer.kind == "read":
                for source in layer.sources:
                    read_passes.setdefault(source, set()).add(level)
    return PassPlan(
        levels=levels,
        barriers=frozenset(barriers),
        shared=frozenset(shared),
        reach=reach,
        recomputed={level: tuple(names) for level, names in sorted(recomputed.items())},
        read_passes={source: tuple(sorted(p)) for source, p in read_passes.items()},
        hold_limit=hold_limit,
    )


def _barriers(
    facts: Sequence[LayerFacts], hold_limit: int, links_too_much: Callable[[str, Set[str]], bool] | None = None
) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """Each layer's pass and reach, and the barriers: layers depending on more than ``hold_limit`` of
    source data, or (``links_too_much``) joining more than that, in one pass, through their blocks."""
    levels: dict[str, int] = {}
    reach: dict[str, int] = {}
    barriers: set[str] = set()
    for layer in facts:
        if layer.kind == "constant":
            reach[layer.name] = 0
            levels[layer.name] = 0
            continue
        # A read's own block comes from its sources; it may take inputs too (a kernel reading its
        # halos takes the aggregates it is computed with).
        own = layer.block_bytes if layer.kind == "read" else 0
        reach[layer.name] = own + sum(count * reach[name] for name, count in layer.inputs if name not in barriers)
        levels[layer.name] = max((levels[name] + (name in barriers) for name, _ in layer.inputs), default=0)
        if (layer.kind == "compute" and reach[layer.name] > hold_limit) or (
            links_too_much is not None
            and reach[layer.name] > 0
            and any(count > 1 for _, count in layer.inputs)
            and links_too_much(layer.name, barriers)
        ):
            barriers.add(layer.name)
    return levels, reach, barriers


def _held_instead(
    facts: Sequence[LayerFacts],
    reach: Mapping[str, int],
    needed: Mapping[str, set[int]],
    shared: Set[str],
    hold_limit: int,
) -> set[str]:
    """Small results of reductions that later passes would compute again: held from their pass instead.

    A reduction below a barrier (a radix select's first state, taken by the
    next pass's counts and by its last state) is recomputed from the sources in
    every pass taking it: a pass over its data to save holding a few bytes. Held
    instead, nearest the takers first, while they take at most
    ``hold_limit // HELD_FRACTION`` in all.
    """
    allowance = hold_limit // HELD_FRACTION
    held: set[str] = set()
    for layer in reversed(facts):
        size = layer.block_bytes * layer.blocks
        if (
            layer.kind == "compute"
            and layer.name not in shared
            and len(needed.get(layer.name, ())) > 1
            and layer.block_bytes < reach[layer.name]
            and size <= allowance
        ):
            held.add(layer.name)
            allowance -= size
    return held


#: The share of a task's hold limit that results held from one pass to the next instead of computed again may take.
HELD_FRACTION = 16


def _on_diamond(facts: Sequence[LayerFacts], barriers: Set[str]) -> frozenset[str]:
    """Compute layers whose result is taken, directly or not, together with data read for them.

    Only there does a shared read wait for the layer: ``x - x.mean()``, not
    ``x.mean()`` alone. Read sets are bit masks: a graph of many files has a
    read layer per file.
    """
    bit = {f.name: 1 << i for i, f in enumerate(f for f in facts if f.kind == "read")}
    inputs_of = {f.name: f.inputs for f in facts}
    reads_of: dict[str, int] = {}
    takers: dict[str, list[str]] = {f.name: [] for f in facts}
    for f in facts:
        mask = bit.get(f.name, 0)
        for name, _ in f.inputs:
            mask |= reads_of.get(name, 0)
            takers.setdefault(name, []).append(f.name)
        reads_of[f.name] = mask
    found = set()
    for f in facts:
        if f.kind != "compute" or not reads_of[f.name] or not any(count > 1 for _, count in f.inputs):
            continue
        if f.name in barriers:
            continue
        after, stack = {f.name}, list(takers[f.name])
        while stack:
            name = stack.pop()
            if name not in after:
                after.add(name)
                # Past a barrier the aggregate is a constant: what takes it there waits for nothing read.
                if name not in barriers:
                    stack.extend(takers[name])
        joined = (
            reads_of[name] & reads_of[f.name]
            for taker in after - {f.name}
            for name, _ in inputs_of[taker]
            if name not in after
        )
        if any(joined):
            found.add(f.name)
    return frozenset(found)


def copy_level(input_name: str, taker_level: int, levels: Mapping[str, int], shared: Iterable[str]) -> int:
    """Which copy of ``input_name`` a layer computed in pass ``taker_level`` takes.

    Barriers and constants exist once, in their own pass; streaming layers are
    computed again in the pass of whatever takes them.

    >>> copy_level("read", 2, {"read": 0}, shared=())
    2
    >>> copy_level("mean", 2, {"mean": 0}, shared=("mean",))
    0
    """
    return levels[input_name] if input_name in set(shared) else taker_level


def _needed_copies(
    facts: Sequence[LayerFacts],
    by_name: Mapping[str, LayerFacts],
    levels: Mapping[str, int],
    shared: set[str],
) -> dict[str, set[int]]:
    """The passes each layer must be computed in for the outputs (layers nothing takes) to be known."""
    taken = {name for layer in facts for name, _ in layer.inputs}
    needed: dict[str, set[int]] = {}
    stack = [(layer.name, levels[layer.name]) for layer in facts if layer.name not in taken]
    while stack:
        name, level = stack.pop()
        copies = needed.setdefault(name, set())
        if level in copies:
            continue
        copies.add(level)
        for input_name, _ in by_name[name].inputs:
            stack.append((input_name, copy_level(input_name, level, levels, shared)))
    return needed


__all__ = ["KINDS", "LayerFacts", "PassPlan", "copy_level", "plan_passes"]
