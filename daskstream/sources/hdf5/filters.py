"""The HDF5 filters this process can decode: h5py imported with hdf5plugin's, their names, the one missing.

h5py decodes a filter only when HDF5 finds it (built in, registered by
hdf5plugin, or a plugin on ``HDF5_PLUGIN_PATH``); where it does not, a read
fails deep in HDF5, so the error here names the filter and what provides it.
Filters h5py decodes hold its global lock, those daskstream decodes itself
(:mod:`~daskstream.sources.hdf5.chunks`) do not: the notes here say which.
"""

from __future__ import annotations

import contextlib
from typing import Any

from daskstream.dependencies import installed_version, optional_import
from daskstream.errors import MissingDependencyError

# What a plan says of threads decoding a dataset's filters: h5py decodes under its global lock.
HDF5_LOCK_NOTE = (
    "HDF5 decompression of {filters} holds h5py's global lock: threads will not decode in parallel; "
    "use processes or a cluster (session('processes') in Python, --scheduler processes on the command line)"
)
PARALLEL_DECODE_NOTE = (
    "{filters} chunks are read and decoded by daskstream itself, outside h5py's lock: threads decode in parallel"
)

# Filters hdf5plugin provides, by the ids registered with The HDF Group: bzip2, blosc, lz4, bitshuffle,
# zfp, zstd, sz, fcidecomp, sz3, blosc2. Named without importing it, to say what to install.
_HDF5PLUGIN_FILTERS = frozenset({307, 32001, 32004, 32008, 32013, 32015, 32017, 32018, 32024, 32026})


def _missing_filter(name: str, pipeline: tuple, filters: tuple[str, ...], h5py: Any) -> MissingDependencyError | None:
    """The error naming what provides a filter of the dataset that h5py cannot decode here, if one is missing.

    Without it a read that needs the filter fails deep in HDF5 ("can't open
    directory ... plugin"), which reads as a damaged file.
    """
    for (code, _), filter_name in zip(pipeline, filters, strict=True):
        if h5py.h5z.filter_avail(code):
            continue
        needed_for = f"{name}: decoding its HDF5 filter {filter_name!r} (id {code})"
        if code not in _HDF5PLUGIN_FILTERS:
            return MissingDependencyError(
                f"{needed_for} needs an HDF5 filter plugin that neither h5py nor hdf5plugin provides: install the "
                "plugin for that filter and set HDF5_PLUGIN_PATH to the folder holding it"
            )
        try:  # says whether hdf5plugin is missing, too old or cannot load
            optional_import("hdf5plugin", package="hdf5plugin", extra="hdf5plugin", needed_for=needed_for)
        except MissingDependencyError as missing:
            return missing
        return MissingDependencyError(
            f"{needed_for} needs a filter the installed hdf5plugin {installed_version('hdf5plugin')} does not "
            "register; pip install --upgrade 'daskstream[hdf5plugin]'"
        )
    return None


def _first_chunk_filtered_by_missing(dset: Any, pipeline: tuple, h5py: Any) -> bool:
    """Whether the first chunk written went through a filter h5py cannot decode here.

    Filters are optional in HDF5: a writer without one skips it, chunk by chunk
    (the chunk's filter mask says so), and such a file reads without it. So a
    missing filter is refused at open only when a chunk is known to need it;
    otherwise the read of a chunk that does says so.
    """
    if not pipeline or dset.chunks is None:
        return False
    try:
        if dset.id.get_num_chunks() == 0:
            return False
        mask = dset.id.get_chunk_info(0).filter_mask
    except (OSError, RuntimeError):  # a chunk index h5py cannot walk: the read that needs it will say so
        return False
    return any(not h5py.h5z.filter_avail(code) and not mask & (1 << i) for i, (code, _) in enumerate(pipeline))


def filter_names(dcpl: Any) -> tuple[str, ...]:
    """The names of the filters in a dataset's creation properties, in the order HDF5 applies them on write."""
    # Plugin filters register long names ("HDF5 zstd filter; see https://..."): keep the name part.
    return tuple(
        dcpl.get_filter(i)[3].decode(errors="replace").split(";")[0].strip() for i in range(dcpl.get_nfilters())
    )


def import_h5py() -> Any:
    import h5py

    with contextlib.suppress(ImportError):
        # Registers the extra compression filters (blosc, zstd, lz4, bitshuffle...) when installed.
        import hdf5plugin  # noqa: F401
    return h5py
