"""Kernels on blocks with halos, checked against numpy and scipy over the whole array in memory."""

from __future__ import annotations

import itertools
import math
import multiprocessing
import threading
import weakref
from concurrent.futures import ProcessPoolExecutor

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.compute.blockwise import map_blocks
from daskstream.compute.kernels import astype, clip, gaussian_filter, moving_mean, standardize
from daskstream.errors import InvalidArgumentError, InvalidAxisError, KernelError, KernelShapeError

ndimage = pytest.importorskip("scipy.ndimage")

# What numpy's pad calls each of dask's boundary modes.
NUMPY_PAD_MODE = {"reflect": "symmetric", "nearest": "edge", "periodic": "wrap"}


# --- Oracles and kernels -------------------------------------------------------------------------


def pad_like_boundary(a, widths, boundary):
    """``a`` padded in memory the way ``boundary`` pads the array's edges for a halo."""
    pad_width = [(w, w) for w in widths]
    if boundary in NUMPY_PAD_MODE:
        return np.pad(a, pad_width, mode=NUMPY_PAD_MODE[boundary])
    value = 0 if boundary == "constant" else boundary
    return np.pad(a, pad_width, mode="constant", constant_values=value)


def box_mean_valid(padded, radius):
    """Mean over a box of ``2r + 1`` cells per axis, for each cell whose box lies inside ``padded``."""
    core = tuple(max(n - 2 * r, 0) for n, r in zip(padded.shape, radius))
    total = np.zeros(core)
    for offset in itertools.product(*(range(2 * r + 1) for r in radius)):
        total += padded[tuple(slice(o, o + n) for o, n in zip(offset, core))]
    return total / math.prod(2 * r + 1 for r in radius)


def box_mean(block, radius):
    """The box mean as a kernel: cells nearer the block's edge than ``radius`` keep their value."""
    out = block.astype(np.float64)
    inner = tuple(slice(r, max(n - r, r)) for n, r in zip(block.shape, radius))
    out[inner] = box_mean_valid(block, radius)
    return out


def cross_sum_valid(padded, reach):
    """Each cell plus its neighbours up to ``reach`` cells away along each axis (a cross, not a box)."""
    core = tuple(max(n - 2 * r, 0) for n, r in zip(padded.shape, reach))
    centre = [slice(r, r + n) for r, n in zip(reach, core)]
    total = padded[tuple(centre)].copy()
    for axis, r in enumerate(reach):
        for shift in [*range(-r, 0), *range(1, r + 1)]:
            window = list(centre)
            window[axis] = slice(r + shift, r + shift + core[axis])
            total += padded[tuple(window)]
    return total


def cross_sum(block, reach):
    out = block.copy()
    inner = tuple(slice(r, max(n - r, r)) for n, r in zip(block.shape, reach))
    out[inner] = cross_sum_valid(block, reach)
    return out


def three_point_sum(block):
    out = block.copy()
    out[1:-1] = block[:-2] + block[1:-1] + block[2:]
    return out


def fail_on_block_1_1(block, block_info=None):
    if tuple(block_info[0]["chunk-location"]) == (1, 1):
        raise ValueError("negative counts in this block")
    return block


class TrackedArray:
    """An array-like that counts its reads and how many blocks it handed out are alive at once."""

    def __init__(self, data):
        self.data = data
        self.shape, self.dtype, self.ndim = data.shape, data.dtype, data.ndim
        self.reads = self.alive = self.peak_alive = 0
        self._lock = threading.Lock()

    def __getitem__(self, region):
        block = self.data[region].copy()
        with self._lock:
            self.reads += 1
            self.alive += 1
            self.peak_alive = max(self.peak_alive, self.alive)
        weakref.finalize(block, self._released)
        return block

    def _released(self):
        with self._lock:
            self.alive -= 1

    def as_dask(self, chunks):
        return da.from_array(self, chunks=chunks, asarray=False, lock=False, fancy=False, meta=self.data[:0])


@pytest.fixture
def rng():
    return np.random.default_rng(20260806)


# --- Stencils against the array padded in memory ------------------------------------------------

