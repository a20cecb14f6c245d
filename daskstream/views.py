"""Notebook views of what the planner returns: the HTML cards of :class:`ChunkPlan` and :class:`ComputePlan`.

The planner keeps no presentation (it imports no HTML and no drawing): its
results are plain values whose ``_repr_html_`` asks for the view given here
(:mod:`daskstream.planning.cards`), built when a notebook shows one. Any
frontend that reads ``_repr_html_`` (Jupyter, JupyterLab, VS Code, marimo,
Panel, nbconvert) shows the card; nothing of IPython's is changed.

>>> from daskstream.planning.chunks import plan_chunks_exact
>>> plan = plan_chunks_exact((4096, 1024), "float32", storage_chunks=None, layout="C", memory_budget=1 << 30,
...                          threads=2, workers=1, reduce_axis=None, target_chunk_bytes=8 << 20,
...                          working_set_factor=3.0, min_tasks_per_thread=2)
>>> "read amplification" in chunk_plan_html(plan)
True
"""

from __future__ import annotations

from daskstream.display import card, details, grid_figure, table
from daskstream.planning.budget import format_size
from daskstream.planning.cards import CARDS
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


# Each planner result's type and its view: the results' _repr_html_ asks for them when a notebook shows one.
CARDS.update({ChunkPlan: chunk_plan_html, ComputePlan: compute_plan_html})


__all__ = ["chunk_plan_html", "compute_plan_html"]
