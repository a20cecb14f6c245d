"""What a refusal of a computation over spans says: the step taking whole blocks as the user called it, and
the source by its path."""

from __future__ import annotations

from dask.highlevelgraph import HighLevelGraph
from dask.utils import funcname, key_split

from daskstream.advice import named, said
from daskstream.compute.streaming.span_read_counts import largest_block_bytes
from daskstream.errors import MemoryBudgetError
from daskstream.graph.layers import REGIONS_ANNOTATION, sources_read_by
from daskstream.planning.budget import format_size

_QUANTILES = '{} (ds.reduce(x, "quantile", q=..., axis=...) streams, exact{})'
_MEDIANS = '{} along an axis (ds.reduce(x, "median", axis=...) streams, exact{})'
_NO_NAN = ", where no value is NaN"  # daskstream's quantiles count a NaN as numpy's quantile does

#: dask's names of steps (the prefixes of their keys) that differ from what a user called.
_STEP_NAMES = {
    "arg-reduce": "argmin or argmax",
    "argtopk_preprocess": "argtopk",
    "getitem": "indexing with an array",
    "nanarg-reduce": "nanargmin or nanargmax",
    "histogram-sum": "histogram",
    "lambda": "a function of map_blocks",
    "overlap": "map_overlap's halos (xarray's rolling: ds.kernels streams)",
    "custom_nanquantile": _QUANTILES.format(
        "a quantile along an axis skipping NaN, as xarray's quantile does", _NO_NAN
    ),
    "custom_quantile": _QUANTILES.format("a quantile along an axis", ""),
    "median": _MEDIANS.format("median", ""),
    "nanmedian": _MEDIANS.format("nanmedian", _NO_NAN),
    "percentile": _QUANTILES.format("dask's percentile, approximate", ""),
    "rechunk-merge": "a rechunk",
    "rechunk-split": "a rechunk",
    "top_digit_counts": "an exact quantile's counting pass",
    "vindex-merge": "vindex",
    "vindex-slice": "vindex",
    "next_digit_counts": "an exact quantile's counting pass",
}


def _step_name(layer_name: str, *, making: bool = False) -> str:
    if layer_name.startswith("rechunk-p2p-"):  # whose key dask splits to "rechunk"
        return 'a rechunk by p2p (one by tasks streams: dask.config "array.rechunk.method": "tasks")'
    name = key_split(layer_name)
    if name.startswith("finalize"):
        return "the result"  # dask's layer gathering what compute returns
    if making and name == "getitem":
        return "an index"  # a slice, too, makes blocks; only an array of indices takes them whole
    return _STEP_NAMES.get(name, name)


def check_whole(graph: HighLevelGraph, name: str, cap: int, takers: list[str], *, read: bool) -> None:
    """Refuse blocks of layer ``name`` (a source's ``read``, or a step after one) larger than ``cap`` where a
    step takes them whole, naming the step as the user called it and the source by its path."""
    layer = graph.layers[name]
    annotations = layer.collection_annotations or {}
    largest = largest_block_bytes(layer)
    if annotations.get("chunks") is not None and largest <= cap:
        return
    step = ", ".join(sorted({_step_name(t) for t in takers})) or "the result"
    source = source_name(graph, name)
    # A kernel's regions read in spans are what the kernel makes of the source.
    kernel = getattr(annotations.get(REGIONS_ANNOTATION), "kernel", None)
    if kernel is not None:
        maker: str | None = funcname(getattr(kernel, "fn", kernel))
    elif read:
        maker = None  # the source's own blocks
    else:
        maker = _step_name(name, making=True)
    blocks = f"blocks of {source}" if maker is None else f"blocks of what {maker} makes of {source}"
    # flox rechunks a resample (and a groupby whose groups it finds contiguous) to reduce whole groups: asked
    # for its map-reduce, it reduces each chunk by group instead, which streams.
    grouped = any(key_split(layer_name).startswith("groupby_") for layer_name in graph.layers)
    flox = (
        '; a groupby or resample streams with method="map-reduce" (not a median or quantile per group, which '
        "flox computes on whole groups)"
        if grouped
        else ""
    )
    raise MemoryBudgetError(
        said(
            f"{step} takes whole {blocks}, {format_size(largest)} each: the array is "
            f"read in spans of many chunks per task (more chunks than a graph may hold), and a task may hold "
            f"{format_size(cap)}; only element-wise steps, slices, indices (integers, or one array of positions "
            "with whole slices elsewhere), joins (concatenate, stack, pad, roll), rechunks by tasks, transposes, reshapes, sums, means, "
            "extremes and where they lie, topk, moments, weighted means (einsum), groupby reductions "
            "(flox's map-reduce and cohorts), cumulative sums and products, histograms, exact quantiles, "
            "describe, daskstream's kernels (ds.map_blocks, "
            f"ds.kernels) and stores stream a span chunk by chunk{flox}: compute a part of the array at a "
            "time (x[...]), or reduce it first, or open it with a larger ",
            named("memory_budget"),
        )
    )


def source_name(graph: HighLevelGraph, name: str) -> str:
    """The name of the source layer ``name`` reads, found up its inputs ("" where none is)."""
    waiting, seen = [name], set()
    while waiting:
        current = waiting.pop()
        if current in seen or current not in graph.layers:
            continue
        seen.add(current)
        sources = sources_read_by(graph, graph.layers[current])
        if sources:
            return ", ".join(source.name for source in sources)
        waiting.extend(graph.dependencies.get(current, ()))
    return ""
