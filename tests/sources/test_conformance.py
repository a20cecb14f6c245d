"""Behaviour every source must share, checked against numpy / h5py / zarr as the oracle.

``SourceTests`` holds the tests; each subclass only says how to write one kind of
file. A new format or layout gets the whole suite by adding a subclass.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from typing import ClassVar

import cloudpickle
import h5py
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis.extra.numpy import basic_indices
from source_helpers import assert_same_array, bump_mtime, native_dtype

import daskstream
import daskstream as ds
from daskstream import ChunkPlan
from daskstream.errors import DaskstreamError, InvalidIndexError

SHAPE = (9, 8, 5)

# numpy-style indices a caller may pass to read(); each exercises a different branch of
# turning an index into a unit-step box plus a post-selection.
REGIONS = [
    pytest.param((), id="empty-tuple"),
    pytest.param(slice(None), id="full-slice"),
    pytest.param(slice(2, 6), id="leading-slice"),
    pytest.param((slice(1, 8), slice(2, 7), slice(1, 4)), id="inner-box"),
    pytest.param((slice(0, 100), slice(-100, 3)), id="out-of-bounds-slices"),
    pytest.param((slice(None, None, 2), slice(1, None, 3)), id="positive-steps"),
    pytest.param(slice(None, None, -1), id="reversed"),
    pytest.param((slice(7, 1, -3), slice(None), slice(None, None, -2)), id="negative-steps"),
    pytest.param((slice(-2, None), slice(1, -1)), id="negative-bounds"),
    pytest.param(3, id="int"),
    pytest.param(-1, id="negative-int"),
    pytest.param((2, slice(1, 6), 4), id="ints-around-slice"),
    pytest.param((1, 2, 3), id="all-ints"),
    pytest.param((Ellipsis, 1), id="ellipsis-first"),
    pytest.param((1, Ellipsis), id="ellipsis-last"),
    pytest.param((slice(1, 3), Ellipsis, slice(None, None, -1)), id="ellipsis-middle"),
    pytest.param(Ellipsis, id="ellipsis-alone"),
    pytest.param(slice(4, 4), id="empty-slice"),
    pytest.param((slice(None), slice(6, 2)), id="empty-by-bounds"),
    pytest.param((slice(None), slice(None), slice(3, 3, -1)), id="empty-negative-step"),
]


@dataclass
class Case:
    """One written array: where a user would point ``open_source``, and the oracle."""

    location: str
    dataset: str | None
    expected: np.ndarray

    def open(self) -> daskstream.Source:
        return daskstream.open_source(self.location, dataset=self.dataset)


class SourceTests:
    """Tests every format must pass. Subclasses set ``format`` and ``dtype`` and implement ``write``."""

    format: ClassVar[str]
    dtype: ClassVar[str] = "float64"

    def write(self, where: str, data: np.ndarray) -> tuple[str, str | None]:
        """Write ``data`` (replacing what is there) and return ``(location, dataset)``.

        ``where`` is a fresh location (a tmp directory or a ``memory://`` root); the
        same ``where`` is passed again to rewrite the array with other data.
        """
        raise NotImplementedError

    def oracle(self, location: str, dataset: str | None) -> np.ndarray:
        """What the format's own library reads back."""
        raise NotImplementedError

    @pytest.fixture
    def where(self, tmp_path) -> str:
        return str(tmp_path)

    @pytest.fixture
    def case(self, where) -> Case:
        data = np.arange(math.prod(SHAPE)).reshape(SHAPE).astype(self.dtype)
        location, dataset = self.write(where, data)
        expected = self.oracle(location, dataset)
        # The format's own library must read back what was written, or the oracle itself is wrong.
        np.testing.assert_array_equal(expected, data)
        return Case(location, dataset, expected)

    @pytest.fixture
    def source(self, case) -> daskstream.Source:
        return case.open()

    def test_format(self, source):
        assert source.format == self.format

    def test_metadata_matches_oracle(self, source, case):
        assert source.shape == case.expected.shape
        assert source.ndim == case.expected.ndim
        assert source.size == case.expected.size
        assert source.dtype == native_dtype(case.expected.dtype)
        assert source.dtype.isnative
        assert source.nbytes == case.expected.nbytes

    def test_read_all(self, source, case):
        assert_same_array(source.read(), case.expected)

    @pytest.mark.parametrize("region", REGIONS)
    def test_read_region(self, source, case, region):
        got = source.read(region)
        assert_same_array(got, np.asarray(case.expected[region]))

    @pytest.mark.parametrize("region", REGIONS)
    def test_read_returns_an_independent_array(self, source, region):
        got = source.read(region)
        assert isinstance(got, np.ndarray)
        assert got.flags.writeable
        # Nothing the result keeps alive may be a file mapping, nor more memory than the result itself.
        base = got
        while base.base is not None:
            base = base.base
            assert not isinstance(base, np.memmap)
            assert not isinstance(base, memoryview | bytes | mmap.mmap)
            if isinstance(base, np.ndarray):
                assert base.nbytes <= got.nbytes

    # Both health checks concern state between examples: the fixture is only read, and every
    # subclass runs the inherited test on its own instance by design.
    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(region=basic_indices(SHAPE, allow_ellipsis=True, allow_newaxis=False))
    def test_read_matches_numpy_for_any_basic_index(self, source, case, region):
        # The brute-force oracle: numpy indexing the whole array.
        assert_same_array(source.read(region), np.asarray(case.expected[region]))

    @pytest.mark.parametrize(
        ("region", "error"),
        [
            pytest.param(9, InvalidIndexError, id="int-past-end"),
            pytest.param((0, -9), InvalidIndexError, id="negative-int-past-start"),
            pytest.param((0, 0, 0, 0), InvalidIndexError, id="too-many-indices"),
            pytest.param(([0, 2],), InvalidIndexError, id="fancy-index"),
            pytest.param((None,), InvalidIndexError, id="newaxis"),
            pytest.param((True,), InvalidIndexError, id="bool"),
        ],
    )
    def test_bad_index_is_refused(self, source, region, error):
        # Like numpy, a bad index is an IndexError; and it is one of ours.
        with pytest.raises(error) as info:
            source.read(region)
        assert isinstance(info.value, IndexError)
        assert isinstance(info.value, DaskstreamError)

    def test_getitem_is_read(self, source, case):
        assert_same_array(source[...], case.expected)
        assert_same_array(source[1:3, ::-2], case.expected[1:3, ::-2])

    def test_cloudpickle_round_trip(self, source, case):
        payload = cloudpickle.dumps(source)
        assert len(payload) < 64 * 1024
        clone = cloudpickle.loads(payload)
        assert clone.token == source.token
        assert clone.shape == source.shape
        assert clone.dtype == source.dtype
        assert_same_array(clone.read(), case.expected)
        assert_same_array(clone.read((slice(1, 4), 2)), case.expected[1:4, 2])

    def test_token_stable_when_reopened(self, source, case):
        assert source.token == case.open().token
        assert isinstance(source.token, str)
        assert source.token.startswith(f"{self.format}-")

    def test_token_changes_when_rewritten(self, source, case, where):
        source.read()  # any handle the read caches must not hide the new data
        location, dataset = self.write(where, np.flip(case.expected).copy())
        assert (location, dataset) == (case.location, case.dataset)
        if "://" not in location:
            bump_mtime(location)
        reopened = case.open()
        assert reopened.token != source.token
        assert_same_array(reopened.read(), np.flip(case.expected))

    def test_plan_covers_shape(self, source):
        plan = ds.plan(source)
        assert isinstance(plan, ChunkPlan)
        assert plan.shape == source.shape
        assert len(plan.dask_chunks) == source.ndim
        assert tuple(sum(axis) for axis in plan.dask_chunks) == source.shape
        assert all(n > 0 for axis in plan.dask_chunks for n in axis)

    def test_open_computes_to_oracle(self, source, case):
        array = daskstream.open(source)
        assert array.shape == case.expected.shape
        assert array.dtype == native_dtype(case.expected.dtype)
        assert_same_array(array.compute(), case.expected)

    def test_open_is_deterministic(self, case):
        assert daskstream.open(case.location, dataset=case.dataset).name == daskstream.open(case.open()).name

    def test_repr_names_the_source(self, source):
        assert source.path in repr(source)
        assert str(source.shape) in repr(source)


def replace_file(path: str, write) -> None:
    """Write a new file next to ``path`` and rename it over ``path``.

    This is how a careful writer replaces a file that readers may hold open: a
    process with a cached HDF5 handle keeps the old inode, and HDF5 refuses to
    truncate a file it has open.
    """
    tmp = path + ".new"
    write(tmp)
    os.replace(tmp, path)


# --- .npy -------------------------------------------------------------------------------


class NpyTests(SourceTests):
    format = "npy"

    def oracle(self, location, dataset):
        return np.load(location)


class TestNpyC(NpyTests):
    def write(self, where, data):
        path = os.path.join(where, "a.npy")
        np.save(path, np.ascontiguousarray(data))
        return path, None


class TestNpyF(NpyTests):
    dtype = "int16"

    def write(self, where, data):
        path = os.path.join(where, "a.npy")
        np.save(path, np.asfortranarray(data))
        return path, None

    def test_file_is_fortran_ordered(self, source):
        assert source.layout == "F"
        assert source.fortran_order


class TestNpyBigEndian(NpyTests):
    dtype = ">i4"

    def write(self, where, data):
        path = os.path.join(where, "a.npy")
        np.save(path, data.astype(">i4"))
        return path, None

    def test_oracle_is_big_endian(self, case):
        assert case.expected.dtype.byteorder == ">"


# --- HDF5 -------------------------------------------------------------------------------


class Hdf5Tests(SourceTests):
    format = "hdf5"
    dataset_path = "/entry/data"

    def create(self, f: h5py.File, data: np.ndarray) -> None:
        raise NotImplementedError

    def write(self, where, data):
        path = os.path.join(where, "a.h5")

        def write_h5(target):
            with h5py.File(target, "w") as f:
                f.create_group("entry")
                self.create(f, data)
                f["other"] = np.zeros(3)  # a second dataset, so the name is needed

        replace_file(path, write_h5)
        return path, self.dataset_path

    def oracle(self, location, dataset):
        with h5py.File(location, "r") as f:
            return f[dataset][()]


class TestHdf5Contiguous(Hdf5Tests):
    dtype = "float32"

    def create(self, f, data):
        f.create_dataset(self.dataset_path, data=data)

    def test_layout(self, source):
        assert source.storage_chunks is None
        assert source.storage_kind == "contiguous"


class TestHdf5Chunked(Hdf5Tests):
    dtype = "int64"

    def create(self, f, data):
        f.create_dataset(self.dataset_path, data=data, chunks=(4, 3, 5), compression="gzip", shuffle=True)

    def test_layout(self, source):
        assert source.storage_chunks == (4, 3, 5)
        assert source.layout == "chunked"


class TestHdf5Compact(Hdf5Tests):
    dtype = "uint16"

    def create(self, f, data):
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple(data.shape)
        dsid = h5py.h5d.create(f["entry"].id, b"data", h5py.h5t.py_create(data.dtype), space, dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(data))

    def test_layout(self, source):
        assert source.storage_kind == "compact"


# --- Zarr -------------------------------------------------------------------------------


class ZarrTests(SourceTests):
    format = "zarr"
    create_kwargs: ClassVar[dict] = {}

    def store_path(self, where: str) -> str:
        return os.path.join(where, "a.zarr")

    def write(self, where, data):
        path = self.store_path(where)
        zarr.create_array(path, data=data, overwrite=True, **self.create_kwargs)
        return path, None

    def oracle(self, location, dataset):
        return zarr.open_array(location, path=dataset or "", mode="r")[...]


class TestZarrV2(ZarrTests):
    dtype = "int32"
    create_kwargs: ClassVar[dict] = {"zarr_format": 2, "chunks": (4, 3, 2)}


class TestZarrV3(ZarrTests):
    create_kwargs: ClassVar[dict] = {"chunks": (4, 3, 2)}


class TestZarrV3Sharded(ZarrTests):
    dtype = "uint8"
    create_kwargs: ClassVar[dict] = {"chunks": (2, 3, 5), "shards": (4, 6, 5)}

    def test_tasks_are_planned_in_inner_chunks_of_shards_read_in_part(self, source):
        assert source.storage_chunks == source.inner_chunks == (2, 3, 5)
        assert source.shard_chunks == (4, 6, 5)


class TestZarrZip(ZarrTests):
    dtype = "float32"

    def write(self, where, data):
        path = os.path.join(where, "a.zarr.zip")

        def write_zip(target):
            store = zarr.storage.ZipStore(target, mode="w")
            try:
                zarr.create_array(store, data=data, chunks=(5, 4, 5))
            finally:
                store.close()

        replace_file(path, write_zip)
        return path, None

    def oracle(self, location, dataset):
        store = zarr.storage.ZipStore(location, mode="r")
        try:
            return zarr.open_array(store, mode="r")[...]
        finally:
            store.close()


class TestZarrInGroup(ZarrTests):
    dtype = "int16"

    def write(self, where, data):
        path = self.store_path(where)
        root = zarr.open_group(path, mode="w")
        root.create_group("outer").create_group("inner").create_array("values", data=data, chunks=(3, 3, 3))
        root.create_array("sibling", data=np.zeros(4))
        return path, "outer/inner/values"


class TestZarrFsspecMemory(ZarrTests):
    create_kwargs: ClassVar[dict] = {"chunks": (5, 5, 5)}

    @pytest.fixture
    def where(self, memory_url) -> str:
        return memory_url

    def store_path(self, where):
        return f"{where}/a.zarr"

    def write(self, where, data):
        url = self.store_path(where)
        store = zarr.storage.FsspecStore.from_url(url, read_only=False)
        zarr.create_array(store, data=data, overwrite=True, **self.create_kwargs)
        return url, None

    def oracle(self, location, dataset):
        return zarr.open_array(zarr.storage.FsspecStore.from_url(location, read_only=True), mode="r")[...]