# (shape, ragged chunks, depth as the user writes it, the same depth per axis)
STENCIL_CASES = [
    pytest.param((23,), ((5, 7, 4, 7),), 2, (2,), id="1d-int-depth"),
    pytest.param((17, 13), ((4, 6, 7), (5, 5, 3)), 1, (1, 1), id="2d-3x3"),
    pytest.param((17, 13), ((4, 6, 7), (5, 5, 3)), (2, 1), (2, 1), id="2d-tuple-depth"),
    # Chunks of 1 cell, thinner than the halo: dask merges them first.
    pytest.param((11, 6), ((1, 1, 4, 5), (3, 3)), (2, 2), (2, 2), id="2d-chunks-thinner-than-halo"),
    # A negative axis in the dict, and an axis left out (no halo along it).
    pytest.param((9, 8, 7), ((4, 5), (3, 3, 2), (2, 5)), {0: 1, -1: 2}, (1, 0, 2), id="3d-dict-depth"),
    # The halo as wide as the array, on a single chunk.
    pytest.param((4, 10), ((4,), (6, 4)), (4, 1), (4, 1), id="2d-halo-as-wide-as-array"),
]
PADDED_BOUNDARIES = ["reflect", "nearest", "periodic", "constant", 2.5]


@pytest.mark.parametrize("boundary", PADDED_BOUNDARIES)
@pytest.mark.parametrize(("shape", "chunks", "depth", "radius"), STENCIL_CASES)
def test_box_mean_equals_in_memory_stencil_over_padded_array(rng, shape, chunks, depth, radius, boundary):
    a = rng.standard_normal(shape)
    x = da.from_array(a, chunks=chunks)
    result = map_blocks(box_mean, x, depth=depth, boundary=boundary, radius=radius)
    assert result.shape == a.shape
    assert result.chunks == x.chunks or shape == (11, 6)  # only thinner-than-halo chunks are merged
    expected = box_mean_valid(pad_like_boundary(a, radius, boundary), radius)
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize(("shape", "chunks", "depth", "radius"), STENCIL_CASES)
def test_boundary_none_lets_the_kernel_see_the_array_edge(rng, shape, chunks, depth, radius):
    # dask's "none": no halo beyond the array's edges, so an edge block ends where the array does and
    # the kernel treats it as it treats the whole array; the result is the kernel over the whole array.
    a = rng.standard_normal(shape)
    result = map_blocks(box_mean, da.from_array(a, chunks=chunks), depth=depth, boundary="none", radius=radius)
    got = result.compute()
    np.testing.assert_allclose(got, box_mean(a, radius), rtol=1e-13, atol=0)
    # Away from the edges every mode agrees.
    interior = tuple(slice(r, n - r) for n, r in zip(shape, radius))
    padded_answer = box_mean_valid(pad_like_boundary(a, radius, "reflect"), radius)
    np.testing.assert_allclose(got[interior], padded_answer[interior], rtol=1e-13, atol=0)


def test_constant_boundary_name_means_zeros(rng):
    a = rng.standard_normal((12, 9)) + 10  # far from 0, so a zero halo shows at the edges
    x = da.from_array(a, chunks=(5, 4))
    by_name = map_blocks(box_mean, x, depth=1, boundary="constant", radius=(1, 1)).compute()
    by_value = map_blocks(box_mean, x, depth=1, boundary=0, radius=(1, 1)).compute()
    np.testing.assert_array_equal(by_name, by_value)
    assert by_name[0, 0] < 6  # four of its nine cells are zeros


@st.composite
def partitions(draw, n):
    """Ragged chunk lengths summing to ``n``."""
    cuts = draw(st.sets(st.integers(1, n - 1), max_size=4)) if n > 1 else set()
    bounds = [0, *sorted(cuts), n]
    return tuple(stop - start for start, stop in itertools.pairwise(bounds))


@st.composite
def halo_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    chunks = tuple(draw(partitions(n)) for n in shape)
    depth = tuple(draw(st.integers(0, n)) for n in shape)
    # The stencil reaches at most as far as the halo; a wider halo must be trimmed away unseen.
    reach = tuple(draw(st.integers(0, min(d, 1))) for d in depth)
    boundary = draw(st.sampled_from(["reflect", "nearest", "periodic", "constant", "none", -3]))
    spelled = draw(st.sampled_from(["tuple", "dict"]))
    depth_arg = depth if spelled == "tuple" else {axis - ndim: d for axis, d in enumerate(depth) if d}
    return shape, chunks, depth_arg, reach, boundary


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(halo_cases(), st.randoms(use_true_random=False))
def test_three_point_sum_along_each_axis_matches_numpy_oracle(case, random):
    shape, chunks, depth, reach, boundary = case
    a = np.array([random.randint(-50, 50) for _ in range(math.prod(shape))], dtype=np.int64).reshape(shape)
    result = map_blocks(cross_sum, da.from_array(a, chunks=chunks), depth=depth, boundary=boundary, reach=reach)
    if boundary == "none":
        expected = cross_sum(a, reach)
    else:
        expected = cross_sum_valid(pad_like_boundary(a, reach, boundary), reach)
    got = result.compute()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


