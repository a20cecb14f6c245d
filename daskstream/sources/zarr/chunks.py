"""Zarr arrays in a local directory, read chunk by chunk in the calling thread.

zarr-python 3 runs every read through one event loop and decodes on its own
thread pool, so dask threads calling it queue behind each other and compete
with that pool for the cores. For arrays in a local directory whose codecs
numcodecs decodes (zstd, blosc, gzip; crc32c checksums, checked with
google-crc32c as zarr does; the bytes codec; sharding over those), a task here
reads each chunk or shard file with one system call and decodes it with
numcodecs in its own thread. numcodecs releases the GIL while
it decompresses, so two tasks decode on two cores, and nothing else spawns
threads.

Arrays on object stores are read the same way, their chunk objects fetched
concurrently (see :mod:`daskstream.sources.objects.places`), and so are arrays in
zip files (:mod:`daskstream.sources.zarr.files`). The codecs are undone in
:mod:`daskstream.sources.zarr.decoders`, every decompressor told the size it
must give (:mod:`daskstream.sources.bounded`); a whole chunk whose place in
the task's block is one run of memory (the block as wide as the chunk, say)
is decompressed straight into it, with no copy. Any other codec goes through
zarr, whose reads are checked first (:mod:`daskstream.sources.zarr.checks`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from daskstream.caches import LeastRecentlyUsed
from daskstream.errors import CorruptSourceError, DaskstreamError
from daskstream.sources.base import Region, storage_pieces
from daskstream.sources.bounded import DECODE_ERRORS
from daskstream.sources.chunk_cache import active, keep, kept, on_surface
from daskstream.sources.zarr.bounds import largest_chunk_file
from daskstream.sources.zarr.decoders import ChunkDecoder, NotDecodedHere, shard_layout_of, v2_decoder, v3_decoder
from daskstream.sources.zarr.files import ChunkObjects, LocalChunkFiles, ZipChunkFiles
from daskstream.sources.zarr.shards import ShardLayout


def chunk_reader_for(array: Any, objects: ChunkObjects | None = None) -> ZarrChunkReader | None:
    """A reader for ``array`` when its codecs are decoded here and its chunks are local files, zip members
    (its store a :func:`~daskstream.sources.zarr.checks.checked_store` over a zip) or ``objects``.

    ``objects``: the array's chunk objects on an object store, for an array
    zarr opened through fsspec; without it only local directories and zip files are read here.
    """
    from zarr.storage import LocalStore

    store = getattr(array.store, "inner", array.store)  # beneath a checked_store
    members = getattr(array.store, "members", None)
    local = isinstance(store, LocalStore)
    if not local and objects is None and members is None:
        return None
    metadata = array.metadata
    try:
        shards = None
        if metadata.zarr_format == 2:
            storage_chunks = tuple(metadata.chunks)
            decode = v2_decoder(metadata)
        else:
            # The grid of chunk files: shards when the array is sharded.
            storage_chunks = tuple(metadata.chunk_grid.chunk_shape)
            decode = v3_decoder(metadata.codecs, storage_chunks, metadata)
            shards = shard_layout_of(metadata.codecs, storage_chunks, metadata)
    except NotDecodedHere:
        return None
    largest = largest_chunk_file(array)
    fetch: LocalChunkFiles | ZipChunkFiles | ChunkObjects
    if local:
        fetch = LocalChunkFiles(os.path.join(str(store.root), array.path or ""), largest)
    elif members is not None:
        fetch = ZipChunkFiles(members, array.path or "", largest)
    else:
        assert objects is not None
        objects.largest = largest
        fetch = objects
    fill = array.fill_value if array.fill_value is not None else 0
    # A shard decodes only the inner chunks a box needs: only whole chunks are worth keeping for halos.
    whole = tuple(array.chunks) == storage_chunks
    return ZarrChunkReader(
        fetch, metadata.encode_chunk_key, storage_chunks, decode, fill, keepable=whole, shards=shards
    )


def reads_shards_in_part(array: Any, local_or_objects: bool) -> bool:
    """Whether tasks may read ``array``'s shards in part (and so be planned in inner chunks): a sharded
    array in a local directory or on an object store, whose shard bytes are its inner chunks and index as
    they are (no codec around the whole shard), and which zarr reads in part too where this module does not."""
    metadata = array.metadata
    if not local_or_objects or metadata.zarr_format != 3 or getattr(array, "shards", None) is None:
        return False
    try:
        return shard_layout_of(metadata.codecs, tuple(metadata.chunk_grid.chunk_shape), metadata) is not None
    except NotDecodedHere:
        return True  # zarr decodes it, fetching the byte ranges of the inner chunks it needs


class ZarrChunkReader:
    """Reads boxes of one array from its chunk (or shard) files.

    Parameters
    ----------
    chunks
        Where the chunk files or objects are (:class:`LocalChunkFiles`,
        :class:`ChunkObjects`): what fetches a box's chunks, all at once.
    chunk_key
        Maps a position in the storage grid to the file's key ("c/0/1", "0.1").
    storage_chunks
        The storage grid: shards when sharded, else chunks.
    decode
        How a chunk file decodes (:class:`ChunkDecoder`): a box of it as an
        array, or the whole chunk straight into its place in a block.
    fill_value
        What a missing chunk file reads as.
    keepable
        Whether decoded chunks may be kept for neighbouring halos
        (:mod:`daskstream.sources.chunk_cache`): whole chunks, not shards.
    shards
        How a shard holds its inner chunks, for sharded arrays whose shard
        files are read in part (:mod:`daskstream.sources.zarr.shards`).
    """

    def __init__(
        self,
        chunks: LocalChunkFiles | ZipChunkFiles | ChunkObjects,
        chunk_key: Callable[[tuple[int, ...]], str],
        storage_chunks: tuple[int, ...],
        decode: ChunkDecoder,
        fill_value: Any,
        keepable: bool = False,
        shards: ShardLayout | None = None,
    ) -> None:
        self.chunks = chunks
        self.shards = shards
        # Shard indexes read from object stores, by object and version: each costs a request to read again.
        self._indexes: LeastRecentlyUsed[np.ndarray] = LeastRecentlyUsed(KEPT_INDEX_BYTES, lambda i: i.nbytes)
        self.root = chunks.root
        self.chunk_key = chunk_key
        self.storage_chunks = storage_chunks
        self.decode = decode
        self.fill_value = fill_value
        self.keepable = keepable
        self._whole = tuple(slice(0, c) for c in storage_chunks)

    def read_box(self, box: Region, out: np.ndarray, name: str, written_before_ns: int | None = None) -> None:
        """Fill ``out`` with ``box`` of the array; ``name`` is the source's, for errors.

        A chunk file modified after ``written_before_ns`` (when the source was
        opened) raises :class:`SourceChangedError`: chunk files deep in a
        format 3 store change no metadata or directory the source stamps.
        """
        first = tuple(s.start // c for s, c in zip(box, self.storage_chunks))
        last = tuple((s.stop - 1) // c for s, c in zip(box, self.storage_chunks))
        wanted: list[tuple[str, Any, Region, Region]] = []  # (key, kept key or None, part in the chunk, where it goes)
        for grid, inside, target in storage_pieces(box, self.storage_chunks):
            key = self.chunk_key(grid)
            if self._in_part(inside):
                with self._decoding(name, key):
                    self._read_shard_part(key, inside, out[target], name, written_before_ns)
                continue
            kept_key = (self.root, key, written_before_ns)
            keeping = self.keepable and active() and on_surface(grid, first, last)
            chunk = kept(kept_key) if keeping else None
            if chunk is not None:
                out[target] = chunk[inside]
            else:
                wanted.append((key, kept_key if keeping else None, inside, target))
        # Asked for together: an object store serves a task's chunks concurrently, each decoded as it arrives.
        for position, data in self.chunks.fetch_each([key for key, *_ in wanted], name, written_before_ns):
            key, kept_key, inside, target = wanted[position]
            if data is None:
                out[target] = self.fill_value  # Zarr: a chunk never written is the fill value
                continue
            with self._decoding(name, key):
                if kept_key is not None:
                    chunk = self.decode(data, self._whole, self.fill_value)
                    keep(kept_key, chunk)
                    out[target] = chunk[inside]
                elif self.shards is not None:  # a whole shard read (a zip member, an object): decoded into place
                    self.shards.read_whole(data, inside, out[target], self.fill_value)
                elif not self.decode.into(data, out[target]):  # a place of the chunk's shape is all of it
                    out[target] = self.decode(data, inside, self.fill_value)

    def _in_part(self, inside: Region) -> bool:
        """Whether a shard's part ``inside`` is read by its index and ranges: always from a local file (one
        run of inner chunks held at a time), from an object store unless the whole shard is wanted (one GET,
        fetched with the task's other objects, rather than two)."""
        if self.shards is None or not hasattr(self.chunks, "open_shard"):
            return False
        whole = all(s.start == 0 and s.stop >= c for s, c in zip(inside, self.storage_chunks))
        return not (whole and self.chunks.whole_when_covered)  # type: ignore[union-attr]

    def _read_shard_part(
        self, key: str, inside: Region, into: np.ndarray, name: str, written_before_ns: int | None
    ) -> None:
        """Fill ``into`` with ``inside`` of the shard at ``key``: its index, then the inner chunks needed."""
        assert self.shards is not None
        with self.chunks.open_shard(key, name, written_before_ns) as shard:  # type: ignore[union-attr]
            if shard is None:
                into[...] = self.fill_value  # a shard never written
                return
            index = None if shard.identity is None else self._indexes.get(shard.identity)
            if index is None:
                index = self.shards.read_index(shard)
                if shard.identity is not None:
                    self._indexes.put(shard.identity, index)
            self.shards.read(shard, inside, into, self.fill_value, index)

    @staticmethod
    @contextlib.contextmanager
    def _decoding(name: str, key: str) -> Iterator[None]:
        """Each codec's own errors, all meaning a damaged chunk, as one error naming the chunk."""
        try:
            yield
        except DaskstreamError:
            raise
        except DECODE_ERRORS as exc:
            raise CorruptSourceError(
                f"{name}: chunk {key!r} could not be decoded ({type(exc).__name__}: {exc}); the store is "
                "damaged: re-create or re-copy it"
            ) from exc


# The most bytes of shard indexes a reader keeps (indexes read from object stores, each a request saved).
KEPT_INDEX_BYTES = 16 * 2**20
