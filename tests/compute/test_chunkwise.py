"""Reductions over local chunked sources read each block a piece of its storage chunks at a time.

Each piece is decoded, taken through the element-wise steps and reduced while
it is in the cache: no block is assembled. Where a step takes the blocks whole,
or the source has no storage chunks, blocks are read whole as before. numpy is
the oracle for every answer.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import tracemalloc

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from span_helpers import Reads

import daskstream as ds
from daskstream.compute.streaming.chunkwise import MIN_PIECE_BYTES
from daskstream.errors import ChunkSplitWarning
from daskstream.sources.hdf5.source import Hdf5Source
from daskstream.sources.npy import NpySource
from daskstream.sources.zarr.source import ZarrSource

#: Blocks of 6,000 rows (5.5 MiB), each many of the field's storage chunks (20 rows, 19 KiB).
BLOCKS = (6000, 40, 6)
#: The rows a piece holds: storage chunks of 20 rows grown to a mebibyte.
PIECE_ROWS = 20 * -(-MIN_PIECE_BYTES // (20 * 40 * 6 * 4))
SOURCES = {"zarr": ZarrSource, "hdf5": Hdf5Source}

REDUCTIONS = {
    "sum": lambda x: x.sum(axis=0, dtype="f8"),
    "nanmean of a product": lambda x: da.nanmean(x * 2 - 1, axis=(0, 2)),
    "std": lambda x: da.nanstd(x),
    "max of a slice": lambda x: da.nanmax(x[100:23_000:3, 5], axis=0),
    "argmin of a transpose": lambda x: da.nanargmin(x.transpose(2, 1, 0), axis=2),
}


COUNTING = {
    "histogram": (
        lambda x: ds.reduce(x, "histogram", bins=12, range=(-4, 4))[0],
        lambda d: np.histogram(d[~np.isnan(d)], bins=12, range=(-4, 4))[0],
    ),
    "dask's histogram": (
        lambda x: da.histogram(x, bins=12, range=(-4, 4))[0],
        lambda d: np.histogram(d, bins=12, range=(-4, 4))[0],
    ),
}


def _numpy(name, data):
    return REDUCTIONS[name].__call__(da.from_array(data, chunks=BLOCKS)).compute(optimize_graph=False)


@pytest.mark.parametrize("kind", sorted(SOURCES))
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_a_reduction_reads_its_blocks_a_piece_at_a_time_and_equals_numpy(span_field, monkeypatch, kind, name):
    data, paths = span_field
    reads = Reads(monkeypatch, SOURCES[kind])
    x = ds.open(paths[kind], chunks=BLOCKS)
    result = REDUCTIONS[name](x).compute(scheduler="synchronous")
    np.testing.assert_allclose(result, _numpy(name, data), rtol=1e-5, atol=1e-6)
    # Every read is a piece within one block, of at most PIECE_ROWS rows; every row read once.
    assert reads.regions
    assert all(stop - start <= PIECE_ROWS for (start, stop), *_ in reads.regions)
    assert all(start // BLOCKS[0] == (stop - 1) // BLOCKS[0] for (start, stop), *_ in reads.regions)
    assert sum(reads.sizes) <= data.nbytes


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_reductions_computed_together_read_each_piece_once_for_all(span_field, monkeypatch, kind):
    # The planner computes a mean's and a std's first steps in one task per block; in pieces, each piece is read
    # once and folded into both.
    data, paths = span_field
    reads = Reads(monkeypatch, SOURCES[kind])
    x = ds.open(paths[kind], chunks=BLOCKS)
    mean, std, total = dask.compute(
        da.nanmean(x, axis=0), da.nanstd(x, axis=0), da.nansum(x, dtype="f8"), scheduler="synchronous"
    )
    np.testing.assert_allclose(mean, np.nanmean(data.astype("f8"), axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, np.nanstd(data.astype("f8"), axis=0), rtol=1e-5)
    np.testing.assert_allclose(total, np.nansum(data, dtype="f8"), rtol=1e-9)
    assert all(stop - start <= PIECE_ROWS for (start, stop), *_ in reads.regions)
    assert sum(reads.sizes) == data.nbytes


@pytest.mark.parametrize("name", sorted(COUNTING))
def test_counts_read_a_piece_at_a_time_in_each_pass_and_equal_numpy(span_field, monkeypatch, name):
    data, paths = span_field
    clean = np.nan_to_num(data, nan=0.5)
    counted, expected = COUNTING[name]
    reads = Reads(monkeypatch, ZarrSource)
    x = ds.open(paths["zarr"], chunks=BLOCKS)
    result = counted(da.where(da.isnan(x), 0.5, x)).compute(scheduler="synchronous")
    np.testing.assert_array_equal(result, expected(clean))
    assert reads.regions
    assert all(stop - start <= PIECE_ROWS for (start, stop), *_ in reads.regions)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_with_chunkwise_off_each_block_is_read_whole_and_the_answer_is_the_same(span_field, monkeypatch, kind):
    data, paths = span_field
    reads = Reads(monkeypatch, SOURCES[kind])
    x = ds.open(paths[kind], chunks=BLOCKS)
    with dask.config.set({"daskstream.compute.chunkwise": False}):
        result = da.nanmean(x, axis=0).compute(scheduler="synchronous")
    np.testing.assert_allclose(result, np.nanmean(data, axis=0), rtol=1e-5, atol=1e-6)
    assert sorted(stop - start for (start, stop), *_ in reads.regions) == [6_000] * 4


def test_a_task_holds_a_piece_not_its_block(span_field):
    # The memory a reduction's task allocates: a block of 5.5 MiB read whole, a mebibyte's piece streamed.
    _, paths = span_field
    x = ds.open(paths["zarr"], chunks=BLOCKS)
    peaks = {}
    for chunkwise in (False, True):
        total = x.sum(axis=(1, 2), dtype="f8")
        with dask.config.set({"daskstream.compute.chunkwise": chunkwise}):
            total.compute(scheduler="synchronous")  # warm: handles opened, readers made
            tracemalloc.start()
            try:
                total.compute(scheduler="synchronous")
                peaks[chunkwise] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    block = 6000 * 40 * 6 * 4
    assert peaks[False] >= block
    assert peaks[True] < block / 2


# A variance computed once to warm, then again: the page faults of the second, in a process of its own (the
# allocator's state is the process's). Blocks as the second argument says: "storage", or rows per block.
FAULTS = textwrap.dedent(
    """
    import resource, sys
    import dask, dask.array as da
    import daskstream as ds

    x = ds.open(sys.argv[1])
    x = ds.open(sys.argv[1], chunks=sys.argv[2] if sys.argv[2] == "storage" else (int(sys.argv[2]),) + x.shape[1:])
    std = da.nanstd(x)
    std.compute(scheduler="synchronous")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    std.compute(scheduler="synchronous")
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


