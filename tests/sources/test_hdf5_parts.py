"""Parts of unfiltered HDF5 chunks are read alone, run by run, straight into the block where it is
contiguous; h5py is the oracle, for any box, either byte order, and chunks cut short at the edges."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskstream.sources import open_source
from daskstream.sources.hdf5 import chunks as chunk_reading
from daskstream.sources.hdf5.chunks import _runs_of

SHAPE, CHUNKS = (37, 9, 11), (16, 9, 4)


@pytest.fixture(scope="module", params=[0, chunk_reading.RUN_COST_BYTES], ids=["in-part", "by-cost"])
def run_cost(request):
    # At no cost per run every part is read alone; at the real cost these small chunks are read whole.
    kept = chunk_reading.RUN_COST_BYTES
    chunk_reading.RUN_COST_BYTES = request.param
    yield request.param
    chunk_reading.RUN_COST_BYTES = kept


@pytest.fixture(scope="module", params=["<f4", ">f8", "<i2"])
def unfiltered(request, tmp_path_factory, run_cost):
    path = tmp_path_factory.mktemp("parts") / "raw.h5"
    data = (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 977).astype(request.param)
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=data, chunks=CHUNKS)
    return open_source(f"{path}::/v"), data


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_box_reads_as_h5py_reads_it(unfiltered, data):
    source, expected = unfiltered
    box = []
    for n in SHAPE:
        start = data.draw(st.integers(0, n - 1))
        box.append(slice(start, data.draw(st.integers(start + 1, n))))
    got = source.read(tuple(box))
    np.testing.assert_array_equal(got, expected[tuple(box)])
    assert got.dtype == expected.dtype.newbyteorder("=")


def test_the_runs_of_a_part_cover_exactly_its_elements():
    chunk = (4, 3, 5)
    flat = np.arange(np.prod(chunk)).reshape(chunk)
    for inside in [
        (slice(1, 3), slice(0, 3), slice(0, 5)),  # whole rows of the trailing axes: one run
        (slice(0, 4), slice(1, 2), slice(0, 5)),  # a band of the middle axis: a run per row
        (slice(2, 3), slice(0, 3), slice(1, 4)),  # a column band: a run per row of the last axis
    ]:
        count, each, starts = _runs_of(inside, chunk)
        elements = np.concatenate([np.arange(s, s + each) for s in starts])
        assert len(elements) == count * each
        np.testing.assert_array_equal(flat.reshape(-1)[elements], flat[inside].reshape(-1))