# --- Output dtype ---------------------------------------------------------------------------------


def test_declared_dtype_is_the_arrays_and_the_blocks():
    x = da.arange(10, chunks=4, dtype="int16")
    halves = map_blocks(lambda b: b * 0.5, x, dtype="float32")  # the kernel itself returns float64
    assert halves.dtype == np.float32
    got = halves.compute()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.arange(10, dtype="float32") * 0.5)


@pytest.mark.parametrize(
    ("dtype", "fn"),
    [
        # An integer stencil keeps int16: never widened to float64 on the way.
        ("int16", three_point_sum),
        ("int16", lambda b: b - 1),
        ("float32", lambda b: b * 2.0),
        ("uint8", lambda b: b // 2),
        # A kernel that does widen is reported as widening.
        ("float32", lambda b: b.astype(np.float64)),
    ],
    ids=["int16-stencil", "int16-subtract", "float32-scale", "uint8-halve", "float32-to-float64"],
)
def test_inferred_dtype_is_what_the_kernel_returns(dtype, fn):
    a = np.arange(24).reshape(4, 6).astype(dtype)
    result = map_blocks(fn, da.from_array(a, chunks=(3, 4)), depth=1)
    expected_dtype = fn(a[:2, :2]).dtype
    assert result.dtype == expected_dtype
    got = result.compute()
    assert got.dtype == expected_dtype


def test_inferring_the_dtype_reads_nothing():
    source = TrackedArray(np.arange(60.0).reshape(6, 10))
    x = source.as_dask((2, 5))
    lazy = [
        map_blocks(three_point_sum, x, depth=1),
        moving_mean(x, 3, axis=1),
        gaussian_filter(x, 1.0),
        standardize(x),
        clip(x, 1, 5),
    ]
    assert source.reads == 0
    dask.compute(*lazy)
    assert source.reads > 0


def test_dtype_inference_failure_asks_for_dtype():
    def add_row_block_index(block, block_info):  # needs block_info, which the sample call cannot give
        return block + block_info[0]["chunk-location"][0]

    x = da.zeros((6, 4), dtype="int32", chunks=(2, 4))
    with pytest.raises(InvalidArgumentError, match=r"add_row_block_index.*pass dtype=") as info:
        map_blocks(add_row_block_index, x)
    assert isinstance(info.value.__cause__, TypeError)
    result = map_blocks(add_row_block_index, x, dtype="int32")
    np.testing.assert_array_equal(result.compute()[:, 0], [0, 0, 1, 1, 2, 2])


# --- Inputs with different chunks ----------------------------------------------------------------


def test_arrays_with_different_chunks_are_aligned_on_the_first_arrays_grid(rng):
    a, b, c = (rng.standard_normal((60, 40)) for _ in range(3))
    x = da.from_array(a, chunks=(7, 5))
    y = da.from_array(b, chunks=(4, 9))
    z = da.from_array(c, chunks=(60, 40))
    with dask.config.set({"daskstream.memory-budget": "1GiB"}):
        result = map_blocks(lambda p, q, r: p * q - r, x, y, z)
        plan = ds.plan_chunks(a.shape, a.dtype, storage_chunks=(7, 5), layout="chunked")
    assert result.chunks == plan.dask_chunks
    # The first array's chunks are merged, never split: every boundary of its grid stays one.
    for planned, first in zip(result.chunks, x.chunks):
        assert set(np.cumsum(planned)) <= set(np.cumsum(first))
    np.testing.assert_allclose(result.compute(), a * b - c, rtol=1e-15)


def test_aligned_arrays_with_a_halo(rng):
    a, b = rng.standard_normal((30, 17)), rng.standard_normal((30, 17))
    x = da.from_array(a, chunks=((3, 10, 17), (17,)))  # irregular: planned as contiguous slabs
    y = da.from_array(b, chunks=(8, 5))
    result = map_blocks(lambda p, q: box_mean(p * q, (1, 1)), x, y, depth=1, boundary="periodic")
    expected = box_mean_valid(pad_like_boundary(a * b, (1, 1), "periodic"), (1, 1))
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-13)


