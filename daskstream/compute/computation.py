"""Whole computations: what daskstream plans before each one, and the optimizer that plans it.

:func:`install_optimizer` makes :func:`daskstream.graph.optimize.optimize`
dask's array optimizer; ``import daskstream`` calls it (in
``daskstream/__init__.py``, the one place), so that every ``.compute()`` of
arrays read from daskstream sources is planned against its memory budget.
Graphs that read no daskstream source go to dask's own optimizer untouched,
and ``daskstream.compute.rewrite: false`` sends every graph there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dask.config
from dask.array.optimization import optimize as dask_optimize
from dask.utils import ensure_dict

from daskstream import config
from daskstream.compute.streaming.chunkwise import pieces_read
from daskstream.compute.streaming.optimizer import chains_ahead, optimize_streaming, streamed_graph, streaming_of
from daskstream.compute.streaming.span_graphs import span_facts, span_graphs
from daskstream.graph.layers import merged_graph
from daskstream.graph.optimize import plan_graph, requested_keys
from daskstream.planning.computation import ComputePlan
from daskstream.planning.settings import Resources


def computation_plan(collections: list[Any], resources: Resources) -> ComputePlan:
    """:func:`plan_compute` of dask ``collections`` for ``resources`` resolved by the caller."""
    graph, keys = merged_graph(collections)
    spanned = span_graphs(graph, keys)
    if spanned is not None:
        # Spans stream: the steps that take them are checked as they run (refused past the budget), each task
        # holds one chunk's work at a time, projected as such, and the tasks are the streamed graph's.
        streamed, pieced, read_counts, read_again = spanned
        optimized = ensure_dict(dask_optimize(streamed, keys))
        _, plan = plan_graph(pieced, keys, resources, holds=False)
        # Each step taking a span reads its chunks itself: counted by the ways the spans reach the steps. The
        # pieced graph's own passes are where its reductions would wait for whole blocks: no more than those.
        reads = {**plan.reads, **read_counts}
        read_passes = {s: p[: max(1, reads.get(s, len(p)))] for s, p in plan.read_passes.items()}
        passes = max(reads.values(), default=plan.passes)
        # A pass is a step reading its spans (counted above), not where the pieced graph's reductions would
        # have to wait for whole blocks: its worst task is in one of those passes.
        worst = plan.worst and dataclasses.replace(plan.worst, level=min(plan.worst.level, max(passes - 1, 0)))
        return dataclasses.replace(
            plan,
            tasks=len(optimized),
            spans=span_facts(optimized, graph),
            reads=reads,
            read_passes=read_passes,
            read_again=read_again,
            passes=passes,
            worst=worst,
        )
    rewritten, plan = plan_graph(graph, keys, resources)
    if config.get("compute.rewrite") and config.get("compute.streaming"):
        # Read in pieces where the graph runs through streamed_graph, as below.
        plan = dataclasses.replace(plan, pieces=pieces_read(rewritten, requested_keys(keys)))
    if plan.tasks <= STREAMING_COUNTED_TASKS and config.get("compute.rewrite") and config.get("compute.streaming"):
        # Counted on the graph dask will run, and on the graph dask would have run without streaming.
        built = len(ensure_dict(dask_optimize(rewritten, keys)))
        ahead = chains_ahead(plan)
        running = streamed_graph(rewritten, keys, threads=resources.threads * resources.workers, ahead=ahead)
        plan = dataclasses.replace(plan, streaming=streaming_of(running, built, ahead=ahead))
    return plan


#: The most tasks whose streaming a plan counts: beyond, counting costs what the plan spares.
STREAMING_COUNTED_TASKS = 200_000


def install_optimizer() -> None:
    """Make :func:`daskstream.compute.streaming.optimizer.optimize_streaming` (daskstream's planning, then streaming
    tasks) dask's array optimizer by default: a default, so an ``array_optimize`` a program sets itself
    (``dask.config.set``) still wins."""
    dask.config.update_defaults({"array_optimize": optimize_streaming})


__all__ = ["computation_plan", "install_optimizer"]
