"""Adaptive reductions on real files: the same answers, nothing read twice, what was chosen and why."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import warnings

import dask.config
import numpy as np
import pytest
from adaptive_fields import SHAPE, cli_environment, three_rows, three_rows_of, write
from hypothesis import given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.errors import InvalidArgumentError
from daskstream.runtime.metering import ReadMeter
from daskstream.tuning.adaptive.trials import choose, lay_out_trials, rest_wave, settings_to_try, wave_rows
from daskstream.tuning.candidates import SearchSpace


def data(dtype="f4") -> np.ndarray:
    rng = np.random.default_rng(7)
    values = rng.standard_normal(SHAPE) * 100 + 1e4
    return values.astype(dtype)


def single_run(path: str, op: str, **options):
    return ds.reduce(ds.open(path), op, **options).compute()


@pytest.mark.parametrize("kind", ["npy", "hdf5", "zarr"])
@pytest.mark.parametrize(
    ("op", "axis"),
    [("sum", None), ("mean", None), ("var", 0), ("std", None), ("max", 0), ("nanmin", None), ("mean", 1)],
)
def test_an_adaptive_run_tries_settings_and_gives_a_single_runs_answer(tmp_path, adaptive, kind, op, axis):
    values = data()
    path = write(tmp_path, kind, values)
    run = ds.reduce(path, op, axis=axis, adaptive=True)
    with ReadMeter() as meter:
        got = run.compute()
    # Trials are real work: every byte is read once.
    assert meter.bytes_read == values.nbytes
    adaptation = run.adaptation
    assert adaptation.adapted, adaptation.explain()
    assert len(adaptation.tried) >= 2
    assert adaptation.tried[0].role == "planner"
    # At most the trial fraction, and a confirming wave each of the planner and a challenger that won once.
    row_bytes = values.nbytes // SHAPE[0]
    wave_rows = [t.chunks[0] * t.threads * 4 for t in adaptation.tried]
    confirming = wave_rows[0] + max(wave_rows[1:])
    assert 0 < adaptation.trial_bytes <= values.nbytes * 0.5 + confirming * row_bytes
    assert sum(t.nbytes for t in adaptation.tried) == values.nbytes
    want = getattr(np, op)(values.astype("f8"), axis=axis, **({"ddof": 0} if op in ("var", "std") else {}))
    single = single_run(path, op, axis=axis)
    assert np.shape(got) == np.shape(single)
    assert np.asarray(got).dtype == np.asarray(single).dtype
    if op in ("max", "nanmin") or axis == 1:
        # Extremes, and reductions that keep the first axis, are a single run's numbers exactly.
        np.testing.assert_array_equal(got, single)
    else:
        np.testing.assert_allclose(got, single, rtol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(
    ("op", "axis", "dtype"),
    [
        ("sum", None, "i2"),
        ("sum", 0, "i8"),
        ("count_nonzero", None, "i4"),
        ("ptp", 0, "u1"),
        ("any", None, "?"),
        ("all", 0, "?"),
        ("prod", None, "?"),
        ("min", (0, 1), "i4"),
        ("argmax", 1, "f4"),
        ("median", 1, "f4"),
        ("quantile", 1, "f4"),
    ],
)
def test_integer_logical_and_kept_axis_answers_are_exact(tmp_path, adaptive, op, axis, dtype):
    rng = np.random.default_rng(3)
    # As many bytes as the float32 arrays, so the planner's tasks leave as much room for trials.
    shape = (SHAPE[0] * 4 // np.dtype(dtype).itemsize, SHAPE[1])
    values = rng.integers(0, 200, shape).astype(dtype) if dtype != "?" else rng.random(shape) > 0.01
    if dtype == "f4":
        values = values.astype("f4")
    path = write(tmp_path, "zarr", values)
    options = {"q": [0.25, 0.75]} if op == "quantile" else {}
    run = ds.reduce(path, op, axis=axis, adaptive=True, **options)
    got = run.compute()
    assert run.adaptation.adapted, run.adaptation.explain()
    single = single_run(path, op, axis=axis, **options)
    np.testing.assert_array_equal(got, single)
    assert np.asarray(got).dtype == np.asarray(single).dtype


def test_nan_all_along_a_piece_and_keepdims(tmp_path, adaptive):
    values = data()
    values[:, 3] = np.nan  # a column all NaN: its nanmean is NaN with numpy's warning in a single run
    values[:100] = np.nan  # the first trial waves see only NaN in some columns
    path = write(tmp_path, "zarr", values)
    run = ds.reduce(path, "nanmean", axis=0, keepdims=True, adaptive=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = run.compute()
        single = single_run(path, "nanmean", axis=0, keepdims=True)
    assert got.shape == (1, SHAPE[1])
    np.testing.assert_allclose(got, single, rtol=1e-12, equal_nan=True)
    assert np.isnan(got[0, 3])


def test_the_choice_is_shown_and_remembered_for_the_next_run(tmp_path, adaptive):
    path = write(tmp_path, "zarr", data())
    first = ds.reduce(path, "sum", adaptive=True)
    first.compute()
    text = first.explain()
    assert "adaptive sum over" in text
    assert "<- chosen" in text
    assert "planner" in text
    assert "interleaved" in text
    as_dict = json.loads(json.dumps(first.adaptation.to_dict()))
    assert as_dict["chunks"] == list(first.adaptation.chunks)
    assert as_dict["threads"] == first.adaptation.threads
    remembered = [e["adaptive"] for e in adaptive.entries().values() if "adaptive" in e]
    assert len(remembered) == 1
    assert tuple(remembered[0]["chunks"]) == first.adaptation.chunks
    assert remembered[0]["threads"] == first.adaptation.threads
    # Another file of the same kind starts from what the first chose, with the planner still in the trials.
    other = tmp_path / "other"
    other.mkdir()
    second = ds.reduce(write(other, "zarr", data()), "sum", adaptive=True)
    second.compute()
    assert second.adaptation.tried[0].role == "remembered"
    assert second.adaptation.tried[0].chunks == first.adaptation.chunks
    assert "remembered" in second.adaptation.started_from
    assert (
        any(t.role == "planner" for t in second.adaptation.tried)
        or first.adaptation.tried[first.adaptation.chosen].role == "planner"
    )


def test_runs_too_short_or_on_other_schedulers_run_as_planned_and_say_why(tmp_path, adaptive):
    values = data()
    path = write(tmp_path, "npy", values)
    with dask.config.set({"daskstream.adaptive.min-seconds": 1000}):
        short = ds.reduce(path, "sum", adaptive=True)
        got = short.compute()
    assert not short.adaptation.adapted
    assert "too short for trials to pay" in short.adaptation.reason
    assert "ran as planned" in short.explain()
    np.testing.assert_allclose(got, values.sum(dtype="f8"), rtol=1e-12)
    with dask.config.set({"daskstream.adaptive.trial-fraction": 0.001}):
        small = ds.reduce(path, "sum", adaptive=True)
        small.compute()
    assert "too small to try alternatives" in small.adaptation.reason
    with ds.session("sync", progress=False):
        synced = ds.reduce(path, "max", adaptive=True)
        assert synced.compute() == values.max()
    assert "threaded scheduler" in synced.adaptation.reason
    first_axis = ds.reduce(path, "argmax", axis=0, adaptive=True)
    np.testing.assert_array_equal(first_axis.compute(), values.argmax(axis=0))
    assert "positions" in first_axis.adaptation.reason
    # Nothing ran adaptively, so nothing is remembered.
    assert not [e for e in adaptive.entries().values() if "adaptive" in e]


def test_what_cannot_adapt_is_refused_clearly(tmp_path, adaptive):
    path = write(tmp_path, "npy", data())
    x = ds.open(path)
    with pytest.raises(InvalidArgumentError, match="reads none"):
        ds.reduce(dask.array.ones((100, 100)), "sum", adaptive=True)
    with pytest.raises(InvalidArgumentError, match="histogram"):
        ds.reduce(x, "histogram", adaptive=True)
    with pytest.raises(InvalidArgumentError, match="split_every"):
        ds.reduce(x, "sum", adaptive=True, split_every=4)
    with pytest.raises(InvalidArgumentError, match="progress= applies to adaptive=True"):
        ds.reduce(x, "sum", progress=True)
    # The array as opened, or its Source, adapts like the path.
    assert ds.reduce(x, "sum", adaptive=True).compute() == pytest.approx(float(data().sum(dtype="f8")), rel=1e-12)
    assert ds.reduce(ds.open_source(path), "min", adaptive=True).compute() == data().min()


def test_the_command_line_prints_the_choice(tmp_path, adaptive):
    values = data()
    path = write(tmp_path, "zarr", values)
    env = cli_environment(tmp_path)

    def cli(*extra):
        command = [sys.executable, "-m", "daskstream", "reduce", path, "--op", "max", "--adaptive", "--quiet"]
        return subprocess.run(
            [*command, "--budget", "64MiB", *extra], capture_output=True, text=True, env=env, timeout=120
        )

    shown = cli()
    assert shown.returncode == 0, shown.stderr
    assert "<- chosen" in shown.stdout
    assert str(values.max()) in shown.stdout
    as_json = cli("--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["result"] == pytest.approx(float(values.max()))
    assert report["bytes_read"] == values.nbytes
    assert report["adaptive"]["adapted"]
    described = subprocess.run(
        [sys.executable, "-m", "daskstream", "describe", path, "--adaptive", "--quiet", "--json", "--budget", "64MiB"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert described.returncode == 0, described.stderr
    statistics = json.loads(described.stdout)
    assert statistics["max"] == pytest.approx(float(values.max()))
    assert statistics["adaptive"]["operation"] == "describe"
    # The first command's choice was remembered: the second starts from it.
    assert report["adaptive"]["tried"][0]["role"] == "remembered"
    assert "remembered" in report["adaptive"]["started_from"]


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_a_kernel_or_an_expression_over_a_source_is_reduced_adaptively(tmp_path, adaptive, kind):
    values = data()
    path = write(tmp_path, kind, values)
    x = ds.open(path)
    stencil = ds.map_blocks(three_rows, x, depth={0: 1}, boundary="nearest", dtype="f4")
    run = ds.reduce(stencil, "max", axis=1, adaptive=True)
    with ReadMeter() as meter:
        got = run.compute()
    assert run.adaptation.adapted, run.adaptation.explain()
    assert "three_rows of" in run.adaptation.source
    # Each wave reads its rows and the halo rows beside them: no more than the planned tasks read.
    with ReadMeter() as planned:
        want = ds.reduce(stencil, "max", axis=1).compute()
    assert values.nbytes <= meter.bytes_read <= planned.bytes_read
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, three_rows_of(values).max(axis=1), rtol=1e-6)
    # An element-wise expression with an aggregate: the aggregate once, then the waves (the array exceeds
    # the budget, so the planned run reads it twice too).
    with dask.config.set({"daskstream.memory-budget": "16MiB"}):
        y = ds.open(path)
        centred = ds.reduce((y - y.mean()) ** 2, "sum", adaptive=True)
        with ReadMeter() as meter:
            total = centred.compute()
    assert centred.adaptation.adapted, centred.adaptation.explain()
    assert meter.bytes_read == 2 * values.nbytes
    wide = values.astype("f8")
    np.testing.assert_allclose(total, ((wide - wide.mean()) ** 2).sum(), rtol=1e-5)
    # describe of the kernel: the single run's statistics.
    described = ds.describe(stencil, axis=0, bins=8, range=(9000, 11000), adaptive=True)
    got = described.compute()
    assert described.adaptation.adapted, described.adaptation.explain()
    single = ds.describe(stencil, axis=0, bins=8, range=(9000, 11000)).compute()
    for key in ("count", "min", "max", "histogram"):
        np.testing.assert_array_equal(got[key], single[key], err_msg=key)
    np.testing.assert_allclose(got["mean"], single["mean"], rtol=1e-10)
    # Something not computed region by region runs as planned, saying why.
    rechunked = ds.reduce(x.rechunk((1000, 512)), "sum", adaptive=True)
    assert rechunked.compute() == pytest.approx(float(values.sum(dtype="f8")), rel=1e-12)
    assert "region by region" in rechunked.adaptation.reason


# -- the pure wave planning -------------------------------------------------------------------------------------------


spaces = st.builds(
    lambda rows, unit, cols, budget_mib, threads: SearchSpace(
        (rows, cols), 4, (unit, cols), (0, 1), budget_mib * 2**20 // threads, threads
    ),
    st.integers(1, 200_000),
    st.sampled_from([1, 16, 64, 256, 1000]),
    st.sampled_from([1, 256, 1024]),
    st.integers(8, 4096),
    st.integers(1, 8),
)


@settings(max_examples=200, deadline=None)
@given(
    space=spaces,
    multiple=st.integers(1, 64),
    factor=st.floats(1.0, 6.0),
    fraction=st.floats(0.05, 0.9),
    remembered_threads=st.one_of(st.none(), st.integers(1, 16)),
)
def test_trials_tile_the_first_rows_and_hold_the_budget(space, multiple, factor, fraction, remembered_threads):
    start = (min(multiple, space.n_units[0]), 1)
    # The planner's threads, or those a remembered setting starts from: the budget is the worker's either way.
    threads = space.concurrency if remembered_threads is None else remembered_threads
    budget = space.per_task_bytes * space.concurrency
    tried = settings_to_try(space, start, threads, memory_factor=factor, max_threads=16, budget_bytes=budget)
    assert tried[0].multiples == start
    assert tried[0].threads == threads
    for setting in tried[1:]:
        # No alternative holds more bytes at once than the worker's budget.
        held = factor * space.chunk_bytes(setting.multiples) * setting.threads
        assert held <= budget
        assert setting.threads <= 16
    waves, why = lay_out_trials(space, tried, rounds=2, tasks_per_thread=1, trial_fraction=fraction)
    if not waves:
        assert why
        return
    assert why is None
    # Contiguous, in order, storage-aligned, within the trial fraction, each setting once a round.
    assert waves[0].start == 0
    for before, after in itertools.pairwise(waves):
        assert before.stop == after.start
    for wave in waves:
        assert wave.start % space.unit[0] == 0
        unit = wave_rows(space, tried[wave.setting], 1)
        assert (wave.stop - wave.start) % unit == 0
    assert waves[-1].stop <= space.shape[0] * fraction
    # The warm-up first, one task per thread of the starting setting; then the rounds.
    assert waves[0].trial == -1
    assert waves[0].setting == 0
    assert waves[0].stop == wave_rows(space, tried[0], 1)
    for wave in waves[1:]:
        # The same number of tasks per thread for every setting.
        assert wave.stop - wave.start == wave_rows(space, tried[wave.setting], 1)
    rounds = {w.trial for w in waves[1:]}
    for r in rounds:
        assert sorted(w.setting for w in waves if w.trial == r) == list(range(len(tried)))
    rest = rest_wave(waves, space.shape[0], 0)
    covered = waves[-1].stop + (0 if rest is None else rest.stop - rest.start)
    assert covered == space.shape[0]


def test_the_starting_setting_is_kept_unless_beaten_beyond_the_noise():
    space = SearchSpace((65536, 1024), 4, (256, 1024), (0, 1), 2**27, 2)
    tried = settings_to_try(space, (8, 1), 2, memory_factor=2.0, max_threads=16, budget_bytes=2**28)
    clear = choose(tried, [[1e9, 1.02e9], [1.6e9, 1.62e9], [0.9e9, 0.95e9]], min_gain=0.05)
    assert clear.setting == 1
    assert "beyond the noise" in clear.reason
    # A win as large as the spread between a setting's own trials is no win.
    noisy = choose(tried, [[0.6e9, 1.4e9], [1.3e9, 1.35e9], [0.9e9, 0.95e9]], min_gain=0.05)
    assert noisy.setting == 0
    assert "within the noise" in noisy.reason


@pytest.mark.parametrize("kind", ["npy", "zarr"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_an_adaptive_describe_gives_a_single_runs_statistics(tmp_path, adaptive, kind, axis):
    values = data()
    values[5, 7] = np.nan
    path = write(tmp_path, kind, values)
    run = ds.describe(path, axis=axis, bins=16, range=(9000, 11000), adaptive=True)
    with ReadMeter() as meter:
        got = run.compute()
    assert meter.bytes_read == values.nbytes
    assert run.adaptation.adapted, run.adaptation.explain()
    assert run.adaptation.operation == "describe"
    single = ds.describe(ds.open(path), axis=axis, bins=16, range=(9000, 11000)).compute()
    assert set(got) == set(single)
    for key in ("count", "nan_count", "min", "max", "histogram", "bin_edges"):
        np.testing.assert_array_equal(got[key], single[key], err_msg=key)
    for key in ("mean", "std"):
        np.testing.assert_allclose(got[key], single[key], rtol=1e-10, err_msg=key)
    finite = np.where(np.isnan(values), np.nan, values.astype("f8"))
    np.testing.assert_allclose(got["mean"], np.nanmean(finite, axis=axis), rtol=1e-9)
    np.testing.assert_array_equal(got["max"], np.nanmax(values, axis=axis))
    assert int(np.sum(got["histogram"])) == int(np.sum((values >= 9000) & (values <= 11000)))


def test_describe_refuses_what_does_not_apply_to_adaptive_runs(tmp_path, adaptive):
    path = write(tmp_path, "npy", data())
    with pytest.raises(InvalidArgumentError, match="split_every"):
        ds.describe(path, adaptive=True, split_every=4)
    with pytest.raises(InvalidArgumentError, match="progress= applies to adaptive=True"):
        ds.describe(ds.open(path), progress=True)