def test_numpy_arrays_are_accepted_beside_dask_arrays(rng):
    a, mask = rng.standard_normal((20, 10)), rng.random((20, 10)) > 0.5
    result = map_blocks(np.where, da.from_array(mask, chunks=(6, 5)), a, np.float64(0.0) * a)
    np.testing.assert_array_equal(result.compute(), np.where(mask, a, 0.0))


def test_arrays_of_different_shapes_are_refused():
    with pytest.raises(InvalidArgumentError, match=r"array 1 has shape \(10, 1\) but array 0 has \(10, 5\)"):
        map_blocks(np.add, da.ones((10, 5), chunks=5), da.ones((10, 1), chunks=5))


# --- Errors inside kernels ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "block_shape"),
    [(0, (4, 3)), (1, (6, 5))],  # with a halo, the block the kernel saw is one cell wider on each side
    ids=["no-halo", "halo"],
)
def test_kernel_error_names_the_block_and_the_process_carries_on(depth, block_shape):
    x = da.from_array(np.arange(60, dtype="int32").reshape(10, 6), chunks=(4, 3))
    failing = map_blocks(fail_on_block_1_1, x, depth=depth, dtype=x.dtype)
    with pytest.raises(KernelError) as info:
        failing.compute()
    message = str(info.value)
    assert "fail_on_block_1_1" in message
    assert f"block (1, 1) of shape {block_shape}" in message
    assert "ValueError: negative counts in this block" in message
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, RuntimeError)
    # The same session computes the next thing.
    np.testing.assert_array_equal(map_blocks(lambda b: b + 1, x).compute(), np.arange(60).reshape(10, 6) + 1)


def test_undeclared_shape_change_raises_kernel_shape_error():
    x = da.ones((8, 6), chunks=(4, 3))
    shrunk = map_blocks(lambda b: b[:-1], x)
    with pytest.raises(KernelShapeError, match=r"shape \(3, 3\) for block \(\d, \d\) of shape \(4, 3\).*drop_axis="):
        shrunk.compute()
    assert isinstance(map_blocks(three_point_sum, x).compute(), np.ndarray)  # the session carries on


def test_declared_drop_axis_reduces_over_the_whole_axis(rng):
    a = rng.standard_normal((12, 10))
    result = map_blocks(lambda b: b.sum(axis=0), da.from_array(a, chunks=(5, 4)), drop_axis=0)
    assert result.shape == (10,)
    np.testing.assert_allclose(result.compute(), a.sum(axis=0), rtol=1e-13)


def test_drop_axis_with_a_halo_on_the_kept_axis(rng):
    a = rng.standard_normal((12, 10))
    result = map_blocks(
        lambda b: box_mean(b.sum(axis=0), (1,)),
        da.from_array(a, chunks=(5, 4)),
        depth={1: 1},
        boundary="nearest",
        drop_axis=0,
    )
    expected = box_mean_valid(np.pad(a.sum(axis=0), 1, mode="edge"), (1,))
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-13)


def test_halo_on_a_dropped_axis_pads_only_its_ends(rng):
    # The dropped axis is gathered into one block before the kernel reduces it, so its halo is the
    # boundary padding at the array's two ends, never neighbours' cells repeated inside.
    a = rng.standard_normal((12, 10))
    result = map_blocks(
        lambda b: b.sum(axis=0), da.from_array(a, chunks=(5, 4)), depth={0: 1}, boundary="reflect", drop_axis=0
    )
    expected = np.pad(a, ((1, 1), (0, 0)), mode="symmetric").sum(axis=0)
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-13)


def test_declared_new_axis_with_unequal_depths(rng):
    # dask's own map_overlap trims the wrong depths here (the new axis shifts them); this one does not.
    a = rng.standard_normal((12, 10))
    result = map_blocks(
        lambda b: box_mean(b, (1, 2))[np.newaxis],
        da.from_array(a, chunks=(5, 4)),
        depth=(1, 2),
        boundary="reflect",
        new_axis=0,
    )
    expected = box_mean_valid(pad_like_boundary(a, (1, 2), "reflect"), (1, 2))
    assert result.shape == (1, 12, 10)
    np.testing.assert_allclose(result.compute(), expected[np.newaxis], rtol=1e-13)


