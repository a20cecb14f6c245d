"""The codec's decode limit on this machine: found for each format, measured once, remembered, shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask
import h5py
import hdf5plugin
import numcodecs
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream.compute.limits import LIMIT_SHOWN_FROM_BYTES, codec_limit, codec_of
from daskstream.graph.layers import read_layers
from daskstream.runtime.remembered import TuneCache


@pytest.fixture
def cache(tmp_path):
    """A tuning cache of the test's own, trusting measurements whatever the machine's load (whether a
    measurement deserves remembering is tested in test_codecs)."""
    path = tmp_path / "tune.json"
    settings = {
        "daskstream.tune.cache": str(path),
        "daskstream.tune.codec.least-cpu-share": 0.0,
        "daskstream.tune.codec.most-spread": 1e9,
    }
    with dask.config.set(settings):
        yield TuneCache(path)


def _field(rows=512, cols=1024):
    grid = np.add.outer(np.arange(rows), np.arange(cols)).astype("f4")
    return np.round(np.sin(grid / 40) + np.random.default_rng(0).standard_normal((rows, cols)) * 0.01, 3)


def _zarr(path, zarr_format=3, **options):
    array = zarr.create_array(str(path), shape=(512, 1024), chunks=(128, 1024), dtype="f4", zarr_format=zarr_format,
                              overwrite=True, **options)  # fmt: skip
    array[...] = _field()
    return str(path)


def _hdf5(path, **options):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=_field(), chunks=(128, 1024), **options)
    return f"{path}::/x"


def _source(path_or_array):
    array = ds.open(path_or_array) if isinstance(path_or_array, str) else path_or_array
    return read_layers(array)[0][1]


def test_the_codec_of_each_format_is_found_with_its_settings(tmp_path):
    found = {
        "zarr v3 zstd": _zarr(tmp_path / "a.zarr", compressors=zarr.codecs.ZstdCodec(level=5)),
        "zarr v3 sharded": _zarr(tmp_path / "b.zarr", shards=(256, 1024), compressors=zarr.codecs.ZstdCodec(level=1)),
        "zarr v3 none": _zarr(tmp_path / "c.zarr", compressors=None),
        "zarr v2 blosc": _zarr(
            tmp_path / "d.zarr", 2, compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.BITSHUFFLE)
        ),
        "zarr v2 gzip": _zarr(tmp_path / "e.zarr", 2, compressors=numcodecs.GZip(4)),
        "hdf5 gzip shuffle": _hdf5(tmp_path / "f.h5", compression="gzip", compression_opts=2, shuffle=True),
        "hdf5 deflate": _hdf5(tmp_path / "g.h5", compression="gzip", compression_opts=1),
        "hdf5 zstd": _hdf5(tmp_path / "h.h5", **hdf5plugin.Zstd(clevel=4)),
        "hdf5 blosc": _hdf5(tmp_path / "i.h5", **hdf5plugin.Blosc("zstd", 3, hdf5plugin.Blosc.SHUFFLE)),
        "hdf5 none": _hdf5(tmp_path / "j.h5"),
    }
    labels = {what: codec_of(_source(path)).label for what, path in found.items()}
    assert labels == {
        "zarr v3 zstd": "zstd 5",
        "zarr v3 sharded": "zstd 1",
        "zarr v3 none": "no compression",
        "zarr v2 blosc": "blosc lz4 5 + bit shuffle",
        "zarr v2 gzip": "gzip 4",
        "hdf5 gzip shuffle": "gzip 2 + shuffle",
        "hdf5 deflate": "gzip 1",
        "hdf5 zstd": "zstd 4",
        "hdf5 blosc": "blosc zstd 3 + shuffle",
        "hdf5 none": "no compression",
    }
    np.save(tmp_path / "k.npy", _field())
    assert codec_of(_source(str(tmp_path / "k.npy"))).label == "no compression"
    # A codec daskstream does not time: no limit rather than a wrong one.
    lz4 = _zarr(tmp_path / "l.zarr", 2, compressors=numcodecs.LZ4())
    assert codec_of(_source(lz4)) is None
    assert codec_limit(ds.open(lz4), threads=2) is None


def test_a_limit_is_measured_once_on_the_data_and_then_remembered(tmp_path, cache):
    x = ds.open(_zarr(tmp_path / "a.zarr", compressors=zarr.codecs.ZstdCodec(level=3)))
    assert codec_limit(x, threads=2, measure=False) is None  # nothing remembered: nothing measured
    assert "not measured yet" in ds.plan_compute(x.sum()).explain()
    first = codec_limit(x.mean(axis=0), threads=2)  # work on the source: its codec's limit all the same
    assert first.codec == "zstd 3"
    assert not first.remembered
    assert first.rate == pytest.approx(2 * first.per_thread)
    again = codec_limit(x, threads=2, measure=False)
    assert again.remembered
    assert again.per_thread == first.per_thread
    explained = ds.plan_compute(x.sum()).explain()
    assert f"Limit here: {_source(x).name}: zstd 3 decodes at" in explained
    # Another number of threads is another limit.
    assert codec_limit(x, threads=4, measure=False) is None
    share = first.beside(first.rate / 2)
    assert share.endswith("50% of zstd 3's decode limit here")


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_the_reduce_command_sets_its_rate_beside_the_limit(tmp_path, kind):
    data = np.random.default_rng(0).standard_normal((LIMIT_SHOWN_FROM_BYTES // 4 // 2048, 2048)).astype("f4")
    if kind == "npy":
        path = str(tmp_path / "big.npy")
        np.save(path, data)
        codec = "a page-cache read"
    else:
        path = str(tmp_path / "big.zarr")
        z = zarr.create_array(path, shape=data.shape, chunks=(1024, 2048), dtype="f4",
                              compressors=zarr.codecs.ZstdCodec(level=1))  # fmt: skip
        z[...] = data
        codec = "zstd 1"
    env = {
        **os.environ,
        "DASK_DASKSTREAM__TUNE__CACHE": str(tmp_path / "tune.json"),
        "DASK_DASKSTREAM__TUNE__CODEC__LEAST_CPU_SHARE": "0",
    }
    run = [sys.executable, "-m", "daskstream", "reduce", path, "--op", "sum"]
    shown = subprocess.run([*run, "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["limit"]["codec"] == codec
    assert report["limit"]["threads"] >= 1
    assert report["limit"]["share"] == pytest.approx(report["GBps"] / report["limit"]["GBps"])
    assert 0 < report["limit"]["share"] < 1.5
    text = subprocess.run([*run, "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert text.returncode == 0, text.stderr
    line = text.stdout.strip()
    assert line.endswith("limit here)")
    assert f"of {codec}" in line


def test_an_encode_limit_is_one_thread_for_hdf5_plugin_filters_and_every_thread_else(tmp_path, cache):
    data = _field()
    path = str(tmp_path / "f.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("zstd", data=data, chunks=(128, 1024), **hdf5plugin.Zstd(clevel=3))
        f.create_dataset("gzip", data=data, chunks=(128, 1024), compression="gzip", compression_opts=1, shuffle=True)
        f.create_dataset("raw", data=data, chunks=(128, 1024))
    zstd = codec_limit(ds.open(path, dataset="zstd"), threads=4, direction="encode")
    # h5py encodes plugin filters in the one writing process; deflate is encoded in every task.
    assert (zstd.codec, zstd.threads, zstd.direction) == ("zstd 3", 1, "encode")
    gzip = codec_limit(ds.open(path, dataset="gzip"), threads=4, direction="encode")
    assert (gzip.codec, gzip.threads) == ("gzip 1 + shuffle", 4)
    assert gzip.beside(gzip.rate / 4).endswith("25% of gzip 1 + shuffle's encode limit here")
    # One measurement gives both: the decode limit of the same data is remembered beside the encode one.
    decode = codec_limit(ds.open(path, dataset="gzip"), threads=4, measure=False)
    assert decode.remembered
    assert decode.direction == "decode"
    assert decode.per_thread != gzip.per_thread
    assert codec_limit(ds.open(path, dataset="raw"), direction="encode") is None  # nothing encodes it
    with pytest.raises(ds.DaskstreamError, match='give "decode" or "encode"'):
        codec_limit(ds.open(path, dataset="raw"), direction="both")


@pytest.mark.parametrize("target", ["out.zarr", "out.h5::/field"])
def test_the_store_command_sets_its_rate_beside_the_encode_limit(tmp_path, target):
    data = np.random.default_rng(0).standard_normal((LIMIT_SHOWN_FROM_BYTES // 4 // 2048, 2048)).astype("f4")
    source = str(tmp_path / "big.npy")
    np.save(source, data.round(2))
    env = {
        **os.environ,
        "DASK_DASKSTREAM__TUNE__CACHE": str(tmp_path / "tune.json"),
        "DASK_DASKSTREAM__TUNE__CODEC__LEAST_CPU_SHARE": "0",
    }
    run = [sys.executable, "-m", "daskstream", "store", source, str(tmp_path / target), "--codec", "gzip"]
    shown = subprocess.run([*run, "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    codec = "gzip 4 + shuffle" if target.endswith("::/field") else "gzip 4"
    assert (report["limit"]["codec"], report["limit"]["direction"]) == (codec, "encode")
    assert report["GBps"] == pytest.approx(report["bytes_in"] / report["seconds"] / 1e9, rel=0.01)
    assert report["limit"]["share"] == pytest.approx(report["GBps"] / report["limit"]["GBps"])
    assert 0 < report["limit"]["share"] < 1.5
    again = subprocess.run([*run, "--overwrite", "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith(f"of {codec}'s encode limit here")
