"""daskstream's optimizer: passes planned against the budget, spans streamed, blocks folded, chains streamed.

Installed as dask's ``array_optimize`` (:mod:`daskstream.compute.computation`).
``daskstream.compute.streaming: false`` leaves graphs as dask made them after
planning.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from typing import Any

from dask._task_spec import Task
from dask.array.optimization import optimize as dask_optimize
from dask.highlevelgraph import HighLevelGraph
from dask.typing import Key
from dask.utils import ensure_dict

from daskstream import config
from daskstream.compute.streaming.chains import run_chains, stream_chains
from daskstream.compute.streaming.chunkwise import chunkwise_reads
from daskstream.compute.streaming.folds import FOLDED_PREFIX, fold_blocks, run_folded
from daskstream.compute.streaming.span_graphs import checked_spans
from daskstream.graph.optimize import planned_graph, requested_keys
from daskstream.planning.computation import ComputePlan, Streaming


def optimize_streaming(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """daskstream's optimizer (:func:`daskstream.graph.optimize.optimize`), then streaming tasks where a graph
    reads daskstream sources: dask's ``array_optimize`` once daskstream is imported.

    Python's cyclic garbage collector is paused meanwhile: optimizing makes
    millions of objects that stay alive (tasks, keys, sets of dependencies)
    and few cycles, and each full collection walks every live object, so
    collections alone made optimizing grow faster than the graph (a centred
    std from 8 to 64 GiB: 1.63 times faster with them, 1.17 without).
    """
    with _collector_paused():
        return _optimized(dsk, keys, **kwargs)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _optimized(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    if config.get("compute.rewrite"):
        dsk = checked_spans(dsk, requested_keys(keys)) or dsk
    graph, plan, planned = planned_graph(dsk, keys)
    if plan is None or planned is None or not config.get("compute.streaming"):
        return dask_optimize(graph, keys, **kwargs)
    threads = planned.threads * planned.workers
    return streamed_graph(graph, keys, threads=threads, ahead=chains_ahead(plan), **kwargs)


def streamed_graph(graph: HighLevelGraph, keys: Any, *, threads: int, ahead: int = 0, **kwargs: Any) -> dict[Key, Any]:
    """``graph`` (planned) as it runs: blocks folded into their combines, optimized by dask, chains streamed."""
    wanted = requested_keys(keys)
    graph = chunkwise_reads(graph, wanted)
    optimized = ensure_dict(dask_optimize(fold_blocks(graph, wanted, threads=threads, ahead=ahead), keys, **kwargs))
    # Combines computing their blocks are as many as keep the threads busy: grouped further, they would not.
    kept = [*wanted, *(key for key, node in optimized.items() if isinstance(node, Task) and node.func is run_folded)]
    return stream_chains(optimized, kept, threads=threads, ahead=ahead)


def chains_ahead(plan: ComputePlan) -> int:
    """Chains a streaming task computes ahead: for sources on an object store, as many as the budget holds
    beside what the plan projects (``daskstream.objects.chains-ahead`` at most); none for local files, whose
    reads the threads already overlap with their work.

    >>> import dataclasses
    >>> from daskstream.planning.computation import ComputePlan, TaskMemory
    >>> worst = TaskMemory("read", (("input", 10),))
    >>> plan = ComputePlan(budget=100, concurrency=2, tasks=9, passes=1, read_passes={"s3://b/x.zarr": (0,)},
    ...                    source_bytes={}, pass_work={}, worst=worst)
    >>> chains_ahead(plan)
    2
    >>> chains_ahead(dataclasses.replace(plan, read_passes={"/data/x.zarr": (0,)}))
    0
    """
    if not any(_on_object_store(source) for source in plan.read_passes):
        return 0
    # Each chain ahead holds what one task does at its peak, beside the tasks running at once.
    spare = plan.budget // max(1, plan.projected_peak_bytes) - 1
    return max(0, min(spare, int(config.setting("objects.chains-ahead"))))


def _on_object_store(source: str) -> bool:
    scheme, found, _ = source.partition("://")
    return bool(found) and scheme not in ("file", "local")


def streaming_of(streamed: Mapping[Key, Any], built: int, *, ahead: int = 0) -> Streaming | None:
    """What :func:`streamed_graph` made of a graph of ``built`` tasks as dask would run it: its streaming
    tasks (those computing chains, and combines computing their blocks), the tasks they fold, the tasks left;
    None where it streams nothing."""
    streams = sum(1 for node in streamed.values() if _streams(node))
    if not streams:
        return None
    # The folded layers, one value each that their streaming tasks take: not work dask would have run.
    shared = sum(1 for key in streamed if isinstance(key, str) and key.startswith(FOLDED_PREFIX))
    folded = built - (len(streamed) - shared) + streams
    return Streaming(streams=streams, folded=folded, tasks=len(streamed), ahead=ahead, shared=shared)


def _streams(node: Any) -> bool:
    return isinstance(node, Task) and node.func in (run_chains, run_folded)


__all__ = ["chains_ahead", "optimize_streaming", "streamed_graph", "streaming_of"]