def test_declared_chunks_for_a_downsampling_kernel():
    a = np.arange(48.0).reshape(8, 6)
    result = map_blocks(lambda b: b[::2], da.from_array(a, chunks=(4, 3)), chunks=(2, 3))
    np.testing.assert_array_equal(result.compute(), a[::2])


# --- Built-in kernels against numpy and scipy ------------------------------------------------------


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
def test_standardize_matches_numpy(rng, axis):
    a = rng.standard_normal((41, 33)) * 7 + 3
    got = standardize(da.from_array(a, chunks=(7, 9)), axis=axis).compute()
    mean, std = a.mean(axis=axis, keepdims=True), a.std(axis=axis, keepdims=True)
    np.testing.assert_allclose(got, (a - mean) / std, rtol=1e-10)


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "rtol"),
    [("float32", "float32", 1e-5), ("int16", "float64", 1e-10), ("bool", "float64", 1e-10)],
)
def test_standardize_keeps_floats_and_makes_other_types_float64(rng, dtype, out_dtype, rtol):
    a = rng.random((30, 20)) > 0.5 if dtype == "bool" else (rng.standard_normal((30, 20)) * 100).astype(dtype)
    result = standardize(da.from_array(a, chunks=(8, 8)), axis=0)
    assert result.dtype == out_dtype
    wide = a.astype(np.float64)
    expected = (wide - wide.mean(axis=0)) / wide.std(axis=0)
    got = result.compute()
    assert got.dtype == out_dtype
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)


def test_standardize_turns_constant_slices_into_zeros(rng):
    a = rng.standard_normal((20, 3))
    a[:, 1] = 4.25
    got = standardize(da.from_array(a, chunks=(6, 3)), axis=0).compute()  # no divide-by-zero warning
    np.testing.assert_array_equal(got[:, 1], 0.0)
    np.testing.assert_allclose(got[:, 0], (a[:, 0] - a[:, 0].mean()) / a[:, 0].std(), rtol=1e-10)


def test_standardize_holds_few_blocks_in_memory():
    # 40 blocks: holding them all until the statistics are known is what an out-of-core
    # standardize must not do; it reads each twice instead.
    source = TrackedArray(np.random.default_rng(1).standard_normal((400, 50)))
    got = standardize(source.as_dask((10, 50))).compute(num_workers=2)
    np.testing.assert_allclose(got, (source.data - source.data.mean()) / source.data.std(), rtol=1e-10)
    assert source.reads == 80
    assert source.peak_alive <= 8


@pytest.mark.parametrize(
    ("dtype", "lower", "upper"),
    [
        ("int16", -3, 40),
        ("float64", None, 0.5),
        ("float32", -0.25, None),
        ("uint8", 10, 10),
        # numpy's promotion: float bounds make an int16 array float64, in memory and here alike.
        ("int16", -2.5, 7.5),
    ],
)
def test_clip_matches_numpy(rng, dtype, lower, upper):
    a = (rng.standard_normal((25, 14)) * 20).astype(dtype)
    result = clip(da.from_array(a, chunks=(6, 5)), lower, upper)
    expected = np.clip(a, lower, upper)
    assert result.dtype == expected.dtype
    got = result.compute()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", ["int8", "float32", "uint16", "bool"])
def test_astype_matches_numpy(rng, dtype):
    a = rng.standard_normal((15, 7)) * 100
    got = astype(da.from_array(a, chunks=4), dtype).compute()
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, a.astype(dtype))


@pytest.mark.parametrize("window", [1, 2, 3, 4, 7, 10])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_moving_mean_matches_uniform_filter1d(rng, window, axis):
    a = rng.standard_normal((37, 23))
    result = moving_mean(da.from_array(a, chunks=((3, 10, 24), (8, 8, 7))), window, axis=axis)
    expected = ndimage.uniform_filter1d(a, window, axis=axis, mode="reflect")
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-12, atol=1e-14)


