"""The ``daskstream`` command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "daskstream", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_writes_opens_plans_and_reduces(tmp_path):
    done = run("demo", "--size", "8MiB", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for fmt, name in (("npy", "field.npy"), ("hdf5", "field.h5"), ("zarr", "field.zarr")):
        assert f"== {fmt}:" in done.stdout
        assert (tmp_path / name).exists()
    assert done.stdout.count("Chunk plan for") == 3
    assert done.stdout.count("GB/s") == 3
    # The three formats hold the same data, so the three sums printed agree.
    sums = {line.split("sum = ")[1].split(",")[0] for line in done.stdout.splitlines() if line.startswith("sum = ")}
    assert len(sums) == 1


def test_demo_default_folder_is_temporary_and_removed():
    done = run("demo", "--size", "4MiB", "--formats", "npy")
    assert done.returncode == 0, done.stderr
    folder = done.stdout.split(" to ")[1].split("/field.npy")[0]
    import os

    assert not os.path.exists(folder)


def test_plan_json(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1000, 100), dtype="f4"))
    done = run("plan", str(tmp_path / "a.npy"), "--memory-budget", "1MiB", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["format"] == "npy"
    assert out["shape"] == [1000, 100]
    assert out["projected_peak_bytes"] <= 2**20
    assert sum(1 for _ in range(out["n_tasks"])) >= 2


def test_plan_for_threads_workers_and_budget_given_on_the_command_line(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4000, 1000), dtype="f4"))
    done = run("plan", str(tmp_path / "a.npy"), "--budget", "8MiB", "--threads", "4", "--workers", "3", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["memory_budget"], out["threads"], out["workers"]) == (8 * 2**20, 4, 3)
    # Four tasks at a time share a worker's 8 MiB.
    assert out["projected_peak_bytes"] <= 8 * 2**20
    assert out["n_tasks"] >= 4 * 3


@pytest.mark.parametrize("command", [[], ["demo"], ["plan"]], ids=["main", "demo", "plan"])
def test_help(command):
    done = run(*command, "--help")
    assert done.returncode == 0
    assert "Usage:" in done.stdout


def test_unknown_demo_format_is_a_usage_error():
    done = run("demo", "--formats", "tiff")
    assert done.returncode == 2
    assert "tiff" in done.stderr


def test_store_copies_finds_itself_complete_and_refuses_other_data(tmp_path):
    data = np.arange(3000, dtype="f4").reshape(300, 10)
    np.save(tmp_path / "a.npy", data)
    target = tmp_path / "out.zarr"
    done = run("store", str(tmp_path / "a.npy"), str(target), "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{tmp_path / 'a.npy'} -> {target}: ")
    assert " blocks written, 11.72 kiB in, " in done.stdout
    import zarr

    np.testing.assert_array_equal(zarr.open_array(target, mode="r")[...], data)
    chunk_files = {p: p.stat().st_mtime_ns for p in target.rglob("*") if p.is_file()}
    # Run again, as a script that re-runs it would: complete, nothing written, status 0.
    again = run("store", str(tmp_path / "a.npy"), str(target), "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["already_complete"] is True
    assert summary["blocks_written"] == 0
    assert summary["blocks"] >= 1
    assert summary["bytes_in"] == data.nbytes
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*") if p.is_file()} == chunk_files
    # Other data into the same target: one line, exit 2, naming the target and saying what to do.
    np.save(tmp_path / "b.npy", data + 1)
    other = run("store", str(tmp_path / "b.npy"), str(target), "--quiet")
    assert other.returncode == 2
    assert len(other.stderr.strip().splitlines()) == 1
    assert "out.zarr holds a finished store of another computation" in other.stderr
    assert "overwrite" in other.stderr


def test_convert_into_a_finished_target_in_other_chunks_says_what_it_would_rewrite(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3000, dtype="f4").reshape(300, 10))
    target = f"{tmp_path}/out.h5::/x"
    assert run("convert", str(tmp_path / "a.npy"), target, "--chunks", "100,10", "--quiet").returncode == 0
    done = run("convert", str(tmp_path / "a.npy"), target, "--chunks", "50,10", "--quiet")
    assert done.returncode == 2
    assert "in chunks (100, 10), but the array stored now has chunks (50, 10)" in done.stderr
    assert "--overwrite" in done.stderr
    done = run("convert", str(tmp_path / "a.npy"), target, "--chunks", "50,10", "--quiet", "--overwrite", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["blocks_written"] == 6


@pytest.fixture
def field_npy(tmp_path):
    data = np.random.default_rng(3).standard_normal((400, 30)).astype("f4")
    data[5, 5] = np.nan
    np.save(tmp_path / "f.npy", data)
    return tmp_path / "f.npy", data


def test_info_json(field_npy):
    path, data = field_npy
    done = run("info", str(path), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["format"], out["shape"], out["dtype"], out["nbytes"]) == ("npy", [400, 30], "float32", data.nbytes)
    assert out["layout"] == "C"
    assert out["storage_chunks"] is None


@pytest.mark.parametrize(
    ("args", "oracle"),
    [
        (["--op", "nanmean", "--axis", "0"], lambda a: np.nanmean(a.astype("f8"), axis=0)),
        (["--op", "max", "--axis", "1"], lambda a: np.max(a, axis=1)),
        (["--op", "quantile", "--q", "0.1", "--q", "0.9"], lambda a: np.quantile(a, [0.1, 0.9])),
        (["--op", "nanstd", "--ddof", "1"], lambda a: np.nanstd(a.astype("f8"), ddof=1)),
    ],
    ids=["nanmean-axis0", "max-axis1", "quantiles", "nanstd"],
)
def test_reduce_json_matches_numpy(field_npy, args, oracle):
    path, data = field_npy
    done = run("reduce", str(path), *args, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    with np.errstate(all="ignore"):
        want = oracle(data)
    np.testing.assert_allclose(np.array(out["result"], dtype="f8"), want, rtol=1e-6, equal_nan=True)
    assert out["seconds"] >= 0
    # One pass over the file: the exact quantiles' values fit one task, selected there as numpy does.
    assert out["bytes_read"] == data.nbytes


def test_describe_json(field_npy):
    path, data = field_npy
    done = run("describe", str(path), "--bins", "4", "--range", "-2", "2", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    valid = data[~np.isnan(data)]
    assert (out["count"], out["nan_count"]) == (valid.size, 1)
    assert out["mean"] == pytest.approx(valid.astype("f8").mean(), rel=1e-9)
    assert out["histogram"] == np.histogram(valid, bins=4, range=(-2, 2))[0].tolist()


@pytest.mark.parametrize(("budget", "passes"), [("64MiB", 1), ("256KiB", 4)])
def test_reduce_json_says_how_many_passes_it_made(field_npy, budget, passes):
    path, data = field_npy
    done = run("reduce", str(path), "--op", "median", "--budget", budget, "--json", "--quiet")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # An exact median of float32 values: where they fit a task, numpy's selection after one read; where
    # they do not, a radix select's four passes of 8-bit digits, each reading the whole array.
    np.testing.assert_equal(out["result"], float(np.median(data)))  # NaN: the data hold one
    assert out["passes"] == passes
    assert out["bytes_read"] == passes * data.nbytes


def test_reduce_unknown_op_is_one_line_exit_2(field_npy):
    path, _ = field_npy
    done = run("reduce", str(path), "--op", "average")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "average" in done.stderr
    assert "median" in done.stderr


@pytest.mark.parametrize(
    ("target", "codec", "chunks", "storage_word"),
    [
        ("out.zarr", "lz4", "100,30", "blosc"),
        ("out.zarr", "zstd", "auto", "zstd"),
        ("out.h5::/x", "gzip", "50,30", "deflate"),
        ("out.h5::/x", "zstd", "storage", "zstd"),
    ],
    ids=["zarr-lz4", "zarr-zstd", "hdf5-gzip", "hdf5-zstd"],
)
def test_convert_reencodes_with_new_chunks(tmp_path, target, codec, chunks, storage_word):
    data = np.random.default_rng(8).standard_normal((400, 30)).astype("f4")
    if chunks == "storage":
        import zarr

        src = zarr.create_array(tmp_path / "src.zarr", shape=data.shape, chunks=(80, 30), dtype="f4")
        src[...] = data
        source = str(tmp_path / "src.zarr")
    else:
        np.save(tmp_path / "src.npy", data)
        source = str(tmp_path / "src.npy")
    out = f"{tmp_path}/{target}"
    done = run("convert", source, out, "--codec", codec, "--chunks", chunks, "--quiet")
    assert done.returncode == 0, done.stderr
    info = json.loads(run("info", out, "--json").stdout)
    assert storage_word in info["storage"]
    if chunks not in ("auto", "storage"):
        assert info["storage_chunks"] == [int(c) for c in chunks.split(",")]
    if chunks == "storage":
        assert info["storage_chunks"] == [80, 30]
    import daskstream as ds

    np.testing.assert_array_equal(ds.open(out).compute(), data)


@pytest.mark.parametrize(
    ("name", "expected"), [("slurm.yaml", "#SBATCH"), ("pbs.yaml", "#PBS"), ("kubernetes.yaml", "DaskCluster")]
)
def test_cluster_check_prints_what_would_be_submitted(repo_root, name, expected):
    # Their schedulers listen on the network by design: checking them takes the same consent as running them.
    done = run("cluster", "check", "--allow-network-listen", str(repo_root / "cluster-configs" / name))
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_cluster_check_of_a_missing_file_is_one_line(tmp_path):
    done = run("cluster", "check", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "nope.yaml" in done.stderr


# --- where the work runs ------------------------------------------------------------------------


def _address(scheduler_file) -> str:
    return json.loads(scheduler_file.read_text())["address"]


@pytest.mark.parametrize("kind", ["hdf5-chunked", "zarr-v3-sharded"])
def test_reduce_and_describe_on_a_running_cluster_by_address(dask_cluster, sample_files, kind):
    path, data = sample_files[kind]
    address = _address(dask_cluster)
    done = run("reduce", path, "--op", "std", "--axis", "1", "--scheduler", address, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    np.testing.assert_allclose(out["result"], data.astype("f8").std(axis=1), rtol=1e-6)
    # The workers read the file; their counters were asked.
    assert out["bytes_read"] == data.nbytes
    assert out["scheduler"] == address
    described = run("describe", path, "--scheduler", address, "--json", "--quiet")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["max"] == pytest.approx(float(data.max()))


def test_store_on_a_running_cluster_writes_what_numpy_reads(dask_cluster, sample_files, tmp_path):
    import zarr

    path, data = sample_files["hdf5-chunked"]
    done = run("store", path, str(tmp_path / "copy.zarr"), "--scheduler", _address(dask_cluster), "--quiet")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "copy.zarr")[...], data)


@pytest.mark.parametrize("scheduler", ["sync", "processes"])
def test_local_schedulers_give_numpys_answer_and_count_what_they_read(tmp_path, scheduler):
    data = np.random.default_rng(9).standard_normal((500, 40)).astype("f4")
    np.save(tmp_path / "a.npy", data)
    done = run("reduce", str(tmp_path / "a.npy"), "--op", "median", "--scheduler", scheduler, "--budget", "256KiB",
               "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["result"] == float(np.median(data))
    # Four radix passes of 8-bit digits over float32 (a budget the values do not fit a task of); the
    # processes' reads are counted too.
    assert out["bytes_read"] == 4 * data.nbytes


def test_cluster_file_starts_its_cluster_for_the_command_and_progress_goes_to_stderr(repo_root, tmp_path):
    data = np.random.default_rng(5).standard_normal((3000, 200))
    np.save(tmp_path / "a.npy", data)
    done = run("reduce", str(tmp_path / "a.npy"), "--op", "mean", "--cluster", str(repo_root / "cluster-configs" / "local.yaml"),
               "--json", "--budget", "64MiB")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)  # stdout holds the JSON alone
    assert out["result"] == pytest.approx(data.mean(), rel=1e-12)
    assert out["scheduler"].endswith("local.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheduler", "tcp://127.0.0.1:1"], "no dask scheduler answered at tcp://127.0.0.1:1"),
        (["--scheduler", "gpu"], "--scheduler gpu is not known"),
        (["--scheduler", "threads", "--cluster", "local.yaml"], "give one of them"),
        (["--cluster", "no-such-cluster.yaml"], "no-such-cluster.yaml"),
        (["--budget", "lots"], "--memory-budget lots is not a size"),
        # A budget so small the computation would have more tasks than the ceiling: refused before it runs.
        (["--budget", "100"], "tasks, more than the 1,000 whose graph the client and scheduler may hold at once"),
    ],
    ids=["nothing-listening", "unknown-scheduler", "both", "missing-cluster-file", "bad-budget", "tiny-budget"],
)
def test_bad_places_to_run_are_one_line_exit_2(field_npy, args, message, monkeypatch):
    path, _ = field_npy
    monkeypatch.setenv("DASK_DASKSTREAM__PLANNING__MAX_TASKS", "1000")
    done = run("reduce", str(path), "--op", "sum", *args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert message in done.stderr


@pytest.mark.parametrize(
    ("codec", "level"), [("zstd", 10), ("zstd", 22), ("zstd", -5), ("lz4", 9), ("lz4", 0), ("gzip", 9)]
)
@pytest.mark.parametrize("target", ["out.zarr", "out.h5::/x"])
def test_convert_writes_any_level_its_codec_takes(tmp_path, target, codec, level):
    data = np.random.default_rng(3).standard_normal((200, 30)).astype("f4")
    np.save(tmp_path / "src.npy", data)
    out = f"{tmp_path}/{target}"
    done = run("convert", str(tmp_path / "src.npy"), out, "--codec", codec, "--level", str(level), "--quiet")
    assert done.returncode == 0, done.stderr
    import daskstream as ds

    np.testing.assert_array_equal(ds.open(out).compute(), data)
    assert _stored_level(out, codec) == level


_WITHOUT_HDF5PLUGIN = """
import sys
sys.modules["hdf5plugin"] = None  # installed, but not importable here
from daskstream.cli import main
main()
"""


def test_convert_to_hdf5_with_a_plugin_codec_and_no_plugin_says_what_to_install(tmp_path):
    np.save(tmp_path / "src.npy", np.zeros((20, 3), dtype="f4"))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_HDF5PLUGIN, "convert", str(tmp_path / "src.npy"), f"{tmp_path}/out.h5::/x",
         "--codec", "zstd", "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--codec zstd for an HDF5 target needs hdf5plugin>=7" in done.stderr
    assert "pip install 'daskstream[hdf5plugin]'" in done.stderr
    assert not (tmp_path / "out.h5").exists()


def _stored_level(out: str, codec: str) -> int:
    """The compression level the file records for ``codec``."""
    if "::" not in out:
        import zarr
        import zarr.codecs

        kind = {"zstd": zarr.codecs.ZstdCodec, "lz4": zarr.codecs.BloscCodec, "gzip": zarr.codecs.GzipCodec}[codec]
        (stored,) = [c for c in zarr.open_array(out).metadata.codecs if isinstance(c, kind)]
        return stored.clevel if codec == "lz4" else stored.level
    import h5py

    path, name = out.split("::")
    with h5py.File(path, "r") as f:
        plist = f[name].id.get_create_plist()
        filters = {plist.get_filter(i)[0]: plist.get_filter(i)[2] for i in range(plist.get_nfilters())}
    if codec == "gzip":
        return filters[h5py.h5z.FILTER_DEFLATE][0]
    if codec == "zstd":  # hdf5plugin.Zstd keeps the level as an unsigned 32-bit int
        return int(np.array(filters[32015][0], dtype="u4").view("i4"))
    return filters[32001][4]  # hdf5plugin.Blosc: (..., clevel, shuffle, compressor)


def test_demo_makes_its_folder_when_missing(tmp_path):
    folder = tmp_path / "new" / "nested"
    done = run("demo", "--size", "1MiB", "--formats", "npy", "--dir", str(folder))
    assert done.returncode == 0, done.stderr
    assert (folder / "field.npy").exists()


def test_demo_never_replaces_a_file_in_the_folder_given(tmp_path):
    precious = np.arange(10.0)
    np.save(tmp_path / "field.npy", precious)
    done = run("demo", "--size", "1MiB", "--formats", "npy", "--dir", str(tmp_path))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "field.npy" in done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "field.npy"), precious)


def test_convert_into_shards_from_the_command_line(tmp_path):
    import zarr

    data = np.random.default_rng(9).standard_normal((256, 64)).astype("f4")
    np.save(tmp_path / "src.npy", data)
    out = str(tmp_path / "sharded.zarr")
    done = run("convert", str(tmp_path / "src.npy"), out, "--chunks", "128,64", "--inner-chunks", "32,32", "--quiet")
    assert done.returncode == 0, done.stderr
    array = zarr.open_array(out, mode="r")
    assert (array.shards, array.chunks) == ((128, 64), (32, 32))
    np.testing.assert_array_equal(array[...], data)
    bad = run("convert", str(tmp_path / "src.npy"), str(tmp_path / "b.zarr"), "--inner-chunks", "32,0")
    assert bad.returncode == 2
    assert "--inner-chunks" in bad.stderr
