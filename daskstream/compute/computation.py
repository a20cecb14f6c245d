"""Whole computations: what daskstream plans before each one, and the optimizer that plans it.

:func:`install` makes :func:`daskstream.graph.optimize.optimize` dask's array
optimizer when daskstream is imported, so that every ``.compute()`` of arrays
read from daskstream sources is planned against its memory budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dask.config

from daskstream import config
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import merged_graph, planned_resources
from daskstream.graph.optimize import optimize, plan_graph
from daskstream.planning.computation import ComputePlan
from daskstream.runtime.allocator import limit_malloc_arenas
from daskstream.runtime.resources import resolve_resources


def plan_compute(*collections: Any, memory_budget: int | str | None = None) -> ComputePlan:
    """How computing ``collections`` together will run: its passes over the data and its projected memory.

    This is what daskstream plans, and checks against the memory budget,
    before every computation that reads its sources (``.compute()``,
    ``dask.compute``, ``daskstream.store``...); here nothing is computed.

    Parameters
    ----------
    *collections
        Dask arrays (or other dask collections).
    memory_budget
        Bytes per worker to plan for; by default the smallest budget the
        arrays were opened with, else as for :func:`daskstream.plan_chunks`.

    Returns
    -------
    ComputePlan
        ``passes``, ``read_passes``, ``worst`` (the largest task, term by
        term), ``projected_peak_bytes``, ``explain()``.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import daskstream as ds
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(path, np.ones((1000, 1000), dtype="f4"))  # 4 MB, four times the budget
    >>> x = ds.open(path, memory_budget="1MiB")
    >>> plan = ds.plan_compute(ds.reduce(x - x.mean(), "std"))
    >>> plan.passes, plan.projected_peak_bytes <= plan.budget
    (2, True)
    """
    found = [c for c in collections if hasattr(c, "__dask_graph__")]
    if not found:
        raise InvalidArgumentError("plan_compute needs dask collections, e.g. plan_compute(x.mean(), y.std())")
    graph, keys = merged_graph(found)
    planned = planned_resources(graph)
    if planned is None or memory_budget is not None:
        found_here = resolve_resources(memory_budget=memory_budget)
        planned = (
            found_here if planned is None else dataclasses.replace(planned, memory_budget=found_here.memory_budget)
        )
    return plan_graph(graph, keys, planned)[1]


def install() -> None:
    """Make :func:`daskstream.graph.optimize.optimize` dask's array optimizer, unless something else
    already is, and cap the allocator's arenas (see :mod:`daskstream.runtime.allocator`)."""
    dask.config.update_defaults({"array_optimize": optimize})
    limit_malloc_arenas(config.get("compute.malloc-arenas"))


__all__ = ["install", "plan_compute"]
