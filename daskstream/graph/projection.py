"""The projected memory of a computation's tasks, term by term, from its dask graph.

dask fuses chains of blockwise layers into one task (a read, the element-wise
work on it and the first step of a reduction run as one function call), and
inside such a task each step's inputs are freed as soon as the last step
taking them has run. :func:`project` follows the same rules over the layers
of a graph (after :func:`daskstream.graph.rewrites.rewrite`), step by step,
and keeps the task that holds the most at its peak:

* **input**: blocks the task reads from sources or receives from other tasks;
* **decoded copy**: a storage chunk as stored and decoded, while it is read;
* **halo**: cells a kernel's block borrows beyond it;
* **intermediate**: results of earlier steps still needed by later ones;
* **workspace**: an operation's temporaries — none for numpy's element-wise
  operations, two float64 copies of the block for dask's variance, a few
  pieces for daskstream's own reductions, and one block the size of its
  output for any other function (a user's kernel, say);
* **output**: what the step being run makes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np
from dask.blockwise import Blockwise
from dask.highlevelgraph import HighLevelGraph, Layer
from dask.utils import funcname, key_split

from daskstream.graph.layers import REGIONS_ANNOTATION, SIBLINGS_ANNOTATION, GraphFacts, sources_read_by
from daskstream.graph.pieces import PIECE_VALUES
from daskstream.planning.computation import ComputePlan, TaskMemory
from daskstream.planning.passes import PassPlan
from daskstream.sources.chunk_cache import capacity

# Functions whose temporaries grow with the block, by name, and how many copies of their input block
# they hold in the dtype they work in (None: a fixed number of pieces, whatever the block).
_FLOAT64_COPIES = {
    "moment_chunk": 2,
    "moment_chunk_in_pieces": None,
    "moment_agg": 0,
    "chunk_moments": None,
    "_moments_chunk": None,
}
_PIECE_FUNCTIONS = {"_top_digit_counts", "_next_digit_counts", "chunk_statistics", "_chunk_counts"}
# Float64 temporaries of a function that works piece by piece: three pieces of PIECE_VALUES.
_PIECES = 3


def project(
    graph: HighLevelGraph,
    described: GraphFacts,
    plan: PassPlan,
    *,
    budget: int,
    concurrency: int,
    outputs: Iterable[str],
    read_passes: Mapping[str, tuple[int, ...]] | None = None,
) -> ComputePlan:
    """The :class:`ComputePlan` of the layers ``described`` in ``graph``, given their passes."""

    facts = {f.name: f for f in described.facts}
    outputs = set(outputs)
    dependents: dict[str, set[str]] = {name: set() for name in facts}
    for f in described.facts:
        for name, _ in f.inputs:
            dependents[name].add(f.name)
    groups = _fusion_groups(graph, facts, dependents, outputs)
    levels = _pass_levels(facts, plan, dependents)
    tasks = sum(facts[root].blocks for root in groups if facts[root].kind != "constant")
    worst: TaskMemory | None = None
    pass_work: dict[int, list[str]] = {}
    for root, members in groups.items():
        # dask's finalize step assembles the result the caller asked to hold: not the computation's.
        if facts[root].kind == "constant" or key_split(root).startswith("finalize"):
            continue
        task = _task_memory(graph, facts, members, max(levels[m] for m in members), PIECE_VALUES)
        if worst is None or task.peak_bytes > worst.peak_bytes:
            worst = task
        work = _work_after_reads(graph, facts, members, dependents[root])
        if work is not None:
            pass_work.setdefault(task.level, [])
            if work not in pass_work[task.level]:
                pass_work[task.level].append(work)
    sources: dict[str, int] = {}
    reads: dict[str, int] = {}
    for read in described.sources.values():
        for source in read:
            sources[source.name] = source.nbytes
            reads[source.name] = reads.get(source.name, 0) + 1
    return ComputePlan(
        budget=budget,
        concurrency=concurrency,
        tasks=tasks,
        # Every read of a source is a pass over it, whether the plan needs it in a pass of its own or
        # the work reads it separately (a radix select's passes, a halo's reads beside plain ones).
        passes=max([*reads.values(), *(len(p) for p in (read_passes or plan.read_passes).values())], default=0),
        read_passes=dict(read_passes or plan.read_passes),
        source_bytes=sources,
        pass_work={level: tuple(work) for level, work in sorted(pass_work.items())},
        worst=worst,
        held=_held(graph, facts, plan, dependents, groups, concurrency) + _kept_for_halos(graph, facts),
        reads=reads,
    )


def _pass_levels(facts: Mapping[str, Any], plan: PassPlan, dependents: Mapping[str, set[str]]) -> dict[str, int]:
    """The pass each layer runs in; a read runs in the pass of the work that takes it (once rewritten,
    each pass has reads of its own)."""
    levels = dict(plan.levels)
    for name in reversed(list(facts)):
        if facts[name].kind == "read" and dependents[name]:
            levels[name] = min(levels[t] for t in dependents[name])
    return levels


def _fusion_groups(
    graph: HighLevelGraph, facts: Mapping[str, Any], dependents: Mapping[str, set[str]], outputs: set[str]
) -> dict[str, list[str]]:
    """Layers as dask's blockwise fusion puts them into tasks: ``{root: members, root last}``.

    A blockwise layer whose only dependent is a blockwise layer (and whose
    own blocks nobody asked for) runs inside that dependent's task.
    """
    into: dict[str, str] = {}
    for name in facts:
        takers = dependents[name]
        if (
            name not in outputs
            and len(takers) == 1
            and isinstance(graph.layers[name], Blockwise)
            and isinstance(graph.layers[next(iter(takers))], Blockwise)
        ):
            into[name] = next(iter(takers))
    groups: dict[str, list[str]] = {}
    for name in facts:  # in dependency order, so members come before their root
        root = name
        while root in into:
            root = into[root]
        groups.setdefault(root, []).append(name)
    return groups


def _task_memory(
    graph: HighLevelGraph, facts: Mapping[str, Any], members: list[str], level: int, piece_values: int
) -> TaskMemory:
    """Step through one fused task, keeping what each step holds; the terms at the largest step."""
    inside = set(members)
    remaining = {m: sum(1 for other in members if any(i == m for i, _ in facts[other].inputs)) for m in members}
    # Each block from outside arrives once, however many steps of the task take it.
    arriving: dict[str, int] = {}
    for m in members:
        for i, count in facts[m].inputs:
            if i not in inside and facts[i].kind != "constant":
                arriving[i] = max(arriving.get(i, 0), count)
    received = sum(count * facts[i].block_bytes for i, count in arriving.items())
    held: dict[str, int] = {}
    based: dict[str, int] = {}  # the bytes under a view: its base's, not its shape's
    best: tuple[int, tuple[tuple[str, int], ...]] = (-1, ())
    for m in members:
        layer = graph.layers[m]
        out = facts[m].block_bytes
        decoded = halo = workspace = 0
        read = 0
        if facts[m].kind == "read":
            read = out
            decoded, halo, workspace = _read_costs(graph, layer, out)
            out_term = 0
        elif _makes_view(layer):
            # A view allocates nothing: it holds its base, however large the shape it shows (a rolling
            # window's view is `window` times its block), for as long as a later step takes it.
            out = max((based.get(i, facts[i].block_bytes) for i, _ in facts[m].inputs), default=0)
            based[m] = out
            out_term = 0
        else:
            taken = [(based.get(i, facts[i].block_bytes), i) for i, _ in facts[m].inputs]
            largest, source = max(taken, default=(out, m))
            workspace = _workspace(layer, largest, out, piece_values, _input_itemsize(graph.layers[source]))
            out_term = out
        intermediate = sum(held.values())
        terms = (
            ("input", received + read),
            ("decoded copy", decoded),
            ("halo", halo),
            ("intermediate", intermediate),
            ("workspace", workspace),
            ("output", out_term),
        )
        total = sum(n for _, n in terms)
        if total > best[0]:
            best = (total, terms)
        held[m] = out
        for i, _ in facts[m].inputs:
            if i in inside:
                remaining[i] -= 1
                if remaining[i] <= 0:
                    held.pop(i, None)
    return TaskMemory(_operation(graph, facts, members), best[1], level=level)


def _read_costs(graph: HighLevelGraph, layer: Layer, block: int) -> tuple[int, int, int]:
    """A read's decoded copy, halo and kernel workspace (a region array runs kernels over haloed blocks)."""

    sources = sources_read_by(graph, layer)
    decoded = sum(source.decode_bytes for source in sources)
    regions = (layer.collection_annotations or {}).get(REGIONS_ANNOTATION)
    if regions is None:
        return decoded, 0, 0
    chunks = (layer.collection_annotations or {}).get("chunks") or ()
    largest = [max(c, default=0) for c in chunks]
    items = math.prod(largest)
    haloed = math.prod(n + 2 * r for n, r in zip(largest, regions.reach))
    itemsize = block // items if items else 0
    halo = (haloed - items) * itemsize
    # A kernel holds its haloed input and its output, and the input is let go once the output is made: however
    # deep the chain, two haloed blocks at once, the read one counted as the input (two moving means, lat then
    # lon, over a year of a 1-degree daily field: 2.2 blocks a task measured).
    return decoded, halo, haloed * itemsize if _kernel_depth(regions) else 0


