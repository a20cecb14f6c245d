"""``plan_compute``: what a computation will do and hold, planned before it runs, with this machine's limits."""

from __future__ import annotations

import dataclasses
from typing import Any

from daskstream.compute.computation import computation_plan
from daskstream.compute.limits import codec_limit, codec_of
from daskstream.errors import InvalidArgumentError
from daskstream.graph.layers import read_layers
from daskstream.planning.computation import ComputePlan
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
    resources = resources_for(*found, memory_budget=memory_budget)
    plan = computation_plan(found, resources)
    return dataclasses.replace(plan, limits=_known_limits(found, resources.threads))


def _known_limits(collections: list[Any], threads: int) -> tuple[str, ...]:
    """A line for the codec limit of each source read, where one is remembered (nothing is measured here)."""
    lines = []
    for collection in collections:
        reads = read_layers(collection)
        if len(reads) != 1:
            continue
        name = reads[0][1].name
        limit = codec_limit(collection, threads=threads, measure=False)
        if limit is not None:
            lines.append(f"{name}: {limit}")
        elif codec_of(reads[0][1]) is not None:
            lines.append(
                f"{name}: not measured yet on this machine (daskstream.compute.codec_limit(x) or a `daskstream reduce` of it measures it)"
            )
    return tuple(dict.fromkeys(lines))


__all__ = ["plan_compute"]
