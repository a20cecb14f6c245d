"""Layers holding whole tree reductions: what one of their tasks takes, not what the tree's root reaches.

dask puts each level of its own tree reductions in a layer of its own. flox's
"cohorts" groupby puts a tree per cohort of groups in one layer: a task per
block reindexing its partial, then levels named as dask's ``_tree_reduce``
names them (``...-partial-0``, ``...-partial-1``...), then the root. The
blocks a root reaches through the layer's own keys are a whole cohort (a
thousand days of every January), yet no task holds more than the few
partials it combines. :func:`tree_fan_in` counts what each task takes
itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer
from dask.typing import Key

#: How dask's tree reductions name the keys of their levels below the root.
_LEVEL = re.compile(r"-partial-\d+$")
#: Keys sampled, one of each name the layer holds (its cohorts' steps and levels).
_MOST_NAMES = 256


def tree_fan_in(
    graph: HighLevelGraph, name: str, layer: Layer, dependencies: Callable[[Any], Iterable[Key]]
) -> dict[str, int] | None:
    """For a layer ``name`` holding a tree reduction's levels (keys named as dask's levels): for each layer
    it takes, the most of its blocks one task of it takes, a key of the layer's own that a task takes (a
    partial, no larger than a block's) counted as one block of each; ``None`` for any other layer.

    ``dependencies(value)``: the keys a task of the layer depends on.
    """
    if not isinstance(layer, MaterializedLayer):  # other layers would make every task to be looked through
        return None
    first_of_name: dict[Any, Key] = {}
    for key in layer:
        first_of_name.setdefault(key[0] if isinstance(key, tuple) else key, key)
    if not any(_LEVEL.search(str(key_name)) for key_name in first_of_name):
        return None
    taken = sorted(d for d in graph.dependencies.get(name, ()) if d != name)
    fan_in: dict[str, int] = {}
    for key in list(first_of_name.values())[:_MOST_NAMES]:
        outside: dict[str, int] = {}
        inside = 0
        for dep in dependencies(layer[key]):
            if dep in layer:
                inside += 1
                continue
            dep_name = dep[0] if isinstance(dep, tuple) else dep
            if isinstance(dep_name, str) and dep_name in graph.layers:
                outside[dep_name] = outside.get(dep_name, 0) + 1
        for taken_name in taken:
            fan_in[taken_name] = max(fan_in.get(taken_name, 0), outside.get(taken_name, 0) + inside)
    return {taken_name: count for taken_name, count in fan_in.items() if count}


__all__ = ["tree_fan_in"]