def _kernel_depth(regions: Any) -> int:
    """How many kernels deep a region array computes (each holds its haloed block while the next runs)."""
    inner = [
        _kernel_depth(r)
        for r in (
            getattr(regions, "inputs", None) or [h for k, h, _ in getattr(regions, "operands", ()) if k == "regions"]
        )
    ]
    own = 1 if hasattr(regions, "kernel") else 0
    return own + max(inner, default=0)


#: The annotation of a layer whose blocks hold no data (spans, :mod:`daskstream.compute.streaming`): each step
#: taking one reads its pieces itself, so none waits in memory for a second consumer.
HOLDS_NO_DATA = "daskstream-holds-no-data"

#: The attribute :func:`holds_its_output_only` sets on a function.
_OUTPUT_ONLY = "_daskstream_holds_its_output_only"


def holds_its_output_only(fn: Any) -> Any:
    """Mark ``fn``, a step's function, as holding nothing beside its input and its output (a chunk computed
    from the span it lies in: the piece read, and the chunk made of it)."""
    setattr(fn, _OUTPUT_ONLY, True)
    return fn


def _holds_its_output_only(layer: Layer) -> bool:
    task = getattr(layer, "task", None) or next(iter(layer.values()), None)
    return getattr(getattr(task, "func", None), _OUTPUT_ONLY, False) is True


