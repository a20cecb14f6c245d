"""Whole computations: what daskstream plans before each one, and the optimizer that plans it.

:func:`install_optimizer` makes :func:`daskstream.graph.optimize.optimize`
dask's array optimizer; ``import daskstream`` calls it (in
``daskstream/__init__.py``, the one place), so that every ``.compute()`` of
arrays read from daskstream sources is planned against its memory budget.
Graphs that read no daskstream source go to dask's own optimizer untouched,
and ``daskstream.compute.rewrite: false`` sends every graph there.
"""

from __future__ import annotations

from typing import Any

import dask.config

from daskstream.graph.layers import merged_graph
from daskstream.graph.optimize import optimize, plan_graph
from daskstream.planning.computation import ComputePlan
from daskstream.planning.settings import Resources


def computation_plan(collections: list[Any], resources: Resources) -> ComputePlan:
    """:func:`plan_compute` of dask ``collections`` for ``resources`` resolved by the caller."""
    graph, keys = merged_graph(collections)
    return plan_graph(graph, keys, resources)[1]


def install_optimizer() -> None:
    """Make :func:`daskstream.graph.optimize.optimize` dask's array optimizer by default: a default, so an
    ``array_optimize`` a program sets itself (``dask.config.set``) still wins."""
    dask.config.update_defaults({"array_optimize": optimize})


__all__ = ["computation_plan", "install_optimizer"]
