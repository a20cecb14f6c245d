"""Notebook views of what the planner returns: the HTML cards of :class:`ChunkPlan` and :class:`ComputePlan`.

The planner keeps no presentation (it imports no HTML and no drawing): its
results are plain values, and how a notebook shows them is here, above it.
:func:`register_notebook_views` gives these views to IPython's HTML
formatter; ``import daskstream`` calls it when it runs in an IPython shell
(Jupyter, JupyterLab, VS Code, ``ipython``), and does nothing elsewhere.

>>> from daskstream.planning.chunks import plan_chunks_exact
>>> plan = plan_chunks_exact((4096, 1024), "float32", storage_chunks=None, layout="C", memory_budget=1 << 30,
...                          threads=2, workers=1, reduce_axis=None, target_chunk_bytes=8 << 20,
...                          working_set_factor=3.0, min_tasks_per_thread=2)
>>> "read amplification" in chunk_plan_html(plan)
True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from daskstream.display import card, details, grid_figure, table
from daskstream.planning.budget import format_size
from daskstream.planning.computation import ComputePlan
from daskstream.planning.plan import ChunkPlan


def chunk_plan_html(plan: ChunkPlan) -> str:
    """``plan`` as a card: its figures beside a picture of its tasks over the storage chunks, and why."""
    rows = [
        ("shape", plan.shape),
        ("dtype", plan.dtype),
        ("layout", plan.layout),
        ("storage chunks", plan.storage_chunks if plan.storage_chunks is not None else "contiguous"),
        ("chunks", plan.chunks),
        ("chunk bytes", format_size(plan.chunk_bytes)),
        ("tasks", plan.n_tasks),
        ("read amplification", f"{plan.read_amplification:.2f}"),
        ("projected peak", f"{format_size(plan.projected_peak_bytes)} of {format_size(plan.memory_budget)}"),
        ("threads x workers", f"{plan.threads} x {plan.workers}"),
    ]
    return card(
        "daskstream ChunkPlan",
        table(rows),
        details("why", plan.explain()),
        picture=grid_figure(plan.shape, plan.storage_chunks, plan.chunks),
        caption=f"{plan.n_tasks} task(s) of {plan.chunks} over {plan.shape} {plan.dtype}",
    )


def compute_plan_html(plan: ComputePlan) -> str:
    """``plan`` as a card: its passes, what it reads, its tasks and projected peak, and why."""
    rows = [
        ("passes over the data", plan.passes),
        ("read in all", format_size(plan.bytes_to_read)),
        ("tasks", f"{plan.tasks}, {plan.concurrency} at a time"),
        ("largest task", format_size(plan.worst.peak_bytes) if plan.worst is not None else "-"),
        ("projected peak", f"{format_size(plan.projected_peak_bytes)} of {format_size(plan.budget)}"),
    ]
    return card("daskstream ComputePlan", table(rows), details("why", plan.explain()))


# Each planner result's type and its view.
NOTEBOOK_VIEWS: dict[type, Callable[[Any], str]] = {ChunkPlan: chunk_plan_html, ComputePlan: compute_plan_html}


def register_notebook_views(shell: Any = None) -> bool:
    """Show the planner's results as HTML cards in ``shell`` (by default the IPython shell running, if any).

    Returns whether there was a shell to register with. IPython is never
    imported here: without a shell already running there is nothing to show.
    """
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        if shell is None:
            return False
    formatter = shell.display_formatter.formatters["text/html"]
    for kind, view in NOTEBOOK_VIEWS.items():
        formatter.for_type(kind, view)
    return True


__all__ = ["NOTEBOOK_VIEWS", "chunk_plan_html", "compute_plan_html", "register_notebook_views"]