def _workspace(layer: Layer, taken: int, out: int, piece_values: int, taken_itemsize: int | None = None) -> int:
    """An operation's temporaries beyond its output, from what its function is known to hold
    (``taken``: bytes of its largest input, of ``taken_itemsize`` bytes a value)."""
    if _holds_its_output_only(layer):
        return 0
    func = _function(layer)
    if func is None:
        return out
    name = funcname(func)
    if _elementwise_function(func):
        return 0
    items = taken // max(_input_itemsize(layer), 1)
    # Functions that work piece by piece hold a few float64 pieces, or less when the block is smaller.
    pieces = 8 * _PIECES * min(items, piece_values)
    if name in _FLOAT64_COPIES:
        copies = _FLOAT64_COPIES[name]
        if copies is None:
            return pieces
        # dask's variance centres the block in the dtype it accumulates in (float64 unless told).
        task = cast(Blockwise, layer).task  # _function found a function: the layer is blockwise
        dtype = getattr(getattr(task, "func", None), "keywords", {}).get("dtype", "f8")
        return items * copies * max(np.dtype(dtype).itemsize, _input_itemsize(layer))
    if name in _PIECE_FUNCTIONS:
        return pieces
    module = getattr(func, "__module__", None) or ""
    if name in _INPUT_COPIES:
        return max(out, _INPUT_COPIES[name] * taken)
    if (module == "numpy" and name in _NUMPY_LIGHT) or module.startswith(_LIGHT_MODULES):
        return out
    # Any other function (flox's groupby steps, a user's kernel): what the chunk planner assumes a step
    # holds, float64 copies of its input (PlanSettings.float64_copies), or its output if larger.
    values = taken // max(taken_itemsize or _input_itemsize(layer), 1)
    return max(out, UNKNOWN_FLOAT64_COPIES * 8 * values)


