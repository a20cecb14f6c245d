"""clone_array: a copy of an array's graph under keys of its own, whatever its layers hold."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import GraphNode

import daskstream as ds
from daskstream.graph.layers import planned_with
from daskstream.graph.rewrites import clone_array

# What each array's graph holds beyond blockwise layers.
ARRAYS = {
    # a getitem layer of Alias nodes (whole blocks) and Task nodes (cut blocks)
    "a slice": lambda a: (da.from_array(a, chunks=(5, 4)) + 1)[3:17],
    "a slice of a slice": lambda a: da.from_array(a, chunks=(5, 4))[1:19][2:, ::2],
    "fancy indexing": lambda a: da.from_array(a, chunks=(5, 4))[[0, 7, 3, 19]],
    "a halo exchange": lambda a: da.from_array(a, chunks=(5, 4)).map_overlap(lambda b: b * 2, depth=1),
    "a reduction": lambda a: da.from_array(a, chunks=(5, 4)).sum(axis=0),
    "a rechunk": lambda a: da.from_array(a, chunks=(5, 4)).rechunk((7, 3)),
}


def keys_taken(graph):
    """Every key a task of ``graph`` takes."""
    taken = set()
    for node in graph.values():
        if isinstance(node, GraphNode):
            taken |= node.dependencies
    return taken


@pytest.mark.parametrize("make", sorted(ARRAYS))
def test_the_copy_computes_the_same_from_keys_of_its_own(make):
    a = np.arange(120.0).reshape(20, 6)
    x = ARRAYS[make](a)
    again = clone_array(x, seed=1)
    original, copied = dict(x.__dask_graph__()), dict(again.__dask_graph__())
    assert set(copied).isdisjoint(original)
    # Every key the copy's tasks take is one of the copy's: none of the original's, none missing.
    assert keys_taken(copied) <= set(copied)
    assert again.chunks == x.chunks
    assert again.dtype == x.dtype
    np.testing.assert_array_equal(again.compute(), x.compute())
    # Computed together, each reads its own blocks.
    both = dask.compute(x, again)
    np.testing.assert_array_equal(both[0], both[1])
    assert clone_array(x, seed=1).name == again.name  # the same seed names the same copy
    assert clone_array(x, seed=2).name != again.name


def test_the_copy_of_a_read_keeps_what_it_was_planned_for(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(60.0).reshape(10, 6))
    x = ds.open(tmp_path / "a.npy", memory_budget="1MiB")[2:9]
    again = clone_array(x, seed=1)
    assert planned_with(again) == planned_with(x)
    assert planned_with(again).memory_budget == 2**20
    np.testing.assert_array_equal(again.compute(), np.arange(60.0).reshape(10, 6)[2:9])


def _reads_after_rewrite(x, hold_limit=None):
    from dask.core import flatten

    from daskstream.graph.layers import needed_layers, source_read_by
    from daskstream.graph.rewrites import reread_rechunks

    graph = x.__dask_graph__()
    rewritten = reread_rechunks(graph, needed_layers(graph, list(flatten(x.__dask_keys__()))), hold_limit)
    return {
        name: (layer.collection_annotations or {}).get("chunks")
        for name, layer in rewritten.layers.items()
        if source_read_by(rewritten, layer) is not None and name in rewritten.dependencies
    }


def test_a_rechunk_is_read_in_its_chunks_unless_that_decodes_storage_chunks_again(tmp_path):
    import h5py

    path = tmp_path / "years.h5"
    values = np.arange(1095 * 3000, dtype="f4").reshape(1095, 3000)
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=values, chunks=(365, 3000), compression="gzip")  # 4.2 MiB a chunk
    x = ds.open(f"{path}::/t", chunks=(365, 3000))
    # Pieces of 73 rows cut each 365-row storage chunk five ways: read so, each would be decoded five times.
    pieces = x.rechunk((73, 3000)) + 1
    assert all(chunks == ((365, 365, 365), (3000,)) for chunks in _reads_after_rewrite(pieces).values())
    np.testing.assert_array_equal(pieces.compute(), values + 1)
    # Chunks made of whole storage chunks are read as they are.
    whole = x.rechunk((730, 3000)) + 1
    assert ((730, 365), (3000,)) in _reads_after_rewrite(whole).values()
    np.testing.assert_array_equal(whole.compute(), values + 1)
    # Under a budget a task cannot hold two storage chunks in, the pieces are read again: slower, within it.
    assert ((73,) * 15, (3000,)) in _reads_after_rewrite(pieces, hold_limit=365 * 3000 * 4).values()
    # Columns drawn from every block read (each year of a pixel's series) are read again too: kept, the
    # blocks would all wait for the last column.
    columns = x.rechunk((1095, 1000)) + 1
    assert ((1095,), (1000, 1000, 1000)) in _reads_after_rewrite(columns).values()
    np.testing.assert_array_equal(columns.compute(), values + 1)
