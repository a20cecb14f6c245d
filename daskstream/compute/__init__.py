"""Computations on daskstream arrays: reductions, one-pass statistics, kernels and store."""

from daskstream.compute import kernels
from daskstream.compute.blockwise import map_blocks
from daskstream.compute.describe import Description, LazyDescription, describe
from daskstream.compute.limits import CodecLimit, codec_limit
from daskstream.compute.plans import plan_compute
from daskstream.compute.quantiles import median, quantile
from daskstream.compute.rechunk import rechunk
from daskstream.compute.reductions import OPERATIONS, histogram, reduce
from daskstream.compute.store import store
from daskstream.compute.store.codecs import CodecChoice, choose_codec

__all__ = [
    "OPERATIONS",
    "CodecChoice",
    "CodecLimit",
    "Description",
    "LazyDescription",
    "choose_codec",
    "codec_limit",
    "describe",
    "histogram",
    "kernels",
    "map_blocks",
    "median",
    "plan_compute",
    "quantile",
    "rechunk",
    "reduce",
    "store",
]
