"""daskstream: out-of-core arrays from .npy, HDF5 and Zarr files on dask.

>>> import daskstream as ds
>>> x = ds.open  # ds.open, ds.open_dataset, ds.open_images, ds.list, ds.plan, ds.plan_chunks, ds.plan_compute, ds.reduce, ds.describe, ds.store, ds.rechunk, ds.session, ds.tune...
>>> all(hasattr(ds, name) for name in ds.__all__)
True
"""

# First: in the daskstream command's own process (and nowhere else), a signal while the rest imports is one
# line and the shell's exit status, not a traceback.
from daskstream import starting as _starting  # noqa: F401, I001 - must come before every other import
from daskstream import config as _config  # noqa: F401 - registers the daskstream.* defaults
from daskstream.arrays import describe, open, plan, plan_chunks, reduce, store
from daskstream.compute import (
    CodecChoice,
    choose_codec,
    kernels,
    map_blocks,
    plan_compute,
    rechunk,
)
from daskstream.compute.computation import install_optimizer
from daskstream.errors import DaskstreamError
from daskstream.labelled import open_dataset
from daskstream.planning import ChunkPlan
from daskstream.runtime.session import Session, session
from daskstream.sources import Source, open_source
from daskstream.sources.handles import forget_handles as close_files
from daskstream.sources.images.folder import ImageFolder, open_images
from daskstream.sources.listing import Listing
from daskstream.sources.listing import list_file as list
from daskstream.streaming import Stream, stream
from daskstream.tuning import TuneResult, tune
from daskstream import views as _views  # noqa: F401 - gives the planner's results their notebook cards

__version__ = "0.1.0"

# What importing daskstream changes, all of it: dask's default array optimizer becomes daskstream's, which
# plans the passes of graphs reading daskstream sources against their budget and hands every other graph to
# dask's own optimizer untouched (daskstream.compute.rewrite: false hands it every graph). Nothing else:
# the allocator's arenas are capped where daskstream starts work, and its heaps keep a few MiB free at their
# tops from a source's first read on (see daskstream.allocator).
install_optimizer()

__all__ = [
    "ChunkPlan",
    "CodecChoice",
    "DaskstreamError",
    "ImageFolder",
    "Listing",
    "Session",
    "Source",
    "Stream",
    "TuneResult",
    "__version__",
    "choose_codec",
    "close_files",
    "describe",
    "kernels",
    "list",
    "map_blocks",
    "open",
    "open_dataset",
    "open_images",
    "open_source",
    "plan",
    "plan_chunks",
    "plan_compute",
    "rechunk",
    "reduce",
    "session",
    "store",
    "stream",
    "tune",
]
