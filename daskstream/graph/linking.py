"""Source blocks an aggregate ties together: what a pass that shares its reads holds.

When one pass reads a block for both an aggregate and work that needs the
aggregate's result (``x.groupby("time.month") - climatology``), the block
stays in memory until every aggregate block it feeds is known. An aggregate
block is known once every block it depends on is read, and those blocks wait
in turn for the aggregate blocks *they* feed. The blocks held together are
therefore a connected set: blocks are joined when one aggregate block depends
on both. Over month-aligned chunks a monthly mean joins the ten Januaries;
over chunks of 73 days, which straddle months, January is joined to February
through the chunk holding both, and so on through the year: every block.

:func:`source_links` measures the largest such set of each aggregate,
task by task, for :func:`daskstream.planning.passes.plan_passes`, which makes
an aggregate whose linked blocks do not fit a task's share a barrier (computed
first; the data read again after it) instead of holding them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set

from dask.highlevelgraph import HighLevelGraph
from dask.typing import Key

from daskstream.graph.layers import _dependencies
from daskstream.planning.passes import LayerFacts

#: The most tasks whose dependencies are followed to plan one computation: beyond, every source block an
#: aggregate's ancestry reads is counted as linked (what a chain of straddling chunks can reach).
LINKED_TASKS_LIMIT = 200_000


def source_links(graph: HighLevelGraph, facts: Sequence[LayerFacts]) -> Callable[[str, Set[str], int], bool]:
    """A test of whether a layer's blocks join more than so many bytes of source blocks, for
    :func:`~daskstream.planning.passes.plan_passes`.

    Parameters
    ----------
    graph
        The computation's graph.
    facts
        Its layers, described (:func:`daskstream.graph.layers.describe`), in dependency order.

    Returns
    -------
    callable
        ``links_more_than(layer, barriers, limit)``: whether the largest set
        of source blocks that ``layer``'s blocks join, following dependencies
        back to the reads but not into ``barriers`` (computed in an earlier
        pass, they join nothing in this one), holds more than ``limit`` bytes.
        Tasks are followed only where every block read that way would be
        more than ``limit``, and for at most :data:`LINKED_TASKS_LIMIT` tasks
        in all; past that, every block read counts as linked.
    """
    by_name = {f.name: f for f in facts}
    followed = 0

    def links_more_than(name: str, barriers: Set[str], limit: int) -> bool:
        nonlocal followed
        ancestry = _ancestry(by_name, name, barriers)
        reads = [a for a in ancestry if by_name[a].kind == "read"]
        if sum(by_name[r].block_bytes * by_name[r].blocks for r in reads) <= limit:
            return False  # even all of it fits: nothing to follow
        followed += sum(by_name[a].blocks for a in ancestry)
        if followed > LINKED_TASKS_LIMIT:
            return True  # planning work stays linear in the graph: past the limit, assume the worst
        return _largest_linked(graph, by_name, name, set(ancestry), set(reads)) > limit

    return links_more_than


def _ancestry(by_name: Mapping[str, LayerFacts], name: str, barriers: Set[str]) -> list[str]:
    """``name`` and every layer it takes, directly or not, short of constants and ``barriers``."""
    seen: list[str] = []
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen or by_name[current].kind == "constant" or (current != name and current in barriers):
            continue
        seen.append(current)
        stack.extend(n for n, _ in by_name[current].inputs if n in by_name)
    return seen


def _largest_linked(
    graph: HighLevelGraph, by_name: Mapping[str, LayerFacts], name: str, ancestry: set[str], reads: set[str]
) -> int:
    """Bytes of the largest set of source blocks that ``name``'s blocks join, through every task between."""
    sets = _BlockSets(graph, ancestry, reads)
    outputs = list(graph.layers[name].get_output_keys())
    roots = {root for key in outputs if (root := sets.represent(key, name)) is not None}
    sizes: dict[Key, int] = {}
    for block, layer in sets.read_blocks.items():
        root = sets.find(block)
        sizes[root] = sizes.get(root, 0) + by_name[layer].block_bytes
    return max((sizes.get(sets.find(root), 0) for root in roots), default=0)


class _BlockSets:
    """Source blocks joined into sets by the tasks that take several of them (union-find)."""

    def __init__(self, graph: HighLevelGraph, ancestry: set[str], reads: set[str]) -> None:
        self.graph, self.ancestry, self.reads = graph, ancestry, reads
        self.parent: dict[Key, Key] = {}
        self.read_blocks: dict[Key, str] = {}
        # Each task's representative source block (None: it depends on no source block).
        self.represented: dict[Key, Key | None] = {}

    def find(self, key: Key) -> Key:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:  # path compression keeps later finds short
            self.parent[key], key = root, self.parent[key]
        return root

    def _join(self, keys: list[Key]) -> Key | None:
        roots = list(dict.fromkeys(self.find(k) for k in keys))
        for other in roots[1:]:
            self.parent[other] = roots[0]
        return roots[0] if roots else None

    def represent(self, key: Key, owner: str) -> Key | None:
        """The set ``key`` (a task of layer ``owner``) joins, resolving what it depends on first (iteratively:
        graphs are deep)."""
        stack: list[tuple[Key, str, bool]] = [(key, owner, False)]
        deps_of: dict[Key, list[Key]] = {}
        while stack:
            current, layer_name, expanded = stack.pop()
            if current in self.represented:
                continue
            if layer_name in self.reads:
                self.parent.setdefault(current, current)
                self.read_blocks[current] = layer_name
                self.represented[current] = current
                continue
            if not expanded:
                layer = self.graph.layers[layer_name]
                deps: list[tuple[Key, str]] = []
                for dep in _dependencies(layer[current], layer, self.graph):
                    # A layer's inner keys (a rechunk's pieces) belong to it; others to the layer they name.
                    holder = layer_name if dep in layer else _layer_of(dep)
                    if holder in self.ancestry:
                        deps.append((dep, holder))
                deps_of[current] = [d for d, _ in deps]
                stack.append((current, layer_name, True))
                stack.extend((d, h, False) for d, h in deps if d not in self.represented)
                continue
            found = [r for d in deps_of.pop(current) if (r := self.represented.get(d)) is not None]
            self.represented[current] = self._join(found)
        return self.represented[key]


def _layer_of(key: Key) -> str:
    return key[0] if isinstance(key, tuple) else key  # type: ignore[return-value]


__all__ = ["LINKED_TASKS_LIMIT", "source_links"]
