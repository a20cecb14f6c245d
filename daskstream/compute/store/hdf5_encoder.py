"""HDF5 chunks encoded by the tasks that computed them, for the one writing process to put in place raw.

HDF5 takes writes from one process, and h5py compresses each chunk it is given
in that process, under its global lock: a store into a gzip dataset ran at the
speed of one zlib. For datasets whose filter pipeline is one daskstream can
apply itself -- none, deflate, or shuffle then deflate, as ``store`` creates
them -- each task pads its block to the chunk shape with the fill value,
shuffles its bytes as HDF5's shuffle filter does and compresses them with
libdeflate (zlib format, as HDF5's deflate filter writes), in its own thread;
the writer hands the bytes to ``write_direct_chunk``. Any other pipeline is
written through h5py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.array as da
import deflate
import numpy as np

from daskstream.compute.store.chunk_writer import whole_chunk

# HDF5's filter identifiers for deflate (gzip) and shuffle.
_DEFLATE, _SHUFFLE = 1, 2


@dataclass(frozen=True)
class Hdf5ChunkEncoder:
    """How one dataset's chunks are padded, shuffled and compressed: small and picklable, for any worker."""

    chunk_shape: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    shuffle: bool
    level: int | None

    def encode(self, block: np.ndarray) -> bytes:
        """The bytes HDF5 stores for the chunk holding ``block`` (its part inside the dataset)."""
        chunk = whole_chunk(block, self.chunk_shape, self.dtype, self.fill_value)
        raw = np.ascontiguousarray(chunk).view(np.uint8)
        if self.shuffle and self.dtype.itemsize > 1:
            # HDF5's shuffle: the first byte of every element, then every second byte, and so on.
            raw = np.ascontiguousarray(raw.reshape(-1, self.dtype.itemsize).T)
        data = raw.tobytes()
        return data if self.level is None else bytes(deflate.zlib_compress(data, self.level))

    def encoded_blocks(self, x: da.Array) -> da.Array:
        """``x`` as one task per block returning its encoded chunk (a 1-element object array)."""
        return da.map_blocks(
            _encoded,
            x,
            self,
            dtype=object,
            chunks=tuple((1,) * n for n in x.numblocks),
            meta=np.empty((0,) * x.ndim, dtype=object),
        )


def _encoded(block: np.ndarray, encoder: Hdf5ChunkEncoder) -> np.ndarray:
    out = np.empty((1,) * block.ndim, dtype=object)
    out[(0,) * block.ndim] = encoder.encode(block)
    return out


def hdf5_encoder_for(dset: Any) -> Hdf5ChunkEncoder | None:
    """The encoder for the chunked dataset ``dset``, or ``None`` where h5py must write it."""
    if dset.chunks is None or dset.dtype.hasobject or dset.dtype.fields or dset.dtype.kind not in "biufc":
        return None
    plist = dset.id.get_create_plist()
    pipeline = [plist.get_filter(i)[:3] for i in range(plist.get_nfilters())]
    codes = [code for code, _, _ in pipeline]
    if codes not in ([], [_DEFLATE], [_SHUFFLE, _DEFLATE]):
        return None
    level = None
    if codes:
        values = pipeline[-1][2]
        level = int(values[0]) if values else 6
        if not 0 <= level <= 9:
            return None
    return Hdf5ChunkEncoder(tuple(int(c) for c in dset.chunks), np.dtype(dset.dtype), dset.fillvalue,
                            _SHUFFLE in codes, level)  # fmt: skip