# numpy's functions that return a view of their input, by (module, name): no memory of their own.
_VIEW_FUNCTIONS = {
    ("numpy.lib.stride_tricks", "sliding_window_view"),
    ("numpy.lib._stride_tricks_impl", "sliding_window_view"),
    ("numpy", "transpose"),
    ("numpy", "moveaxis"),
    ("numpy", "swapaxes"),
    ("numpy", "broadcast_to"),
    ("numpy", "expand_dims"),
    ("numpy", "squeeze"),
    # dask's zeros_like and full_like: a scalar broadcast to the block's shape.
    ("dask.array.wrap", "_broadcast_trick_inner"),
}


def _makes_view(layer: Layer) -> bool:
    func = _function(layer)
    return func is not None and (getattr(func, "__module__", None), getattr(func, "__name__", None)) in _VIEW_FUNCTIONS


# numpy functions that hold no more than their output beside their input (reductions, products); its
# element-wise ufuncs and np.where are known as element-wise before this is asked.
_NUMPY_LIGHT = {
    "sum", "prod", "max", "min", "amax", "amin", "mean", "any", "all", "argmax", "argmin", "einsum", "dot",
    "tensordot", "matmul", "concatenate", "stack", "clip", "round", "around", "cumsum", "cumprod",
    "zeros_like", "ones_like", "full_like", "empty_like", "fix", "real", "imag", "angle", "iscomplex",
}  # fmt: skip
# Modules whose functions are dask's own block steps: each makes its output and little else.
_LIGHT_MODULES = ("dask.array.chunk", "dask.array.reductions", "dask.array.einsumfuncs", "dask.array.core",
                  "dask.array.wrap", "flox.dask")  # fmt: skip
# Functions that copy their input this many times in its own dtype (measured with tracemalloc on a 1-degree
# daily float32 field): numpy's quantile partitions a copy of columns assembled from the pieces read (2 a
# task beside the block); flox's blockwise reduction (a resample whose periods a chunk holds whole)
# reorders the block and masks it. numpy's nan_to_num holds its output and three masks (at most 3.5 copies
# beside its input, of float16; 2.25 of float32), and isreal its answer and the imaginary parts' (1.5).
_INPUT_COPIES = {"_block_quantile": 2, "_reduce_blockwise": 2, "nan_to_num": 3, "isreal": 2}
#: Float64 copies of its input an unknown function is taken to hold: the chunk planner's own assumption
#: (PlanSettings.float64_copies). flox's map-reduce step of a monthly mean holds 3 (a year of float32 days:
#: 6.0 blocks), its standard deviation 3.7.
UNKNOWN_FLOAT64_COPIES = 3


def _function(layer: Layer) -> Any:
    if not isinstance(layer, Blockwise):
        return None
    func = getattr(layer.task, "func", None)
    # dask wraps element-wise functions to enforce the dtype, and reductions in partials.
    while func is not None and hasattr(func, "func") and not isinstance(func, np.ufunc):
        func = func.func
    return func


def _elementwise_function(func: Any) -> bool:
    if isinstance(func, np.ufunc) or func is np.where:
        return True
    return getattr(func, "__module__", None) in (operator.__name__, "_operator")


def _input_itemsize(layer: Layer) -> int:
    dtype = (layer.collection_annotations or {}).get("dtype")
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 8


