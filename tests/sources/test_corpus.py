"""Every array of zarr-python 2's format fixture, read through daskstream and through zarr itself.

The fixture (see ``shared/corpus/README.md``) was written by another implementation:
compressors, orders, ragged chunks, dtypes and key layouts nobody on this project chose.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import zarr

import daskstream
from daskstream.errors import DaskstreamError, MemberNotFoundError

FIXTURE = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "zarr-v2-fixture"

if not FIXTURE.is_dir():
    pytest.skip(f"the zarr v2 fixture is not at {FIXTURE}", allow_module_level=True)

# Each array is a directory holding .zarray; open them one by one, never the whole group, so
# one unreadable array cannot disturb the others.
ARRAYS = sorted(p.parent.relative_to(FIXTURE).as_posix() for p in FIXTURE.rglob(".zarray"))


@functools.cache
def zarr_reads(member: str) -> np.ndarray | BaseException:
    """What zarr-python reads for ``member``, or the exception it raises (read once per run)."""
    try:
        return zarr.open_array(str(FIXTURE / member), mode="r")[...]
    except Exception as exc:  # the oracle's failure is data here, compared below
        return exc


def assert_exactly(got: np.ndarray, expected: np.ndarray) -> None:
    # Byte equality: NaNs in the float arrays compare equal to themselves, and -0.0 differs from 0.0.
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()


def test_fixture_is_complete():
    # 24 arrays x 7 compressors, plus flat, flat_legacy, meta, nested and nested_legacy.
    assert len(ARRAYS) == 173


@pytest.mark.parametrize("member", ARRAYS)
def test_array(member):
    expected = zarr_reads(member)
    path = str(FIXTURE / member)
    if isinstance(expected, BaseException):
        with pytest.raises(DaskstreamError) as info:
            daskstream.open_source(path)
        assert path in str(info.value)
        return
    source = daskstream.open_source(path)
    assert source.shape == expected.shape
    assert_exactly(source.read(), expected)
    assert_exactly(daskstream.open(path).compute(), expected)


@pytest.mark.parametrize("member", [m for m in ARRAYS if "/" in m])
def test_array_by_dataset(member):
    # The same arrays named from the fixture's root group, as a user with the whole store would.
    expected = zarr_reads(member)
    if isinstance(expected, BaseException):
        with pytest.raises(DaskstreamError):
            daskstream.open_source(FIXTURE, dataset=member)
        return
    source = daskstream.open_source(FIXTURE, dataset=member)
    assert source.dataset == member
    assert_exactly(source.read(), expected)
    if expected.ndim:
        assert_exactly(source.read(slice(None, None, -3)), expected[::-3])


def test_root_group_lists_its_arrays():
    with pytest.raises(MemberNotFoundError) as info:
        daskstream.open_source(FIXTURE)
    assert "0/0" in str(info.value)


def test_unreadable_arrays_are_the_known_ones():
    # The README names the |S1 and <U4 arrays as the ones zarr 3 cannot open; if that set changes,
    # the test above may be passing vacuously.
    failing = {m.split("/")[0] for m in ARRAYS if isinstance(zarr_reads(m), BaseException)}
    assert failing == {"14", "15"}
