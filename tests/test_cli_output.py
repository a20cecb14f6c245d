"""What the computing commands print and write: tables a person reads, JSON a program parses, files for arrays.

Each case runs the real command (click's CliRunner, in this process) on a real
file and reads its output as a person or a program would: tables parsed by
their columns, files read back with numpy, zarr and h5py and compared with
numpy's answer.
"""

from __future__ import annotations

import csv
import inspect
import json
import pathlib
import re

import h5py
import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from daskstream.cli import main

_SEPARATE_STDERR = {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner).parameters else {}


def invoke(*args):
    result = CliRunner(**_SEPARATE_STDERR).invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


@pytest.fixture
def field(tmp_path):
    data = np.random.default_rng(5).standard_normal((40, 30)).astype("f4")
    data[3, 4] = np.nan
    path = tmp_path / "field.npy"
    np.save(path, data)
    return path, data


def rows_of(text, columns):
    """The rows of a printed table whose header is ``columns``, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == columns)
    rows = []
    for line in lines[start + 1 :]:
        cells = line.split()
        if len(cells) != len(columns):
            break
        rows.append(cells)
    return rows


def test_a_number_is_printed_in_full(field):
    path, data = field
    result = invoke("reduce", path, "--op", "nanmax", "--quiet")
    assert result.exit_code == 0, result.stderr
    printed = re.search(r"of .*field\.npy: (\S+) \(", result.stdout)
    assert printed is not None, result.stdout
    assert np.float32(printed.group(1)) == np.nanmax(data)


def test_an_array_is_summarised_and_written_whole_with_out(field, tmp_path):
    path, data = field
    result = invoke("reduce", path, "--op", "nanmean", "--axis", "0", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert "(30,) float64: min " in result.stdout
    assert "array(" not in result.stdout
    assert "--out FILE" in result.stdout  # how to get every value
    want = np.nanmean(data.astype("f8"), axis=0)
    for suffix in (".npy", ".csv", ".zarr", ".h5"):
        out = tmp_path / f"mean{suffix}"
        written = invoke("reduce", path, "--op", "nanmean", "--axis", "0", "--quiet", "--out", out)
        assert written.exit_code == 0, written.stderr
        assert f"wrote nanmean (30,) float64 to {out}" in written.stdout
        assert "--out FILE" not in written.stdout
        if suffix == ".npy":
            got = np.load(out)
        elif suffix == ".csv":
            with out.open() as f:
                table = list(csv.DictReader(f))
            assert [int(row["axis 0"]) for row in table] == list(range(30))
            got = np.array([float(row["nanmean"]) for row in table])
        elif suffix == ".zarr":
            got = zarr.open_group(str(out), mode="r")["nanmean"][...]
        else:
            with h5py.File(out, "r") as f:
                got = f["nanmean"][...]
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # Written again, the file is replaced, as a shell's > replaces it.
    again = invoke("reduce", path, "--op", "nanmin", "--axis", "1", "--quiet", "--out", tmp_path / "mean.zarr")
    assert again.exit_code == 0, again.stderr
    assert list(zarr.open_group(str(tmp_path / "mean.zarr"), mode="r").array_keys()) == ["nanmin"]


def test_a_few_values_are_printed_as_a_table(tmp_path):
    path = tmp_path / "small.npy"
    data = np.arange(12.0).reshape(3, 4)
    np.save(path, data)
    result = invoke("reduce", path, "--op", "sum", "--axis", "1", "--quiet")
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["axis", "0", "sum"])
    rows = [line.split() for line in lines[header + 1 : header + 4]]
    assert rows == [[str(i), str(v)] for i, v in enumerate(data.sum(axis=1))]


def test_quantiles_are_a_table_of_q_and_value(field):
    path, data = field
    clean = np.nan_to_num(data)
    np.save(path, clean)
    result = invoke("reduce", path, "--op", "quantile", "--q", "0.1", "--q", "0.9", "--quiet")
    rows = rows_of(result.stdout, ["q", "value"])
    assert [float(q) for q, _ in rows] == [0.1, 0.9]
    # As printed: the shortest text of each value, read back (exactness is the quantile tests' concern).
    assert [float(v) for _, v in rows] == pytest.approx(np.quantile(clean, [0.1, 0.9]).tolist(), rel=1e-6)


def test_a_histogram_is_a_table_of_bins(field, tmp_path):
    path, data = field
    clean = np.nan_to_num(data)
    np.save(path, clean)
    result = invoke("reduce", path, "--op", "histogram", "--bins", "6", "--quiet")
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result.stdout, ["low", "high", "count"])
    counts, edges = np.histogram(clean, bins=6)
    assert [int(c) for _, _, c in rows] == counts.tolist()
    np.testing.assert_allclose([float(low) for low, _, _ in rows], edges[:-1], rtol=1e-5)
    # Two arrays: a .npy file cannot hold them, which is said before anything is read.
    refused = invoke("reduce", path, "--op", "histogram", "--quiet", "--out", tmp_path / "h.npy")
    assert refused.exit_code == 2
    assert "counts, edges" in refused.stderr
    assert not (tmp_path / "h.npy").exists()
    written = invoke("reduce", path, "--op", "histogram", "--bins", "6", "--quiet", "--out", tmp_path / "h.h5")
    assert written.exit_code == 0, written.stderr
    with h5py.File(tmp_path / "h.h5", "r") as f:
        assert f["counts"][...].tolist() == counts.tolist()
        np.testing.assert_array_equal(f["edges"][...], edges)


def test_describe_prints_a_table_that_says_what_it_describes(field):
    path, data = field
    result = invoke("describe", path, "--bins", "4", "--quartiles", "--quiet")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"describe of {path} (40, 30) float32, over all axes"
    assert "Description(" not in result.stdout
    stats = dict(line.split() for line in lines[1:10])
    assert list(stats) == ["count", "nan_count", "mean", "std", "min", "25%", "50%", "75%", "max"]
    assert int(stats["count"]) == data.size - 1
    assert float(stats["50%"]) == pytest.approx(float(np.nanquantile(data, 0.5)), rel=1e-5)
    # --bins without --range: the bins span the data's range, as reduce's histogram does.
    counts = [int(line.split()[-1]) for line in lines[11:15]]
    assert counts == np.histogram(data[~np.isnan(data)], bins=4)[0].tolist()


def test_describe_over_an_axis_is_a_line_per_statistic_and_a_file(field, tmp_path):
    path, data = field
    out = tmp_path / "stats.zarr"
    result = invoke("describe", path, "--axis", "0", "--quiet", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "over axis 0, per position of the other axes (30,)" in result.stdout
    assert len(result.stdout.splitlines()) == 1 + 6 + 1  # title, six statistics, what was written
    group = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(group["max"][...], np.nanmax(data, axis=0))
    np.testing.assert_array_equal(group["count"][...], np.sum(~np.isnan(data), axis=0))


def test_describe_json_names_the_array_and_out_npy_is_refused_before_reading(field, tmp_path):
    path, data = field
    report = json.loads(invoke("describe", path, "--json", "--quiet").stdout)
    assert report["name"] == str(path)
    assert report["shape"] == [40, 30]
    assert report["dtype"] == "float32"
    assert report["count"] == data.size - 1
    refused = invoke("describe", path, "--quiet", "--out", tmp_path / "stats.npy")
    assert refused.exit_code == 2
    assert "count, nan_count, mean, std, min, max" in refused.stderr
    bad = invoke("describe", path, "--quiet", "--out", tmp_path / "stats.txt")
    assert bad.exit_code == 2
    assert ".npy, .csv, .zarr, .h5" in bad.stderr


def test_help_shows_whole_summaries_and_examples():
    top = invoke("--help").stdout
    commands = top[top.index("Commands:") :]
    assert "..." not in commands  # no summary cut short
    for command in ("reduce", "describe", "store", "convert", "info", "plan", "tune"):
        assert "Examples:" in invoke(command, "--help").stdout, command


def test_store_and_convert_take_the_same_codec_option(field, tmp_path):
    path, data = field
    stored = invoke("store", path, tmp_path / "a.h5::/x", "--codec", "gzip", "--quiet", "--json")
    assert stored.exit_code == 0, stored.stderr
    summary = json.loads(stored.stdout)
    assert summary["target"] == f"{tmp_path / 'a.h5'}::/x"
    assert summary["blocks_written"] == summary["blocks"] > 0
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert f["x"].compression == "gzip"
        np.testing.assert_array_equal(f["x"][...], data)


@pytest.mark.parametrize("codec", ["gzip", "zstd", "lz4", "none"])
@pytest.mark.parametrize("target", ["v3.zarr", "v2.zarr", "out.h5::/x"])
def test_every_codec_name_help_offers_stores_into_every_target_it_applies_to(field, tmp_path, codec, target):
    path, data = field
    options = ["--zarr-format", "2"] if target.startswith("v2") else []
    stored = invoke("store", path, tmp_path / target, "--codec", codec, "--quiet", *options)
    assert stored.exit_code == 0, stored.stderr
    if target.endswith(".zarr"):
        array = zarr.open_array(str(tmp_path / target), mode="r")
        names = " ".join(type(c).__name__.lower() for c in array.compressors)
        assert (codec == "none" and not array.compressors) or {"lz4": "blosc"}.get(codec, codec) in names
        np.testing.assert_array_equal(array[...], data)
    else:
        with h5py.File(tmp_path / "out.h5", "r") as f:
            filters = {"gzip": "gzip", "zstd": "32015", "lz4": "32001", "none": None}[codec]
            assert (filters is None and not f["x"]._filters) or filters in f["x"]._filters
            np.testing.assert_array_equal(f["x"][...], data)


def test_an_hdf5_filter_name_into_a_zarr_target_is_one_clear_line(field, tmp_path):
    path, _ = field
    refused = invoke("store", path, tmp_path / "t.zarr", "--codec", "lzf", "--quiet")
    assert refused.exit_code == 2
    assert refused.stderr.strip() == (
        "daskstream: error: codec 'lzf' is an HDF5 filter; a Zarr target takes zstd, lz4 or gzip"
    )
    assert not (tmp_path / "t.zarr").exists()


# --out never loses data: not onto what the command reads (any spelling), never over a folder of the
# user's, and the old file stays whole until the new one is.


def _sources(tmp_path):
    data = np.arange(24.0).reshape(4, 6)
    np.save(tmp_path / "src.npy", data)
    zarr.save_array(str(tmp_path / "src.zarr"), data)
    group = zarr.open_group(str(tmp_path / "tree.zarr"), mode="w")
    group.create_array("x", data=data)
    group.create_array("y", data=data * 2)
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f["x"] = data
        f["other"] = np.ones(3)
    return data


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


_ALIASES = [
    ("src.npy", "src.npy"),
    ("src.npy", "./src.npy"),
    ("src.npy", "sub/../src.npy"),
    ("src.npy", "link.npy"),  # a symbolic link to the source
    ("src.npy", "hard.npy"),  # a hard link of the source
    ("src.zarr", "src.zarr"),
    ("src.zarr", "src.zarr/"),
    ("tree.zarr::x", "tree.zarr"),  # the store around the array read
    ("tree.zarr::x", "tree.zarr/x/c/r.h5"),  # inside the array read
    ("src.h5::/x", "src.h5"),  # the whole file holding the dataset read (and another one)
    ("src.h5::/x", "linkdir/src.h5"),  # through a linked folder
]


@pytest.mark.parametrize(
    ("command", "source", "out"),
    # describe's several statistics do not go in a .npy file, which is refused before anything else.
    [(c, s, o) for c in ("reduce", "describe") for s, o in _ALIASES if not (c == "describe" and o.endswith(".npy"))],
)
def test_out_onto_what_the_command_reads_is_refused_and_nothing_changes(tmp_path, command, source, out):
    _sources(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.npy").symlink_to(tmp_path / "src.npy")
    (tmp_path / "hard.npy").hardlink_to(tmp_path / "src.npy")
    (tmp_path / "linkdir").symlink_to(tmp_path)
    before = _snapshot(tmp_path)
    args = ["--op", "sum", "--axis", "0"] if command == "reduce" else ["--axis", "0"]
    suffix = pathlib.PurePath(out.rstrip("/")).suffix
    result = invoke(command, f"{tmp_path}/{source}", *args, "--quiet", "--out", f"{tmp_path}/{out}")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    line = result.stderr.strip()
    assert line.startswith("daskstream: error: --out ")
    assert "\n" not in line
    assert "destroy the data it reads" in line, line
    assert _snapshot(tmp_path) == before
    assert suffix  # every case names a format --out writes


def test_out_never_deletes_a_folder_of_the_users(tmp_path):
    _sources(tmp_path)
    keep = tmp_path / "x.npy" / "sub" / "keep"
    keep.parent.mkdir(parents=True)
    keep.write_text("k")
    refused = invoke("reduce", tmp_path / "src.npy", "--op", "sum", "--axis", "0", "--quiet", "--out", keep.parents[1])
    assert refused.exit_code == 2
    assert "a folder is there" in refused.stderr
    assert keep.read_text() == "k"
    # A Zarr folder --out did not write (here: the user's own store) is not replaced either ...
    theirs = tmp_path / "theirs.zarr"
    zarr.save_array(str(theirs), np.ones(3))
    before = _snapshot(theirs)
    refused = invoke("reduce", tmp_path / "src.npy", "--op", "sum", "--axis", "0", "--quiet", "--out", theirs)
    assert refused.exit_code == 2
    assert "daskstream replaces a folder only" in refused.stderr
    assert _snapshot(theirs) == before
    # ... nor one --out wrote and the user then added to.
    ours = tmp_path / "ours.zarr"
    assert invoke("reduce", tmp_path / "src.npy", "--op", "sum", "--axis", "0", "--quiet", "--out", ours).exit_code == 0
    (ours / "notes.txt").write_text("mine")
    refused = invoke("reduce", tmp_path / "src.npy", "--op", "max", "--axis", "0", "--quiet", "--out", ours)
    assert refused.exit_code == 2
    assert (ours / "notes.txt").read_text() == "mine"
    assert zarr.open_array(str(ours / "sum"), mode="r").shape == (6,)


def test_out_over_a_file_keeps_its_permissions_and_a_link_keeps_what_it_points_to(tmp_path):
    data = _sources(tmp_path)
    out = tmp_path / "sum.npy"
    out.write_bytes(b"old")
    out.chmod(0o640)
    assert invoke("reduce", tmp_path / "src.npy", "--op", "sum", "--axis", "0", "--quiet", "--out", out).exit_code == 0
    np.testing.assert_array_equal(np.load(out), data.sum(axis=0))
    assert out.stat().st_mode & 0o777 == 0o640
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("keep")
    (tmp_path / "link.npy").symlink_to(elsewhere)
    result = invoke(
        "reduce", tmp_path / "src.npy", "--op", "sum", "--axis", "0", "--quiet", "--out", tmp_path / "link.npy"
    )
    assert result.exit_code == 0, result.stderr
    assert elsewhere.read_text() == "keep"
    np.testing.assert_array_equal(np.load(tmp_path / "link.npy"), data.sum(axis=0))


def test_a_failed_out_leaves_the_old_file_whole_and_no_partial_file(tmp_path):
    _sources(tmp_path)
    out = tmp_path / "stats.csv"
    out.write_text("old results\n")
    # describe over axis 0 gives statistics of one shape, and a histogram of another: a .csv table cannot
    # hold both, which is found only once the result is computed.
    result = invoke("describe", tmp_path / "src.npy", "--axis", "0", "--bins", "4", "--quiet", "--out", out)
    assert result.exit_code == 2, result.stdout
    assert out.read_text() == "old results\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_out_into_a_missing_folder_or_a_url_is_one_clear_line(tmp_path):
    _sources(tmp_path)
    for out, says in [(tmp_path / "no" / "such.npy", "does not exist"), ("s3://bucket/x.npy", "writes a local file")]:
        result = invoke("reduce", tmp_path / "src.npy", "--op", "sum", "--axis", "0", "--quiet", "--out", out)
        assert result.exit_code == 2
        assert says in result.stderr
        assert result.stderr.count("\n") == 1