def _work_after_reads(
    graph: HighLevelGraph, facts: Mapping[str, Any], members: list[str], takers: set[str]
) -> str | None:
    """What a task that reads sources does with the blocks (``sub -> moments_chunk``); ``None`` if it reads nothing."""
    if not any(facts[m].kind == "read" for m in members):
        return None
    steps = [_label(graph, m) for m in members if facts[m].kind == "compute"]
    regions = [_operation(graph, facts, [m]) for m in members if facts[m].kind == "read"]
    kernels = [r.split(" -> ", 1)[1] for r in regions if " -> " in r]
    if kernels or steps:
        return " -> ".join(kernels + steps)
    # A read taken by several tasks is a task of its own.
    return " and ".join(sorted({key_split(t) for t in takers})) or "the blocks as read"


def _operation(graph: HighLevelGraph, facts: Mapping[str, Any], members: list[str]) -> str:
    """What a fused task does, reads first: ``read field.npy -> sub -> moments_chunk``."""

    steps = []
    for m in sorted(members, key=lambda m: facts[m].kind != "read"):
        layer = graph.layers[m]
        if facts[m].kind == "read":
            regions = (layer.collection_annotations or {}).get(REGIONS_ANNOTATION)
            label = regions.label if regions is not None else None
            read = "read " + ", ".join(s.name for s in sources_read_by(graph, layer))
            steps.append(read if label is None or label.startswith("read ") else f"{read} -> {label}")
        elif facts[m].kind == "compute":
            steps.append(_label(graph, m))
    return " -> ".join(steps) or "nothing"


def _label(graph: HighLevelGraph, name: str) -> str:
    """What a person calls a layer's step: its function's name (siblings run together: both names)."""

    siblings = (graph.layers[name].collection_annotations or {}).get(SIBLINGS_ANNOTATION)
    return " and ".join(siblings) if siblings else key_split(name)


def _kept_for_halos(graph: HighLevelGraph, facts: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The decoded storage chunks a process keeps for neighbouring halos (:mod:`daskstream.sources.chunk_cache`)."""

    largest = 0
    for name, f in facts.items():
        regions = (graph.layers[name].collection_annotations or {}).get(REGIONS_ANNOTATION)
        if f.kind == "read" and regions is not None and any(regions.reach):
            largest = max([largest, *(s.storage_chunk_bytes() for s in regions.sources if s.decode_bytes)])
    return (("decoded chunks kept for halos", capacity() * largest),) if largest else ()


def _held(
    graph: HighLevelGraph,
    facts: Mapping[str, Any],
    plan: PassPlan,
    dependents: Mapping[str, set[str]],
    groups: Mapping[str, list[str]],
    concurrency: int,
) -> tuple[tuple[str, int], ...]:
    """What stays in memory between tasks: aggregates a later pass takes whole, blocks waiting for a second taker.

    An aggregate counts when a task that reads sources takes it in a later
    pass than its own (a mean entering the pass that centres the data).
    """
    group_of = {member: root for root, members in groups.items() for member in members}
    reads_in = {root for root, members in groups.items() if any(facts[m].kind == "read" for m in members)}
    aggregates = 0
    for name, f in facts.items():
        if (
            f.kind == "compute"
            and not _holds_no_data(graph, name)
            and any(
                group_of[t] in reads_in
                and group_of[t] != group_of[name]
                and plan.levels.get(t, 0) > plan.levels.get(name, 0)
                for t in dependents[name]
            )
        ):
            aggregates += f.block_bytes * f.blocks
    # A block waits for a second consumer when two tasks take it, not two steps of one task.
    waiting = max(
        (
            facts[root].block_bytes
            for root in groups
            if len({group_of[t] for t in dependents[root]}) > 1
            and facts[root].kind != "constant"
            and not _holds_no_data(graph, root)
        ),
        default=0,
    )
    held = []
    if aggregates:
        held.append(("held for later passes", aggregates))
    if waiting:
        held.append(("waiting for a second consumer", waiting * concurrency))
    return tuple(held)


def _holds_no_data(graph: HighLevelGraph, name: str) -> bool:
    layer = graph.layers.get(name)
    return layer is not None and bool((layer.collection_annotations or {}).get(HOLDS_NO_DATA))


__all__ = ["HOLDS_NO_DATA", "project"]