def test_moving_mean_window_longer_than_the_axis(rng):
    # A halo of 12 cannot come from 9 cells; scipy mirrors as often as it needs, and so must this.
    a = rng.standard_normal((9, 31))
    result = moving_mean(da.from_array(a, chunks=(4, 10)), 25, axis=0)
    np.testing.assert_allclose(
        result.compute(), ndimage.uniform_filter1d(a, 25, axis=0, mode="reflect"), rtol=1e-12, atol=1e-14
    )


def test_moving_mean_keeps_float32(rng):
    a = rng.standard_normal(500).astype("float32")
    result = moving_mean(da.from_array(a, chunks=77), 6)
    assert result.dtype == np.float32
    got = result.compute()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ndimage.uniform_filter1d(a, 6, mode="reflect"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("sigma", "truncate"),
    [
        (0.5, 4.0),
        (1.0, 4.0),
        (2.5, 4.0),
        ((1.0, 0.0), 4.0),  # one axis left alone
        ((0.7, 3.0), 2.0),
        # A radius of 24 along axes of 20 and 33 cells: wider than the first axis.
        (6.0, 4.0),
    ],
)
def test_gaussian_filter_matches_scipy(rng, sigma, truncate):
    a = rng.standard_normal((20, 33))
    result = gaussian_filter(da.from_array(a, chunks=((3, 8, 9), (10, 10, 13))), sigma, truncate=truncate)
    expected = ndimage.gaussian_filter(a, sigma, mode="reflect", truncate=truncate)
    np.testing.assert_allclose(result.compute(), expected, rtol=1e-12, atol=1e-15)


def test_gaussian_filter_3d_float32(rng):
    a = rng.standard_normal((12, 14, 9)).astype("float32")
    result = gaussian_filter(da.from_array(a, chunks=(5, 6, 4)), (1.5, 0.8, 1.0))
    got = result.compute()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ndimage.gaussian_filter(a, (1.5, 0.8, 1.0), mode="reflect"), rtol=1e-6)


def test_filters_on_a_file_opened_with_daskstream(tmp_path, rng):
    a = rng.standard_normal((120, 45)).astype("float32")
    np.save(tmp_path / "field.npy", a)
    x = ds.open(tmp_path / "field.npy", chunks=(25, 45))
    smooth, averaged = dask.compute(gaussian_filter(x, 2.0), moving_mean(x, 8, axis=0))
    np.testing.assert_allclose(smooth, ndimage.gaussian_filter(a, 2.0, mode="reflect"), rtol=1e-6)
    np.testing.assert_allclose(averaged, ndimage.uniform_filter1d(a, 8, axis=0, mode="reflect"), rtol=1e-5)


# --- Process workers --------------------------------------------------------------------------------


def test_kernels_pickle_to_process_workers(tmp_path, rng):
    a = rng.standard_normal((90, 40))
    np.save(tmp_path / "field.npy", a)
    x = ds.open(tmp_path / "field.npy", chunks=(20, 40))
    local_stencil = map_blocks(lambda b: box_mean(b, (1, 1)), x, depth=1, boundary="periodic")
    failing = map_blocks(fail_on_block_1_1, x.rechunk((20, 20)), dtype=x.dtype)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        stencil, averaged = dask.compute(local_stencil, moving_mean(x, 5, axis=0), scheduler="processes", pool=pool)
        with pytest.raises(KernelError, match=r"block \(1, 1\) of shape \(20, 20\).*negative counts"):
            failing.compute(scheduler="processes", pool=pool)
    np.testing.assert_allclose(stencil, box_mean_valid(pad_like_boundary(a, (1, 1), "periodic"), (1, 1)), rtol=1e-13)
    expected_average = ndimage.uniform_filter1d(a, 5, axis=0, mode="reflect")
    np.testing.assert_allclose(averaged, expected_average, rtol=1e-12, atol=1e-14)


# --- Arguments refused before anything runs ----------------------------------------------------------


