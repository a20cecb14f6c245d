"""How large a Zarr chunk may be, stored and decoded, as its array's metadata and codecs allow.

Nothing a chunk says about its own size is believed before it is checked
against these: a chunk file (or object, or zip member) larger than its
codecs can make of the chunk is refused before it is read, and what a chunk
of variable-length items may decode to is bounded, since its shape fixes
nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from daskstream.errors import CorruptSourceError
from daskstream.sources.bounded import largest_encoding

# A chunk of variable-length strings (or bytes) has no size its shape fixes: it may decode to this much
# on average per element, and this much besides, before it is refused as a bomb.
_TEXT_BYTES_PER_ELEMENT = 16 * 2**10
_TEXT_ALLOWANCE = 2**20
# Codecs that reshape or retype a chunk (transposes, numcodecs' array filters, other serializers) may
# store it in up to this many times its bytes.
_RESHAPED_GROWTH = 8


def decoded_chunk_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The most bytes a chunk of ``shape`` decodes to: exact for fixed-width dtypes, a bound for text.

    >>> decoded_chunk_bytes((10, 10), np.dtype("f8"))
    800
    """
    elements = math.prod(shape)
    if _is_text(dtype):
        # Their count, each one's length and the text: what zarr's vlen codecs store.
        return 4 + elements * (4 + _TEXT_BYTES_PER_ELEMENT) + _TEXT_ALLOWANCE
    return elements * dtype.itemsize


def _is_text(dtype: np.dtype) -> bool:
    """Whether chunks of ``dtype`` hold variable-length items (strings, bytes, objects) rather than fixed-width ones."""
    return dtype.hasobject or dtype.kind in "OT" or dtype.itemsize == 0


def reshaped_growth(dtype: np.dtype, reshaped: bool) -> int:
    """How many times its decoded bytes a chunk's codecs may store it in: more where they retype fixed-width
    values (a text chunk's bound already covers whatever its serializer makes)."""
    return _RESHAPED_GROWTH if reshaped and not _is_text(dtype) else 1


def largest_chunk_file(array: Any) -> int:
    """The most bytes one chunk (or shard) file of ``array`` can hold; a larger one is damaged or forged.

    Checked before the file, object or zip member is read.
    """
    metadata = array.metadata
    if metadata.zarr_format == 2:
        dtype = np.dtype(metadata.dtype.to_native_dtype())
        return largest_encoding(
            decoded_chunk_bytes(tuple(metadata.chunks), dtype) * reshaped_growth(dtype, bool(metadata.filters))
        )
    dtype = np.dtype(metadata.data_type.to_native_dtype())
    return largest_v3_chunk(tuple(metadata.codecs), tuple(metadata.chunk_grid.chunk_shape), dtype)


def largest_v3_chunk(codecs: tuple, shape: tuple[int, ...], dtype: np.dtype) -> int:
    from zarr.codecs import BytesCodec, ShardingCodec

    sharding = next((c for c in codecs if isinstance(c, ShardingCodec)), None)
    if sharding is not None:
        inner = tuple(sharding.chunk_shape)
        count = math.prod(-(-s // c) for s, c in zip(shape, inner))
        # Every inner chunk at its largest, and the index: 16 bytes an inner chunk and a checksum.
        return largest_encoding(count * (largest_v3_chunk(tuple(sharding.codecs), inner, dtype) + 16) + 4)
    reshaped = any(not is_bytes_to_bytes(c) and not isinstance(c, BytesCodec) for c in codecs)
    return largest_encoding(decoded_chunk_bytes(shape, dtype) * reshaped_growth(dtype, reshaped))


def is_bytes_to_bytes(codec: Any) -> bool:
    from zarr.abc.codec import BytesBytesCodec

    return isinstance(codec, BytesBytesCodec)


def check_chunk_size(name: str, key: str, size: int, largest: int | None) -> None:
    if largest is not None and size > largest:
        raise CorruptSourceError(
            f"{name}: chunk {key!r} is {size} bytes, more than this array's codecs can store a chunk in "
            f"({largest}); the store is damaged or forged: re-create or re-copy it"
        )
