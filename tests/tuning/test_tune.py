"""``daskstream.tune`` on real files: aligned winners, the cache, online feedback and the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import dask.config
import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.errors import (
    DaskstreamWarning,
    InvalidArgumentError,
    SourceNotFoundError,
    TuneCacheWarning,
    UnknownOperationError,
)
from daskstream.runtime.metering import ReadMeter
from daskstream.runtime.remembered import key_text
from daskstream.tuning import TuneCache

SHAPE = (2048, 1024)


@pytest.fixture
def cache(tmp_path):
    """A private cache, and settings that let a few MiB be tuned (the defaults want far larger arrays)."""
    path = tmp_path / "tune.json"
    settings = {
        "daskstream.tune.cache": str(path),
        # Re-reads count towards the sample: let a tuning read the small array a few times over.
        "daskstream.tune.sample-fraction": 4.0,
        "daskstream.tune.cost-fraction": 100.0,
        "daskstream.tune.min-batch-bytes": "256KiB",
        "daskstream.planning.target-chunk-bytes": "512KiB",
        "daskstream.tune.time-budget": "20s",
        "daskstream.tune.feedback-min-seconds": 0.0,
    }
    with dask.config.set(settings):
        yield TuneCache(path)


def field(seed=0, shape=SHAPE, dtype="f4"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def write(tmp_path, kind, name="a", data=None, chunks=(128, 256)):
    data = field() if data is None else data
    if kind == "npy":
        path = tmp_path / f"{name}.npy"
        np.save(path, data)
        return str(path)
    if kind == "hdf5":
        path = tmp_path / f"{name}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=chunks, compression="gzip", shuffle=True)
        return f"{path}::x"
    path = tmp_path / f"{name}.zarr"
    z = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype)
    z[...] = data
    return str(path)


def aligned(chunks, source):
    unit = source.storage_chunks or (1, *source.shape[1:])
    return all(c == n or c % u == 0 for c, u, n in zip(chunks, unit, source.shape))


@pytest.mark.parametrize("kind", ["npy", "hdf5", "zarr"])
def test_tune_measures_aligned_candidates_and_remembers_the_winner(tmp_path, cache, kind):
    path = write(tmp_path, kind)
    source = ds.open_source(path)
    result = ds.tune(path, memory_budget="256MiB")

    assert not result.from_cache
    assert result.candidates[0].origin == "planner"
    assert result.candidates[0].chunks == result.auto_chunks
    assert result.auto_chunks == ds.plan(source, memory_budget="256MiB").chunks
    measured = [c for c in result.candidates if c.throughput is not None]
    assert len(measured) >= 2
    assert all(aligned(c.chunks, source) for c in result.candidates)
    winner = result.winner
    assert winner is not None
    assert winner.throughput >= result.candidates[0].throughput
    # A candidate faster than the winner lost only within the noise (its spread and the holder's, or 5%).
    noise = max(c.spread for c in measured)
    assert all(c.throughput <= winner.throughput * (1 + max(0.05, c.spread + noise)) for c in measured)
    assert result.speedup_vs_auto == pytest.approx(result.winner.throughput / result.candidates[0].throughput)
    assert result.candidates[0].peak_measured
    assert result.candidates[0].peak_task_bytes > 0
    assert 0 < result.sampled_bytes <= 4 * source.nbytes
    assert cache.get(result.key)["tuned"]["chunks"] == list(result.chunks)

    # Opening with chunks="tune" uses the remembered winner, and the data is unchanged.
    x = ds.open(path, chunks="tune", memory_budget="256MiB")
    assert x.chunksize == result.chunks
    np.testing.assert_array_equal(x.compute(), ds.open(path).compute())


def test_a_second_file_of_the_same_kind_reuses_the_result_without_reading(tmp_path, cache):
    first = write(tmp_path, "zarr", "first")
    second = write(tmp_path, "zarr", "second", data=field(seed=1, shape=(4096, 1024)))
    tuned = ds.tune(first, memory_budget="256MiB")
    with ReadMeter() as meter:
        again = ds.tune(second, memory_budget="256MiB")
    assert again.from_cache
    assert again.sampled_bytes == 0
    assert meter.bytes_read == 0
    assert again.chunks == tuned.chunks
    assert again.key == tuned.key
    assert "remembered" in str(again)


@pytest.mark.parametrize(
    ("change", "field_name"),
    [
        ({"data": field(dtype="f8")}, "dtype"),
        ({"chunks": (256, 256)}, "storage"),
    ],
)
def test_other_kinds_of_data_are_not_served_from_the_cache(tmp_path, cache, change, field_name):
    tuned = ds.tune(write(tmp_path, "hdf5", "first"), memory_budget="256MiB")
    other = ds.tune(write(tmp_path, "hdf5", "second", **change), memory_budget="256MiB")
    assert not other.from_cache
    assert other.key[field_name] != tuned.key[field_name]
    assert len(cache.entries()) == 2


def test_the_key_holds_work_scheduler_parallelism_and_machine_not_the_path(tmp_path, cache):
    path = write(tmp_path, "npy")
    by_sum = ds.tune(path, memory_budget="256MiB")
    by_std = ds.tune(path, op="std", memory_budget="256MiB")
    assert {"format", "storage", "unit", "dtype", "work", "scheduler", "threads", "workers", "machine"} == set(
        by_sum.key
    )
    assert str(tmp_path) not in key_text(by_sum.key)
    assert (by_sum.key["work"], by_std.key["work"]) == ("sum", "moments_chunk")
    with ds.session("sync", progress=False):
        synced = ds.tune(path, memory_budget="256MiB")
    assert (synced.key["scheduler"], synced.key["threads"]) == ("sync", 1)
    assert not synced.from_cache


def test_refresh_measures_again_and_clear_forgets(tmp_path, cache):
    path = write(tmp_path, "npy")
    ds.tune(path, memory_budget="256MiB")
    assert not ds.tune(path, memory_budget="256MiB", refresh=True).from_cache
    assert cache.clear() == 1
    assert cache.entries() == {}
    assert not ds.tune(path, memory_budget="256MiB").from_cache


def test_a_budget_too_small_for_larger_chunks_prunes_them(tmp_path, cache):
    path = write(tmp_path, "zarr", chunks=(128, 1024))  # 512 KiB storage chunks
    budget = 4 * 2**20
    # The planner told to count only the chunk, so it starts from chunks that the tuner's measured
    # peak (a sum holds about three times its chunk) shows larger candidates cannot grow past.
    with dask.config.set({"daskstream.planning.working-set-factor": 1.0}):
        result = ds.tune(path, memory_budget=budget)
    threads = ds.plan_chunks((1,), "f4").threads
    for c in result.candidates:
        if c.throughput is not None:
            assert c.peak_task_bytes is None or c.peak_task_bytes * threads <= budget * 1.01
    assert any(c.pruned and "budget" in c.pruned for c in result.candidates)
    assert result.winner.chunk_bytes * threads <= budget


def test_the_sample_cap_limits_what_is_read(tmp_path, cache):
    path = write(tmp_path, "npy")
    with dask.config.set({"daskstream.tune.sample-fraction": 0.01}):
        result = ds.tune(path, memory_budget="256MiB")
    assert result.sampled_bytes == 0
    assert result.speedup_vs_auto is None
    assert result.chunks == result.auto_chunks
    assert "sample cap" in result.stopped
    assert cache.entries() == {}  # nothing measured, nothing remembered
    # Said plainly, in the first line a person reads, with what to do about it.
    assert str(result).startswith("Not tuned: sum on")
    assert "not worth tuning at this size" in str(result)
    assert "not tuned" in result._repr_html_()
    # Opening with chunks="tune" does not pass the planner's chunks off as tuned.
    with (
        dask.config.set({"daskstream.tune.sample-fraction": 0.01}),
        pytest.warns(DaskstreamWarning, match="chunks='tune' measured nothing"),
    ):
        x = ds.open(path, chunks="tune", memory_budget="256MiB")
    assert x.chunksize == result.auto_chunks
    # The fraction it advises is the one that lets it measure: given it, the planner's chunks are measured.
    advised = float(re.search(r"--sample-fraction ([\d.]+) or more", str(result)).group(1))
    with dask.config.set({"daskstream.tune.sample-fraction": advised}):
        measured = ds.tune(path, memory_budget="256MiB", refresh=True)
    assert 0 < measured.sampled_bytes <= advised * np.load(path, mmap_mode="r").nbytes
    assert any(c.throughput is not None for c in measured.candidates)


def test_the_cli_takes_the_sample_and_cost_fractions(tmp_path, cache):
    path = write(tmp_path, "npy")
    env = {
        **os.environ,
        "DASK_DASKSTREAM__TUNE__CACHE": str(cache.path),
        "DASK_DASKSTREAM__TUNE__MIN_BATCH_BYTES": "256KiB",
        "DASK_DASKSTREAM__PLANNING__TARGET_CHUNK_BYTES": "512KiB",
    }

    def tune(*args):
        run = subprocess.run(
            [sys.executable, "-m", "daskstream", "tune", path, "--budget", "256MiB", "--json", "--refresh", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)

    refused = tune("--sample-fraction", "0.01")
    assert refused["speedup_vs_auto"] is None
    assert "not worth tuning" in refused["stopped"]
    # The array is read whole in about 10 ms: a share of a millionth leaves time for the planner's
    # chunks alone, while a share of a million (and a long time budget, so a busy machine is not cut
    # short) lets the climb measure its neighbours.
    measured = tune("--sample-fraction", "4", "--cost-fraction", "1e6", "--time-budget", "120s")
    assert sum(c["throughput"] is not None for c in measured["candidates"]) >= 2
    cut_short = tune("--sample-fraction", "4", "--cost-fraction", "1e-6", "--time-budget", "120s")
    assert sum(c["throughput"] is not None for c in cut_short["candidates"]) == 1
    assert cut_short["stopped"].startswith("time budget reached")


def test_a_kernel_with_a_halo_and_describe_can_be_tuned(tmp_path, cache):
    path = write(tmp_path, "hdf5")

    def box3(block):
        return (block[:-2, 1:-1] + block[2:, 1:-1] + block[1:-1, :-2] + block[1:-1, 2:]) / 4

    kernel = ds.tune(path, kernel=box3, depth=1, memory_budget="256MiB")
    assert kernel.work == "box3"
    assert kernel.winner is not None
    described = ds.tune(path, op="describe", memory_budget="256MiB")
    assert described.work == "describe"
    assert described.winner is not None


def test_a_dask_array_from_open_can_be_tuned(tmp_path, cache):
    path = write(tmp_path, "zarr")
    assert ds.tune(ds.open(path), memory_budget="256MiB").source == path
    with pytest.raises(InvalidArgumentError, match="one source"):
        ds.tune(ds.open(path) + ds.open(write(tmp_path, "zarr", "other")))


def test_bad_arguments_are_clear_errors(tmp_path, cache):
    path = write(tmp_path, "npy")
    with pytest.raises(SourceNotFoundError, match=r"nope\.npy"):
        ds.tune(tmp_path / "nope.npy")
    with pytest.raises(UnknownOperationError, match="describe"):
        ds.tune(path, op="average")
    with pytest.raises(InvalidArgumentError, match="time_budget"):
        ds.tune(path, time_budget="soon")
    with pytest.raises(InvalidArgumentError, match="depth"):
        ds.tune(path, kernel=np.negative, depth=-1)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",  # damaged
        np.arange(6.0).tobytes(),  # a data file named as the cache by mistake
        b'{"rows": [1, 2]}',  # JSON of another program
    ],
    ids=["damaged", "data", "other-json"],
)
def test_a_file_that_is_not_a_cache_is_ignored_with_a_warning_and_never_replaced(tmp_path, cache, content):
    cache.path.write_bytes(content)
    path = write(tmp_path, "npy")
    with pytest.warns(TuneCacheWarning, match="left as it is"):
        result = ds.tune(path, memory_budget="256MiB")
    assert cache.path.read_bytes() == content
    assert not result.from_cache
    assert result.winner is not None


def test_a_folder_at_the_cache_place_is_left_alone(tmp_path, cache):
    cache.path.mkdir(parents=True)
    (cache.path / "keep").write_text("k")
    with pytest.warns(TuneCacheWarning):
        ds.tune(write(tmp_path, "npy"), memory_budget="256MiB")
    assert (cache.path / "keep").read_text() == "k"


def test_the_result_shows_as_table_dataframe_plot_and_html(tmp_path, cache):
    import matplotlib

    matplotlib.use("Agg")
    result = ds.tune(write(tmp_path, "zarr"), memory_budget="256MiB")
    frame = result.to_dataframe()
    assert len(frame) == len(result.candidates)
    assert frame["winner"].sum() == 1
    assert {"chunks", "MiB", "tasks", "GB/s", "± %", "peak MiB", "pruned", "origin"} <= set(frame)
    # The frame speaks the table's units: GB/s as the table prints them, sizes in MiB.
    timed = [c for c in result.candidates if c.throughput is not None]
    assert frame["GB/s"].dropna().tolist() == pytest.approx([c.throughput / 1e9 for c in timed])
    assert frame["MiB"].tolist() == pytest.approx([c.chunk_bytes / 2**20 for c in result.candidates])
    figure = result.plot()
    (ax,) = figure.axes
    assert ax.get_xlabel() == "chunk size (MiB)"
    assert "winner" in [t.get_text() for t in ax.get_legend().get_texts()]
    # Every measured point says which chunks it is; the title names the operation, not dask's layer.
    labels = {t.get_text() for t in ax.texts}
    assert {"x".join(map(str, c.chunks)) for c in timed} <= labels
    assert "_chunk" not in ax.get_title()
    assert "sum on" in ax.get_title()
    html = result._repr_html_()
    assert "TuneResult" in html
    assert str(result.chunks) in html
    assert str(result.chunks) in str(result)


def test_a_long_computation_in_a_session_feeds_the_next_tuning(tmp_path, cache):
    path = write(tmp_path, "zarr")
    observed_chunks = (512, 1024)
    with ds.session("threads", progress=False) as s:
        (total,) = s.compute(ds.open(path, chunks=observed_chunks).sum())
    np.testing.assert_allclose(total, field().sum(dtype="f8"), rtol=1e-5)
    entries = list(cache.entries().values())
    assert len(entries) == 1
    (seen,) = entries[0]["observations"]
    assert seen["chunks"] == list(observed_chunks)
    assert seen["tasks"] == 4
    assert seen["task_seconds_measured"]
    assert seen["throughput"] > 0
    assert seen["peak_bytes"] is not None

    with ds.session("threads", progress=False):
        result = ds.tune(path, memory_budget="256MiB")
    assert result.key == entries[0]["key"]
    assert any(c.origin == "observed" and c.chunks == observed_chunks for c in result.candidates)


def test_cli_tune_prints_the_table_json_and_clears(tmp_path, cache):
    path = write(tmp_path, "npy")
    env_cache = {
        "DASK_DASKSTREAM__TUNE__CACHE": str(cache.path),
        "DASK_DASKSTREAM__TUNE__SAMPLE_FRACTION": "4.0",
        "DASK_DASKSTREAM__TUNE__COST_FRACTION": "100",
        "DASK_DASKSTREAM__TUNE__MIN_BATCH_BYTES": "256KiB",
        "DASK_DASKSTREAM__PLANNING__TARGET_CHUNK_BYTES": "512KiB",
    }

    def cli(*args):
        import os

        return subprocess.run(
            [sys.executable, "-m", "daskstream", "tune", *args],
            capture_output=True,
            text=True,
            env={**os.environ, **env_cache},
            timeout=120,
        )

    shown = cli(path, "--budget", "256MiB")
    assert shown.returncode == 0, shown.stderr
    assert "planner" in shown.stdout
    assert "chunks" in shown.stdout
    as_json = cli(path, "--budget", "256MiB", "--json", "--op", "mean")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["work"] == "mean_chunk"  # the cache's name for it
    assert data["operation"] == "mean"
    assert data["chunks"]
    assert data["candidates"]
    cleared = cli("--clear")
    assert cleared.returncode == 0
    assert "removed 2" in cleared.stdout
    bad = cli(str(tmp_path / "missing.h5"))
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "missing.h5" in bad.stderr


def test_a_remembered_winner_that_observed_runs_contradict_is_replaced(tmp_path, cache):
    path = write(tmp_path, "zarr")
    # Time enough to measure even on a busy machine: a tuning that measured nothing remembers nothing.
    first = ds.tune(path, memory_budget="256MiB", time_budget="60s")
    assert not first.from_cache
    assert cache.get(first.key) is not None
    tuned = tuple(first.chunks)
    # Another shape the space admits, in whole storage chunks: half as many rows' chunks (3 become 1),
    # or two where the tuned shape has one (doubling 1024 rows of 2048 would leave one task for two
    # threads, which the tuner rejects).
    source = ds.open_source(path)
    rows = source.storage_chunks[0]
    multiple = tuned[0] // rows
    other = ((multiple // 2 if multiple >= 2 else 2) * rows, tuned[1])

    def observed(chunks, throughput):
        multiples = [c // u for c, u in zip(chunks, source.storage_chunks)]
        cache.observe(first.key, {"chunks": list(chunks), "multiples": multiples, "throughput": throughput})

    # Full runs in sessions: the tuned shape slower than another, by far more than any noise (the
    # margin is twice the tuning's own spread, which a busy machine makes wide).
    observed(tuned, 1e8)
    observed(other, 1e10)
    again = ds.tune(path, memory_budget="256MiB")
    assert again.from_cache
    assert again.chunks == other
    assert "replaced" in again.stopped
    assert cache.get(first.key)["tuned"]["overruled"]
    # Runs that agree within the noise leave a remembered winner as it is.
    observed(other, 3e9)
    observed(tuned, 3.01e9)
    assert ds.tune(path, memory_budget="256MiB").chunks == other
    # A faster run of a shape these threads cannot share (one task for the whole array) does not
    # take over, nor does it throw the remembered winner away.
    observed(SHAPE, 1e12)
    kept = ds.tune(path, memory_budget="256MiB")
    assert kept.from_cache
    assert kept.chunks == other