X = da.ones((6, 4), chunks=3)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: map_blocks(np.negative, X, depth=1, boundary="mirror"), InvalidArgumentError, "'reflect'"),
        (lambda: map_blocks(np.negative, X, depth=1, boundary=True), InvalidArgumentError, "boundary=True"),
        (lambda: map_blocks(np.negative, X, depth=-1), InvalidArgumentError, "non-negative"),
        (lambda: map_blocks(np.negative, X, depth=1.5), InvalidArgumentError, "non-negative int"),
        (lambda: map_blocks(np.negative, X, depth=(1,)), InvalidArgumentError, "1 entries for 2 axes"),
        (lambda: map_blocks(np.negative, X, depth={2: 1}), InvalidAxisError, "axis 2"),
        (lambda: map_blocks(np.negative, X, depth={0: 1, -2: 1}), InvalidArgumentError, "axis 0 twice"),
        # A halo is borrowed from the array, so it cannot be wider than the array.
        (lambda: map_blocks(np.negative, X, depth=(1, 5)), InvalidArgumentError, "axis 1 is wider"),
        (lambda: map_blocks(np.negative, X, depth=1, chunks=(3, 3)), InvalidArgumentError, "halo"),
        (lambda: map_blocks(np.negative, X, new_axis=(0, -4)), InvalidArgumentError, "twice"),
        (lambda: map_blocks(np.negative, X, dtype="no-such-type"), InvalidArgumentError, "not a numpy dtype"),
        (lambda: map_blocks(X, np.negative), InvalidArgumentError, "function first"),
        (lambda: map_blocks(np.negative), InvalidArgumentError, "at least one array"),
        (lambda: map_blocks(np.add, X, [1, 2]), InvalidArgumentError, "keyword arguments"),
        (lambda: clip(X, np.zeros(4), 1), InvalidArgumentError, "not a scalar"),
        (lambda: astype(X, "no-such-type"), InvalidArgumentError, "not a numpy dtype"),
        (lambda: standardize(X.astype(complex)), InvalidArgumentError, "real-valued"),
        (lambda: standardize(X, axis=2), InvalidAxisError, "axis 2"),
        (lambda: moving_mean(X, 0), InvalidArgumentError, "window=0"),
        (lambda: moving_mean(X, 3, axis=2), InvalidAxisError, "axis 2"),
        (lambda: gaussian_filter(X, -1.0), InvalidArgumentError, "non-negative"),
        (lambda: gaussian_filter(X, (1.0, 1.0, 1.0)), InvalidArgumentError, "one per axis"),
        (lambda: gaussian_filter(X, 1.0, truncate=0), InvalidArgumentError, "truncate"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_tab_completion_on_kernels_shows_the_kernels_only():
    names = dir(ds.kernels)
    assert names == sorted(ds.kernels.__all__)
    assert not {"np", "da", "dataclass", "warnings"} & set(names)
    assert all(callable(getattr(ds.kernels, name)) for name in names)


@pytest.mark.parametrize(
    ("shape", "depth", "boundary", "budget", "most_read"),
    # Slabs of the source's chunks, thinned until they fit, read 2.4x, 3.6x, 20x and 3.8x these arrays.
    [
        ((16384, 16384), 48, "reflect", "64MiB", 1.6),  # 1 GiB: once cut into 32,768 slabs a row thin
        ((16384, 16384), (96, 4), 0.0, "64MiB", 1.6),
        ((512, 1024, 1024), 8, "nearest", "64MiB", 2.0),  # 2 GiB in three dimensions: halos on six faces
        ((512, 1024, 1024), (2, 32, 32), "periodic", "128MiB", 2.0),
    ],
    ids=["2d-48-reflect", "2d-rows-constant", "3d-8-nearest", "3d-columns-periodic"],
)
def test_a_deep_halo_is_planned_into_near_square_blocks_that_fit_and_read_little_twice(
    tmp_path, shape, depth, boundary, budget, most_read
):
    # A sparse file: the header and the size, no data on disk; nothing is computed here, the plan is counted.
    path = tmp_path / "wide.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype="f4", shape=shape).flush()
    x = ds.open(str(path), memory_budget=budget)
    y = map_blocks(lambda b: b * 2, x, depth=depth, boundary=boundary, dtype="f4")
    halo = (depth,) * len(shape) if isinstance(depth, int) else depth
    per_block = [math.prod(min(n, c + 2 * h) for n, c, h in zip(shape, block, halo)) for block in _blocks(y)]
    read = sum(per_block) / math.prod(shape)
    assert read <= most_read, f"cells read {read:.2f}x the array's"
    # About as many tasks as the source has (its chunks were sized for the budget and the workers), not
    # tens of thousands of thin slabs; every block with its halo within the budget.
    assert y.npartitions <= 4 * x.npartitions
    assert max(per_block) * 4 <= ds.plan_compute(y.sum()).budget


def _blocks(y):
    return itertools.product(*y.chunks)
