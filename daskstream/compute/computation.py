"""Whole computations: what daskstream plans before each one, and the optimizer that plans it.

:func:`install` makes :func:`daskstream.graph.optimize.optimize` dask's array
optimizer when daskstream is imported, so that every ``.compute()`` of arrays
read from daskstream sources is planned against its memory budget.
"""

from __future__ import annotations

from typing import Any

import dask.config

from daskstream import config
from daskstream.graph.layers import merged_graph
from daskstream.graph.optimize import optimize, plan_graph
from daskstream.planning.computation import ComputePlan
from daskstream.planning.settings import Resources
from daskstream.runtime.allocator import limit_malloc_arenas


def computation_plan(collections: list[Any], resources: Resources) -> ComputePlan:
    """:func:`plan_compute` of dask ``collections`` for ``resources`` resolved by the caller."""
    graph, keys = merged_graph(collections)
    return plan_graph(graph, keys, resources)[1]


def install() -> None:
    """Make :func:`daskstream.graph.optimize.optimize` dask's array optimizer, unless something else
    already is, and cap the allocator's arenas (see :mod:`daskstream.runtime.allocator`)."""
    dask.config.update_defaults({"array_optimize": optimize})
    limit_malloc_arenas(config.get("compute.malloc-arenas"))


__all__ = ["computation_plan", "install"]