GLIBC = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")


def _faults(path, blocks, top_pad):
    # Nothing else tuning the allocator: daskstream leaves alone an allocator the environment tunes.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DASK_DASKSTREAM__COMPUTE__MALLOC", "MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD"))
    }
    env["DASK_DASKSTREAM__COMPUTE__MALLOC_TOP_PAD"] = top_pad
    run = subprocess.run(
        [sys.executable, "-c", FAULTS, path, str(blocks)], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


@GLIBC
def test_a_pieces_memory_is_reused_by_the_next_not_faulted_in_again(span_field):
    """The pages a piece (1 MiB) and its temporaries (float64 copies and powers, 2 MiB each) freed serve the
    next piece: a second variance faults in fewer pages than one piece holds, where, the allocator left alone,
    every piece's are given back and faulted in."""
    _, paths = span_field
    pieces = -(-24_000 // PIECE_ROWS)
    piece_pages = PIECE_ROWS * 40 * 6 * 4 // 4096
    assert _faults(paths["zarr"], BLOCKS[0], "16MiB") < piece_pages
    assert _faults(paths["zarr"], BLOCKS[0], "none") > pieces * piece_pages  # what the setting spares


@GLIBC
def test_blocks_of_one_storage_chunk_reuse_the_memory_of_the_last(tmp_path):
    """Read whole, blocks of a 1 MiB storage chunk each fault the same way: the first read of a source in a
    process sets the allocator, whatever reads it."""
    data = np.random.default_rng(3).standard_normal((8 * 1024, 256)).astype("f4")
    zarr.create_array(tmp_path / "a.zarr", data=data, chunks=(1024, 256))
    block_pages = 1024 * 256 * 4 // 4096
    assert _faults(str(tmp_path / "a.zarr"), "storage", "16MiB") < block_pages
    assert _faults(str(tmp_path / "a.zarr"), "storage", "none") > 8 * block_pages


@pytest.mark.parametrize(
    "computation",
    [
        # A function of dask's map_blocks may do anything with its block: not known to stream.
        pytest.param(lambda x: x.map_blocks(lambda block: block[::-1] * 2).sum(axis=0), id="map_blocks"),
        pytest.param(lambda x: x + 1, id="the-result-itself"),
    ],
)
def test_a_step_taking_blocks_whole_reads_them_whole(span_field, monkeypatch, computation):
    data, paths = span_field
    reads = Reads(monkeypatch, ZarrSource)
    x = ds.open(paths["zarr"], chunks=BLOCKS)
    result = computation(x).compute(scheduler="synchronous")
    expected = computation(da.from_array(data, chunks=BLOCKS)).compute()
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    assert sorted(stop - start for (start, stop), *_ in reads.regions) == [6_000] * 4


def test_a_source_stored_without_chunks_is_read_in_its_blocks(span_field, monkeypatch):
    data, paths = span_field
    reads = Reads(monkeypatch, NpySource)
    x = ds.open(paths["npy"], chunks=BLOCKS)
    np.testing.assert_allclose(x.sum(dtype="f8").compute(scheduler="synchronous"), np.sum(data, dtype="f8"))
    assert sorted(stop - start for (start, stop), *_ in reads.regions) == [6_000] * 4


def test_blocks_not_beginning_on_storage_chunks_are_read_whole(span_field, monkeypatch):
    data, paths = span_field
    reads = Reads(monkeypatch, ZarrSource)
    with pytest.warns(ChunkSplitWarning):
        x = ds.open(paths["zarr"], chunks=(6010, 40, 6))
    np.testing.assert_allclose(x.sum(dtype="f8").compute(scheduler="synchronous"), np.sum(data, dtype="f8"))
    assert max(stop - start for (start, stop), *_ in reads.regions) == 6010


def test_the_plan_says_which_sources_are_read_in_pieces_and_how_large(span_field):
    _, paths = span_field
    x = ds.open(paths["zarr"], chunks=BLOCKS)
    plan = ds.plan_compute(da.nanmean(x * 2, axis=0))
    assert plan.pieces == {paths["zarr"]: PIECE_ROWS * 40 * 6 * 4}
    assert f"Read in pieces: {paths['zarr']}, each block 1.01 MiB of storage chunks at a time" in plan.explain()
    # Blocks of one storage chunk each, taken whole by a step not known to stream, or with chunkwise off:
    # nothing said.
    assert ds.plan_compute(ds.open(paths["zarr"], chunks="storage")[:2000].sum()).pieces == {}
    assert ds.plan_compute(x.map_blocks(lambda block: block[::-1]).sum()).pieces == {}
    with dask.config.set({"daskstream.compute.chunkwise": False}):
        assert "Read in pieces" not in ds.plan_compute(da.nanmean(x, axis=0)).explain()
