"""Bad input: each case raises a DaskstreamError subclass (and the matching builtin) naming the input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import h5py
import numpy as np
import pytest
import zarr

import daskstream as ds
from daskstream import errors

# ---------------------------------------------------------------------------
# Builders: each writes one bad input into ``tmp`` and returns (call, text the message must contain).


def missing_path(tmp):
    return lambda: ds.open(tmp / "nope.npy"), "nope.npy"


def missing_path_with_dataset(tmp):
    return lambda: ds.open(f"{tmp}/nope.h5::/x"), "nope.h5"


def plain_directory(tmp):
    (tmp / "plain").mkdir()
    return lambda: ds.open(tmp / "plain"), "plain"


def unknown_format(tmp):
    (tmp / "notes.txt").write_text("hello, not an array")
    return lambda: ds.open(tmp / "notes.txt"), "notes.txt"


def empty_file(tmp):
    (tmp / "empty.npy").write_bytes(b"")
    return lambda: ds.open(tmp / "empty.npy"), "empty.npy"


def truncated_npy(tmp):
    np.save(tmp / "t.npy", np.zeros((100, 100)))
    with open(tmp / "t.npy", "r+b") as f:
        f.truncate(4000)
    # Caught at open from the file size, not later in a task.
    return lambda: ds.open_source(tmp / "t.npy"), "t.npy"


def garbage_npy_header(tmp):
    (tmp / "g.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'nonsense': 1}  \n" + b"\0" * 64)
    return lambda: ds.open(tmp / "g.npy"), "g.npy"


def misnamed_h5(tmp):
    (tmp / "fake.h5").write_bytes(b"this is not hdf5" * 10)
    return lambda: ds.open(tmp / "fake.h5"), "fake.h5"


def truncated_h5(tmp):
    with h5py.File(tmp / "t.h5", "w") as f:
        f["x"] = np.arange(10000.0)
    size = os.path.getsize(tmp / "t.h5")
    with open(tmp / "t.h5", "r+b") as f:
        f.truncate(size // 2)
    return lambda: ds.open(f"{tmp}/t.h5::/x"), "t.h5"


def object_npy(tmp):
    np.save(tmp / "o.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    return lambda: ds.open(tmp / "o.npy"), "o.npy"


def ragged_h5(tmp):
    # Variable-length sequences of numbers (strings are read: tests/sources/test_strings.py).
    with h5py.File(tmp / "r.h5", "w") as f:
        ragged = f.create_dataset("ragged", shape=(2,), dtype=h5py.vlen_dtype(np.int32))
        ragged[0], ragged[1] = np.arange(3), np.arange(5)
    return lambda: ds.open(f"{tmp}/r.h5::/ragged"), "ragged"


def vlen_bytes_zarr(tmp):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: the format 3 spec for variable-length bytes is not settled
        a = zarr.create_array(tmp / "b.zarr", shape=(2,), dtype="variable_length_bytes")
    a[...] = np.array([b"a", b"bb"], dtype=object)
    return lambda: ds.open(tmp / "b.zarr"), "b.zarr"


def missing_h5_dataset(tmp):
    with h5py.File(tmp / "m.h5", "w") as f:
        f["entry/data"] = np.zeros(3)
        f["entry/mask"] = np.zeros(3)
    # The message lists what the file does have.
    return lambda: ds.open(tmp / "m.h5", dataset="/entry/dat"), "/entry/data, /entry/mask"


def ambiguous_h5(tmp):
    with h5py.File(tmp / "two.h5", "w") as f:
        f["a"] = np.zeros(3)
        f["b"] = np.zeros(3)
    return lambda: ds.open(tmp / "two.h5"), "/a, /b"


def h5_group(tmp):
    with h5py.File(tmp / "g.h5", "w") as f:
        f["entry/data"] = np.zeros(3)
    return lambda: ds.open(f"{tmp}/g.h5::/entry"), "/entry/data"


def missing_zarr_member(tmp):
    g = zarr.open_group(tmp / "g.zarr", mode="w")
    g.create_array("temperature", shape=(3,), dtype="f4")
    return lambda: ds.open(tmp / "g.zarr", dataset="pressure"), "temperature"


def zarr_group(tmp):
    g = zarr.open_group(tmp / "g.zarr", mode="w")
    g.create_array("sub/x", shape=(3,), dtype="f4")
    return lambda: ds.open(f"{tmp}/g.zarr::sub"), "sub/x"


def zarr_broken_metadata(tmp):
    zarr.create_array(tmp / "b.zarr", shape=(3,), dtype="f4")
    (tmp / "b.zarr" / "zarr.json").write_text("{ not json")
    return lambda: ds.open(tmp / "b.zarr"), "b.zarr"


def dataset_for_npy(tmp):
    np.save(tmp / "a.npy", np.zeros(3))
    return lambda: ds.open(tmp / "a.npy", dataset="x"), "a.npy"


def dataset_twice(tmp):
    with h5py.File(tmp / "a.h5", "w") as f:
        f["x"] = np.zeros(3)
    return lambda: ds.open(f"{tmp}/a.h5::/x", dataset="/y"), "a.h5"


def budget(value):
    def build(tmp):
        np.save(tmp / "a.npy", np.zeros(3))
        return lambda: ds.open(tmp / "a.npy", memory_budget=value), repr(value)

    return build


def chunks(value):
    def build(tmp):
        np.save(tmp / "a.npy", np.zeros((4, 4)))
        return lambda: ds.open(tmp / "a.npy", chunks=value), "a.npy"

    return build


def plan_axis(tmp):
    return lambda: ds.plan_chunks((4, 4), "f4", reduce_axis=5, memory_budget="1MiB", threads=1, workers=1), "axis 5"


def _small_npy(tmp):
    path = tmp / "small.npy"
    np.save(path, np.ones((8, 8)))
    return str(path)


def quantile_outside(tmp):
    path = _small_npy(tmp)
    return lambda: ds.reduce(ds.open(path), "quantile", q=1.5).compute(), "1.5"


def reduce_axis(tmp):
    path = _small_npy(tmp)
    return lambda: ds.reduce(ds.open(path), "sum", axis=3), "axis 3"


def kernel_changes_shape(tmp):
    path = _small_npy(tmp)
    return lambda: ds.map_blocks(lambda b: b[:-1], ds.open(path, chunks=(4, 8)), dtype="f8").compute(), "(3, 8)"


def stream_axis(tmp):
    path = _small_npy(tmp)
    return lambda: ds.stream(path, axis=5), "axis=5"


def budget_below_one_element(tmp):
    path = _small_npy(tmp)
    return lambda: ds.open(path, memory_budget=10), "10 B"


def halo_too_deep(tmp):
    path = tmp / "wide.npy"
    np.save(path, np.zeros((256, 256), dtype="f4"))
    return lambda: ds.map_blocks(lambda b: b, ds.open(path, memory_budget="64KiB"), depth=100), "halo of (100, 100)"


def composition_too_big(tmp):
    path = tmp / "wide.npy"
    np.save(path, np.zeros((256, 256), dtype="f4"))
    x = ds.open(path, chunks=(256, 256), memory_budget="64KiB")
    return lambda: (x - x.mean()).std().compute(), "over its memory budget of 64.00 kiB"


def stream_window_too_big(tmp):
    path = _small_npy(tmp)
    return lambda: ds.stream(path, shuffle=True, shuffle_blocks=8, memory_budget=600), "shuffle window"


def tune_unknown_op(tmp):
    path = _small_npy(tmp)
    return lambda: ds.tune(path, op="average"), "average"


def huge_zarr_shape(tmp):
    # Legal metadata (sparse arrays are real): refused at once, without listing a billion chunks.
    zarr.create_array(tmp / "huge.zarr", shape=(10**18,), chunks=(1000,), dtype="u1")
    return lambda: ds.open(tmp / "huge.zarr"), "tasks"


def huge_zarr_storage_chunks(tmp):
    zarr.create_array(tmp / "huge.zarr", shape=(10**12,), chunks=(1000,), dtype="u1")
    return lambda: ds.open(tmp / "huge.zarr", chunks="storage"), "huge.zarr"


def too_many_dimensions(tmp):
    zarr.create_array(tmp / "dims.zarr", shape=(1,) * 2000, chunks=(1,) * 2000, dtype="u1")
    return lambda: ds.open(tmp / "dims.zarr"), "2000 dimensions"


def too_many_dimensions_npy(tmp):
    header = {"descr": "<f8", "fortran_order": False, "shape": (1,) * 70}
    with open(tmp / "dims.npy", "wb") as f:
        np.lib.format.write_array_header_2_0(f, header)
        f.write(np.zeros(1).tobytes())
    return lambda: ds.open(tmp / "dims.npy"), "70 dimensions"


def deeply_nested_zarr_metadata(tmp):
    zarr.create_array(tmp / "deep.zarr", shape=(4,), chunks=(2,), dtype="u1", zarr_format=2)
    meta = json.loads((tmp / "deep.zarr" / ".zarray").read_text())
    text = json.dumps(meta)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (tmp / "deep.zarr" / ".zarray").write_text(text)
    return lambda: ds.open(tmp / "deep.zarr"), "deep.zarr"


def zero_storage_chunks(tmp):
    zarr.create_array(tmp / "zero.zarr", shape=(4,), chunks=(2,), dtype="u1")
    meta = json.loads((tmp / "zero.zarr" / "zarr.json").read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [0]
    (tmp / "zero.zarr" / "zarr.json").write_text(json.dumps(meta))
    return lambda: ds.open(tmp / "zero.zarr"), "zero.zarr"


def zip_member_outside_the_store(tmp):
    import zipfile

    with zipfile.ZipFile(tmp / "evil.zip", "w") as z:
        z.writestr("a/zarr.json", json.dumps(_v3_metadata()))
        z.writestr("/abs/zarr.json", json.dumps(_v3_metadata()))
        z.writestr("../up/zarr.json", json.dumps(_v3_metadata()))
    return lambda: ds.open(f"{tmp}/evil.zip::abs"), "evil.zip"


def _v3_metadata():
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [2],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}],
    }


def chunks_beyond_int64(tmp):
    np.save(tmp / "a.npy", np.zeros(4))
    return lambda: ds.open(tmp / "a.npy", chunks=(2**70,)), "a.npy"


def store_to_nowhere(tmp):
    return lambda: ds.store(ds.open(_small_npy(tmp)), ""), "current folder"


def store_to_a_zip_file(tmp):
    return lambda: ds.store(ds.open(_small_npy(tmp)), str(tmp / "out.zip")), "out.zip"


def nul_in_path(tmp):
    return lambda: ds.open(f"{tmp}/a\x00b.npy"), "NUL"


def not_a_path(tmp):
    return lambda: ds.open(12), "12"


def target_name_too_long(tmp):
    return lambda: ds.store(ds.open(_small_npy(tmp)), str(tmp / ("y" * 300))), "longer than file names"


def unknown_dtype_to_plan(tmp):
    return lambda: ds.plan_chunks((10,), "nope", memory_budget="1MiB"), "nope"


CASES = [
    (missing_path, errors.SourceNotFoundError, FileNotFoundError),
    (missing_path_with_dataset, errors.SourceNotFoundError, FileNotFoundError),
    (plain_directory, errors.NotAZarrStoreError, ValueError),
    (unknown_format, errors.UnknownFormatError, ValueError),
    (empty_file, errors.CorruptSourceError, OSError),
    (truncated_npy, errors.CorruptSourceError, OSError),
    (garbage_npy_header, errors.CorruptSourceError, OSError),
    (misnamed_h5, errors.CorruptSourceError, OSError),
    (truncated_h5, errors.CorruptSourceError, OSError),
    (object_npy, errors.UnsupportedDtypeError, TypeError),
    (ragged_h5, errors.UnsupportedDtypeError, TypeError),
    (vlen_bytes_zarr, errors.UnsupportedDtypeError, TypeError),
    (missing_h5_dataset, errors.MemberNotFoundError, KeyError),
    (ambiguous_h5, errors.MemberNotFoundError, KeyError),
    (h5_group, errors.NotAnArrayError, TypeError),
    (missing_zarr_member, errors.MemberNotFoundError, KeyError),
    (zarr_group, errors.NotAnArrayError, TypeError),
    (zarr_broken_metadata, errors.CorruptSourceError, OSError),
    (dataset_for_npy, errors.MemberNotFoundError, KeyError),
    (dataset_twice, errors.InvalidArgumentError, ValueError),
    (budget("0"), errors.InvalidBudgetError, ValueError),
    (budget("-1"), errors.InvalidBudgetError, ValueError),
    (budget("lots"), errors.InvalidBudgetError, ValueError),
    (budget(0), errors.InvalidBudgetError, ValueError),
    (budget(True), errors.InvalidBudgetError, ValueError),
    (chunks((0, 4)), errors.InvalidChunksError, ValueError),
    (chunks((-2, 4)), errors.InvalidChunksError, ValueError),
    (chunks((2,)), errors.InvalidChunksError, ValueError),
    (plan_axis, errors.InvalidAxisError, IndexError),
    (quantile_outside, errors.InvalidArgumentError, ValueError),
    (reduce_axis, errors.InvalidAxisError, IndexError),
    (kernel_changes_shape, errors.KernelShapeError, ValueError),
    (stream_axis, errors.InvalidAxisError, IndexError),
    (tune_unknown_op, errors.UnknownOperationError, ValueError),
    (budget_below_one_element, errors.MemoryBudgetError, MemoryError),
    (halo_too_deep, errors.MemoryBudgetError, MemoryError),
    (composition_too_big, errors.MemoryBudgetError, MemoryError),
    (stream_window_too_big, errors.MemoryBudgetError, MemoryError),
    (huge_zarr_shape, errors.MemoryBudgetError, MemoryError),
    (huge_zarr_storage_chunks, errors.MemoryBudgetError, MemoryError),
    (too_many_dimensions, errors.UnsupportedShapeError, ValueError),
    (too_many_dimensions_npy, errors.UnsupportedShapeError, ValueError),
    (deeply_nested_zarr_metadata, errors.CorruptSourceError, OSError),
    (zero_storage_chunks, errors.CorruptSourceError, OSError),
    (zip_member_outside_the_store, errors.MemberNotFoundError, KeyError),
    (chunks_beyond_int64, errors.InvalidChunksError, ValueError),
    (store_to_nowhere, errors.InvalidArgumentError, ValueError),
    (store_to_a_zip_file, errors.InvalidArgumentError, ValueError),
    (nul_in_path, errors.InvalidArgumentError, ValueError),
    (not_a_path, errors.InvalidArgumentError, ValueError),
    (target_name_too_long, errors.InvalidArgumentError, ValueError),
    (unknown_dtype_to_plan, errors.InvalidArgumentError, ValueError),
]


@pytest.mark.parametrize(
    ("build", "error", "builtin"),
    CASES,
    ids=[c[0].__name__ if c[0].__name__ != "build" else f"{c[1].__name__}-{i}" for i, c in enumerate(CASES)],
)
def test_bad_input_raises_a_clear_error(tmp_path, build, error, builtin):
    call, mentioned = build(tmp_path)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, errors.DaskstreamError)
    assert isinstance(info.value, builtin)
    assert mentioned in str(info.value)
    # One readable sentence, not a library's traceback text.
    assert "Traceback" not in str(info.value)


def test_every_error_class_is_exported_and_documented():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert cls.__doc__, name
        if issubclass(cls, Warning):
            assert name.endswith("Warning")
            # One class filters every warning daskstream gives.
            assert issubclass(cls, errors.DaskstreamWarning)
            assert issubclass(cls, UserWarning)
        else:
            assert issubclass(cls, errors.DaskstreamError)


def test_object_npy_is_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    payload = _Trap(str(marker))
    np.save(tmp_path / "o.npy", np.array([payload, None], dtype=object), allow_pickle=True)
    assert not marker.exists()
    with pytest.raises(errors.UnsupportedDtypeError):
        ds.open(tmp_path / "o.npy").compute()
    assert not marker.exists()


class _Trap:
    """Unpickling this writes a marker file: proof that something unpickled user data."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize(
    ("args", "mentioned"),
    [
        (["plan", "{tmp}/nope.npy"], "nope.npy"),
        (["plan", "{tmp}"], "Zarr metadata"),
        (["plan", "{tmp}/a.npy", "--memory-budget", "lots"], "lots"),
        (["reduce", "{tmp}/a.npy", "--op", "average"], "average"),
        (["reduce", "{tmp}/a.npy", "--op", "sum", "--axis", "4"], "axis 4"),
        (["describe", "{tmp}/nope.h5::/x"], "nope.h5"),
        (["tune", "{tmp}/a.npy", "--op", "average"], "average"),
        (["store", "{tmp}/a.npy", "{tmp}/a.npy"], "a.npy"),
    ],
    ids=[
        "missing",
        "plain-directory",
        "bad-budget",
        "unknown-op",
        "bad-axis",
        "describe-missing",
        "tune-op",
        "store-onto-source",
    ],
)
def test_cli_prints_one_line_and_exits_2(tmp_path, args, mentioned):
    np.save(tmp_path / "a.npy", np.zeros(3))
    cmd = [sys.executable, "-m", "daskstream", *(a.format(tmp=tmp_path) for a in args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("daskstream: error:")
    assert mentioned in lines[0]


def test_unreachable_scheduler_is_a_clear_connection_error():
    import socket

    import dask
    import distributed  # noqa: F401 - its defaults must be in dask.config before a setting under them

    # A port nothing listens on: bind one, then close it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "2s"}),
        pytest.raises(errors.ClusterConnectionError) as info,
        ds.session(f"tcp://127.0.0.1:{port}"),
    ):
        pass
    assert isinstance(info.value, ConnectionError)
    assert str(port) in str(info.value)
