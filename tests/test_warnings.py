"""daskstream's warnings point at the line of the user's code that caused them, not into daskstream."""

from __future__ import annotations

import warnings

import h5py
import numpy as np
import pytest

import daskstream as ds
from daskstream.errors import ChunkSplitWarning, DaskstreamWarning, PackedDataWarning


@pytest.fixture
def chunked(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((100, 100), "f4"), chunks=(50, 50))
        packed = f.create_dataset("packed", data=np.zeros((10, 10), "i2"), chunks=(5, 10))
        packed.attrs["scale_factor"] = 0.01
    return path


def said(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, DaskstreamWarning)]


@pytest.mark.parametrize(
    ("how", "category"),
    [
        (lambda p: ds.open(f"{p}::x", chunks=(30, 30)), ChunkSplitWarning),
        (lambda p: ds.open([f"{p}::x", f"{p}::x"], chunks=(30, 30)), ChunkSplitWarning),
        (lambda p: ds.open(f"{p}::packed"), PackedDataWarning),
        (lambda p: ds.open([f"{p}::packed", f"{p}::packed"]), PackedDataWarning),
    ],
    ids=["split", "split, many files", "packed", "packed, many files"],
)
def test_a_warning_points_at_the_users_line(chunked, how, category):
    caught = said(lambda: how(chunked))
    assert [w.category for w in caught] == [category] * len(caught)
    assert caught
    for warning in caught:
        assert warning.filename == __file__, warning.filename
