"""``codec="auto"``: codecs measured on the data itself, chosen for what the output is for, remembered."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import dask.array as da
import h5py
import numpy as np
import pytest
import zarr
from dask.callbacks import Callback

import daskstream as ds
from daskstream.compute.store.codec_candidates import _HDF5_CANDIDATES, _ZARR_CANDIDATES
from daskstream.compute.store.codec_timing import distrust, timed
from daskstream.compute.store.codecs import OBJECTIVES
from daskstream.errors import InvalidArgumentError
from daskstream.runtime.remembered import TuneCache


def _field() -> np.ndarray:
    """A smooth float32 field with noise, recorded to three decimals, as measured data often is."""
    rows, cols = np.meshgrid(np.arange(256), np.arange(512), indexing="ij")
    noise = np.random.default_rng(0).standard_normal((256, 512)) * 0.01
    return np.round(np.sin(rows / 30) * np.cos(cols / 50) + noise, 3).astype("f4")


@pytest.fixture
def trusting():
    """Measurements remembered whatever the machine's load while they were taken.

    Whether a measurement deserves remembering is tested on its own below; the tests using this
    fixture are about what is remembered and found again, which a busy test machine must not turn
    into a re-measurement.
    """
    with dask.config.set({"daskstream.tune.codec.least-cpu-share": 0.0, "daskstream.tune.codec.most-spread": 1e9}):
        yield


class _CountTasks(Callback):
    def __init__(self):
        super().__init__()
        self.count = 0

    def _posttask(self, key, result, dsk, state, id):
        self.count += 1


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("candidate", _ZARR_CANDIDATES, ids=lambda c: c.name)
def test_every_zarr_candidate_stores_what_zarr_reads_back(tmp_path, candidate, zarr_format):
    data = _field()
    out = tmp_path / "out.zarr"
    ds.store(da.from_array(data, chunks=(64, 512)), out, compressor=candidate.zarr_compressor(zarr_format),
             zarr_format=zarr_format)  # fmt: skip
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[...], data)


@pytest.mark.parametrize("candidate", _HDF5_CANDIDATES, ids=lambda c: c.name)
def test_every_hdf5_candidate_stores_what_h5py_reads_back(tmp_path, candidate):
    data = _field()
    ds.store(da.from_array(data, chunks=(64, 512)), f"{tmp_path}/out.h5::/x", compressor=candidate.hdf5_compressor())
    with h5py.File(tmp_path / "out.h5", "r") as f:
        np.testing.assert_array_equal(f["x"][...], data)


@pytest.mark.parametrize("optimize", OBJECTIVES)
def test_the_choice_is_the_measured_candidate_best_for_the_objective(optimize):
    x = da.from_array(_field(), chunks=(32, 512))
    choice = ds.choose_codec(x, optimize=optimize, remember=False)
    assert {m.candidate.name for m in choice.measured} == {c.name for c in _ZARR_CANDIDATES}
    best = min(choice.measured, key=lambda m: m.cost(optimize))
    assert choice.chosen == best.candidate
    if optimize == "size":
        assert best.ratio == max(m.ratio for m in choice.measured)
    none = next(m for m in choice.measured if m.candidate.name == "none")
    assert none.ratio == pytest.approx(1.0)
    # zstd 9 makes this field smaller than zstd 1 does.
    ratios = {m.candidate.name: m.ratio for m in choice.measured}
    assert ratios["zstd-9"] > ratios["zstd-1"] > 1.0


def test_zeros_are_never_stored_uncompressed_for_size():
    choice = ds.choose_codec(da.zeros((512, 512), chunks=(64, 512)), optimize="size", remember=False)
    assert choice.chosen.name != "none"
    assert min(m.ratio for m in choice.measured if m.candidate.name != "none") > 50


def test_a_choice_is_remembered_for_data_of_the_same_kind(tmp_path, trusting):
    cache = TuneCache(tmp_path / "tune.json")
    x = da.from_array(_field(), chunks=(32, 512))
    first = ds.choose_codec(x, optimize="read", cache=cache)
    assert not first.remembered
    counter = _CountTasks()
    with counter:
        again = ds.choose_codec(x * 1, optimize="read", cache=cache)  # computed the same way: the same kind
    assert again.remembered
    assert again.chosen == first.chosen
    assert counter.count == 0  # nothing computed: no block sampled
    assert "remembered" in again.why()
    other = ds.choose_codec(x, optimize="size", cache=cache)
    assert not other.remembered


def test_each_operation_is_timed_in_rounds_until_two_agree_with_the_cpu_it_got():
    data = np.random.default_rng(0).standard_normal(2**18)
    timing = timed(lambda: np.sort(data), data.nbytes)
    assert 0 < timing.rate < float("inf")
    assert timing.spread >= 0
    assert 0 < timing.cpu_share <= 1
    # Waiting is not computing: a thread that sleeps got a small share of a CPU, and is said so.
    import time

    asleep = timed(lambda: time.sleep(0.01), 1)
    assert asleep.cpu_share < 0.2


def _measured(name, *, encode=1.0, decode=2.0, spread=0.05, cpu_share=0.95):
    from types import SimpleNamespace

    family, _, level = name.partition("-")
    return SimpleNamespace(label=name, family=family, level=int(level or 0), variant="",
                           encode_rate=encode * 1e9, decode_rate=decode * 1e9, spread=spread,
                           cpu_share=cpu_share)  # fmt: skip


@pytest.mark.parametrize(
    ("measured", "reason"),
    [
        ([_measured("zstd-1"), _measured("zstd-3", cpu_share=0.18)], "the machine was busy: timing zstd-3 got 18%"),
        ([_measured("zstd-1", spread=0.9), _measured("zstd-3")], "noisy: zstd-1 timed with rounds 90% apart"),
        ([_measured("zstd-1", spread=float("inf"))], "noisy: zstd-1 timed with no two rounds"),
        # What a loaded machine once had remembered: zstd 1 encoding at a tenth of zstd 3's rate,
        ([_measured("zstd-1", encode=0.09), _measured("zstd-3", encode=0.97)], "inconsistent: zstd-1 encoded at 0.09"),
        # and copying the bytes decoding at a fraction of a codec's rate.
        ([_measured("none", encode=0.2, decode=0.16), _measured("zstd-3", decode=1.1)], "inconsistent: zstd-3 decoded"),
    ],
)
def test_busy_noisy_or_inconsistent_measurements_are_not_trusted(measured, reason):
    assert distrust(measured, most_spread=0.5, least_cpu_share=0.4).startswith(reason)


def test_calm_consistent_measurements_are_trusted():
    calm = [_measured("none", encode=8, decode=9), _measured("zstd-1", encode=0.5), _measured("zstd-3", encode=0.4)]
    assert distrust(calm, most_spread=0.5, least_cpu_share=0.4) is None


def test_a_choice_measured_while_the_machine_is_busy_is_used_but_not_remembered(tmp_path):
    cache = TuneCache(tmp_path / "tune.json")
    x = da.from_array(_field(), chunks=(32, 512))
    # Five busy processes for every CPU: the measuring thread gets about a sixth of one.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(5 * (os.cpu_count() or 1))]
    try:
        choice = ds.choose_codec(x, optimize="write", cache=cache, sample_bytes=2**20)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert not choice.remembered
    assert choice.not_remembered.startswith("the machine was busy")
    assert "not remembered (the machine was busy" in choice.why()
    assert choice.to_dict()["not_remembered"] == choice.not_remembered
    assert min(row["cpu_share"] for row in choice.to_dict()["candidates"]) < 0.4
    assert cache.entries() == {}  # the next store measures again


def test_a_remembered_choice_that_is_inconsistent_or_has_no_spread_is_measured_again(tmp_path, trusting):
    cache = TuneCache(tmp_path / "tune.json")
    x = da.from_array(_field(), chunks=(32, 512))
    first = ds.choose_codec(x, optimize="write", cache=cache)
    (entry,) = cache.entries().values()
    rows = entry["tuned"]["measured"]
    assert all(0 <= row["spread"] <= 1e9 and 0 < row["cpu_share"] <= 1 for row in rows)
    # What a loaded machine wrote: zstd 1 timed at a tenth of zstd 3's encoding rate.
    for row in rows:
        row["encode_rate"] = {"zstd-1": 0.09e9, "zstd-3": 0.97e9}.get(row["candidate"]["name"], row["encode_rate"])
    cache.put(first.key, entry["tuned"])
    again = ds.choose_codec(x, optimize="write", cache=cache)
    assert not again.remembered
    remeasured = {r["candidate"]["name"]: r["encode_rate"] for r in cache.get(first.key)["tuned"]["measured"]}
    assert remeasured["zstd-1"] > 0.5 * remeasured["zstd-3"]
    # An entry written before measurements carried their spread and CPU share.
    for row in rows:
        row.pop("spread")
        row.pop("cpu_share")
    cache.put(first.key, entry["tuned"])
    assert not ds.choose_codec(x, optimize="write", cache=cache).remembered
    assert ds.choose_codec(x, optimize="write", cache=cache).remembered


def test_the_table_shows_the_chosen_codec_as_text_json_and_html():
    choice = ds.choose_codec(da.from_array(_field(), chunks=(64, 512)), optimize="balanced", remember=False)
    text = str(choice)
    assert f"> {choice.chosen.label}" in text
    assert "ratio" in text
    assert "encode GB/s" in text
    data = json.loads(json.dumps(choice.to_dict()))
    assert data["chosen"] == choice.chosen.name
    assert sum(row["chosen"] for row in data["candidates"]) == 1
    html = choice._repr_html_()
    assert html.count("background:#e8f4e8") == 1
    assert choice.chosen.label in html


def test_store_auto_writes_with_the_chosen_codec_and_a_resumed_store_measures_nothing(tmp_path, trusting):
    x = da.from_array(_field(), chunks=(64, 512))
    out = tmp_path / "out.zarr"
    ds.store(x, out, codec="auto", optimize="size")
    choice = ds.choose_codec(x, optimize="size", folder=tmp_path)
    assert choice.remembered
    stored = zarr.open_array(out, mode="r")
    assert type(stored.compressors[0]).__name__.lower().startswith(choice.chosen.family.split("+")[0])
    np.testing.assert_array_equal(stored[...], x.compute())
    counter = _CountTasks()
    with counter, dask.config.set({"daskstream.tune.cache": str(tmp_path / "other-cache.json")}):
        # The earlier name of codec; the store is finished: nothing measured, nothing written.
        ds.store(x, out, compressor="auto", optimize="write")
    assert counter.count == 0
    assert not (tmp_path / "other-cache.json").exists()


def test_codec_and_its_earlier_name_compressor_together_are_refused(tmp_path):
    x = da.from_array(_field(), chunks=(64, 512))
    with pytest.raises(InvalidArgumentError, match="codec='auto' and compressor=None: give one"):
        ds.store(x, tmp_path / "out.zarr", codec="auto", compressor=None)
    assert not (tmp_path / "out.zarr").exists()
    ds.store(x, tmp_path / "plain.zarr", compressor=None)  # None is a value: no compression
    assert zarr.open_array(tmp_path / "plain.zarr", mode="r").compressors == ()


def test_an_unknown_objective_is_refused_by_name():
    with pytest.raises(InvalidArgumentError, match="optimize='fast'"):
        ds.choose_codec(da.zeros(10, chunks=5), optimize="fast")


@pytest.mark.parametrize("target", ["out.zarr", "out.h5::/x"])
def test_convert_codec_auto_prints_the_table_and_reports_the_choice(tmp_path, target):
    np.save(tmp_path / "src.npy", _field())
    out = f"{tmp_path}/{target}"
    done = subprocess.run([sys.executable, "-m", "daskstream", "convert", str(tmp_path / "src.npy"), out, "--codec",
                           "auto", "--optimize", "size"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "best for 'size'" in done.stderr
    assert "encode GB/s" in done.stderr
    np.testing.assert_array_equal(ds.open(out).compute(), _field())
    ds.close_files()  # HDF5 lets no other process write a file open here
    again = subprocess.run([sys.executable, "-m", "daskstream", "convert", str(tmp_path / "src.npy"), out, "--codec",
                            "auto", "--json", "--overwrite"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["codec"]["optimize"] == "balanced"
    assert summary["codec"]["chosen"] in {row["codec"] for row in summary["codec"]["candidates"]} | {
        c.name for c in (_ZARR_CANDIDATES + _HDF5_CANDIDATES)
    }


def test_an_unknown_objective_on_the_command_line_is_one_line_exit_2(tmp_path):
    np.save(tmp_path / "src.npy", np.zeros(10))
    done = subprocess.run([sys.executable, "-m", "daskstream", "convert", str(tmp_path / "src.npy"),
                           str(tmp_path / "o.zarr"), "--codec", "auto", "--optimize", "fast"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "--optimize" in done.stderr
