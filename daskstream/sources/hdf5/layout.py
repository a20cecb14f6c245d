"""Where an HDF5 dataset's bytes lie, beyond what HDF5 states: what a reader may take as it is said.

The kinds of element whose bytes are numpy's, the bytes an element takes in
the file's chunks, whether HDF5 leaves a reader's buffer as it was for data
never written, and whether the chunk addresses HDF5 reports hold in a file
with a user block: what decides whether :class:`~daskstream.sources.hdf5.source.Hdf5Source`
reads bytes itself or through h5py.
"""

from __future__ import annotations

from typing import Any

# Raw on-disk bytes equal numpy's for these kinds, so contiguous data can skip h5py.
_RAW_READABLE_KINDS = set("biufcS")


def _stored_itemsize(dset: Any, h5py: Any) -> int:
    """Bytes one element takes in the file's chunks: a variable-length string is a global heap reference there
    (its length, the heap's address and the index in it), whatever size HDF5 gives its type."""
    file_type = dset.id.get_type()
    if file_type.get_class() == h5py.h5t.VLEN or (
        file_type.get_class() == h5py.h5t.STRING and file_type.is_variable_str()
    ):
        sizeof_addr, _ = dset.file.id.get_create_plist().get_sizes()
        return 4 + int(sizeof_addr) + 4
    return int(file_type.get_size())


def _leaves_buffer_unfilled(dcpl: Any, h5py: Any) -> bool:
    """Whether HDF5 leaves a reader's buffer as it was for data never written: no fill value defined, or never filled."""
    return (
        dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_UNDEFINED or dcpl.get_fill_time() == h5py.h5d.FILL_TIME_NEVER
    )


# From HDF5 1.14.4 the addresses HDF5 gives for chunks count the file's user block; before, they
# started after it (measured: h5py 3.11 with HDF5 1.14.2 reads such a file's chunks at the wrong bytes).
_CHUNK_ADDRESSES_COUNT_USERBLOCK = (1, 14, 4)


def _chunk_addresses_hold(dset: Any) -> bool:
    """Whether the chunk addresses HDF5 reports are where the bytes are in the file.

    They are not in a file with a user block under an HDF5 older than 1.14.4:
    such a file's chunks are read through h5py instead, which knows.
    """
    import h5py

    if dset.file.userblock_size == 0:
        return True
    return tuple(h5py.version.hdf5_version_tuple[:3]) >= _CHUNK_ADDRESSES_COUNT_USERBLOCK
