"""Whole computations: what daskstream plans before each one, and the optimizer that plans it.

:func:`install` makes :func:`daskstream.graph.optimize.optimize` dask's array
optimizer when daskstream is imported, so that every ``.compute()`` of arrays
read from daskstream sources is planned against its memory budget.
"""

from __future__ import annotations

from typing import Any

import dask.config

from daskstream import config
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import merged_graph
from daskstream.graph.optimize import optimize, plan_graph
from daskstream.planning.computation import ComputePlan
from daskstream.planning.settings import Resources
from daskstream.runtime.allocator import limit_malloc_arenas
from daskstream.runtime.resources import resources_for


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
        arrays were opened with, else as for :func:`daskstream.plan_chunks`
        (:func:`~daskstream.runtime.resources.resources_for`).

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
    return computation_plan(found, resources_for(*found, memory_budget=memory_budget))


def computation_plan(collections: list[Any], resources: Resources) -> ComputePlan:
    """:func:`plan_compute` of dask ``collections`` for ``resources`` resolved by the caller."""
    graph, keys = merged_graph(collections)
    return plan_graph(graph, keys, resources)[1]


def install() -> None:
    """Make :func:`daskstream.graph.optimize.optimize` dask's array optimizer, unless something else
    already is, and cap the allocator's arenas (see :mod:`daskstream.runtime.allocator`)."""
    dask.config.update_defaults({"array_optimize": optimize})
    limit_malloc_arenas(config.get("compute.malloc-arenas"))


__all__ = ["computation_plan", "install", "plan_compute"]
