"""Generated hostile inputs: every one is read exactly as numpy or zarr reads it, or refused with a DaskstreamError.

Never another exception, never a wait past a few seconds, never an allocation
past a bound: each example runs under an alarm and with allocations traced.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import struct
import sys
import tempfile
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import daskstream as ds
from daskstream.errors import DaskstreamError

# What one example may take, and allocate (numpy reports its buffers to tracemalloc).
SECONDS = 10
ALLOCATION_BOUND = 256 * 2**20
# Arrays small enough to read whole and compare.
COMPARED_ELEMENTS = 100_000

FUZZ = settings(
    # More for a longer hunt: DASKSTREAM_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py
    max_examples=int(os.environ.get("DASKSTREAM_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@contextlib.contextmanager
def bounded(what: str, seconds: float = SECONDS):
    """Fail (not hang) past ``seconds``, and past ``ALLOCATION_BOUND`` bytes allocated at once."""

    def too_slow(*_):
        raise TimeoutError(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    tracemalloc.start()
    try:
        # Libraries warn about odd but readable metadata: a warning is not a failure to read.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak <= ALLOCATION_BOUND, f"{what} allocated {peak / 2**20:.0f} MiB at once"


def read_or_refuse(path: str) -> np.ndarray | None:
    """daskstream's reading of ``path``: the array when small, ``None`` when refused with a DaskstreamError."""
    try:
        x = ds.open(path)
        if x.size > COMPARED_ELEMENTS:
            return None
        return x.compute(scheduler="sync")
    except DaskstreamError:
        return None


def assert_same_values(got: np.ndarray, expected: np.ndarray) -> None:
    """Same shape, same dtype up to byte order (daskstream returns native order), same bytes (NaNs included)."""
    assert got.shape == expected.shape
    native = expected.dtype.newbyteorder("=")
    assert got.dtype == native
    assert got.tobytes() == expected.astype(native).tobytes()


# ---------------------------------------------------------------------------
# .npy headers

DESCRS = st.one_of(
    st.sampled_from(["<f8", ">i4", "|u1", "<c16", "|b1", "<M8[s]", "|S5", "<U3", "|V4", "<f2", "|O", "<f16"]),
    st.sampled_from(["", "x", "<f9", "[", "(", "<f8\x00", "0" * 200]),
    st.tuples(st.sampled_from(["<f8", "|u1", "<i2"]), st.lists(st.integers(-2, 4), min_size=0, max_size=3).map(tuple)),
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "", "a"]), st.sampled_from(["<f4", "|u1", "|O", ">i8", "zz"])),
        min_size=0,
        max_size=3,
    ),
    st.integers(),
    st.none(),
)
SHAPES = st.one_of(
    st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple),
    st.lists(st.integers(-3, 2**64), min_size=1, max_size=3).map(tuple),
    st.integers(1, 80).map(lambda n: (1,) * n),
    st.sampled_from([[2, 3], (2.5,), ("3",), None, (True, 2)]),
)


@st.composite
def npy_files(draw) -> bytes:
    """A .npy file: a header dict (well or badly formed) in format 1, 2 or 3, and some data."""
    header = {
        "descr": draw(DESCRS),
        "fortran_order": draw(st.sampled_from([False, True, 0, "yes"])),
        "shape": draw(SHAPES),
    }
    if draw(st.booleans()):
        header[draw(st.sampled_from(["extra", "descr", "shape"]))] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        del header[draw(st.sampled_from(["descr", "fortran_order", "shape"]))]
    text = repr(header) if draw(st.integers(0, 9)) else draw(st.text(max_size=60))
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0), (9, 9)]))
    body = text.encode("utf-8" if version == (3, 0) else "latin1", errors="replace")
    body += b" " * ((-len(body) - 12) % 64) + b"\n"
    length = struct.pack(
        "<H" if version == (1, 0) else "<I", min(len(body), 2**16 - 1) if version == (1, 0) else len(body)
    )
    if draw(st.integers(0, 9)) == 0:
        length = draw(st.binary(min_size=len(length), max_size=len(length)))
    data = draw(st.binary(min_size=0, max_size=256))
    with contextlib.suppress(Exception):
        # Often exactly the bytes the header declares, so that files numpy reads are generated too.
        declared = math.prod(header["shape"]) * np.dtype(header["descr"]).itemsize
        if declared <= 4096 and draw(st.booleans()):
            data = draw(st.binary(min_size=declared, max_size=declared))
    return b"\x93NUMPY" + bytes(version) + length + body + data


def numpys_readings(path: str) -> list[np.ndarray]:
    """numpy's readings of a .npy file, without pickles: np.load, and a memory map.

    They can differ: for an empty array of subarray elements np.load keeps the
    declared shape, (0,), where the memory map adds the element's axes, (0, 3),
    as both do for a non-empty one. daskstream reads as one of them does.
    """
    readings = []
    for read in (lambda: np.load(path, allow_pickle=False), lambda: np.lib.format.open_memmap(path, mode="r")):
        try:
            readings.append(np.array(read()))
        except Exception:
            continue
    return readings


@FUZZ
@given(content=npy_files())
def test_any_npy_header_is_read_as_numpy_reads_it_or_refused(content):
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "f.npy")
        Path(path).write_bytes(content)
        with bounded("opening a generated .npy"):
            got = read_or_refuse(path)
        if got is None:
            return
        readings = numpys_readings(path)
        assert readings, "daskstream read a file numpy cannot"
        failures = []
        for expected in readings:
            try:
                assert_same_values(got, expected)
                return
            except AssertionError as exc:
                failures.append(exc)
        raise failures[0]


# ---------------------------------------------------------------------------
# Zarr metadata documents

CODECS_V3 = st.lists(
    st.one_of(
        st.just({"name": "bytes", "configuration": {"endian": "little"}}),
        st.just({"name": "bytes"}),
        st.just({"name": "zstd", "configuration": {"level": 3, "checksum": False}}),
        st.just({"name": "gzip", "configuration": {"level": 1}}),
        st.just({"name": "transpose", "configuration": {"order": [0]}}),
        st.just({"name": "crc32c"}),
        st.just({"name": "no-such-codec"}),
        st.dictionaries(st.sampled_from(["name", "configuration"]), st.integers() | st.text(max_size=5), max_size=2),
    ),
    min_size=0,
    max_size=3,
)
DATA_TYPES = st.sampled_from(["uint8", "int32", "float64", "bool", "complex64", "string", "float128", "nope", 7])


@st.composite
def zarr_v3_documents(draw) -> dict:
    ndim = draw(st.integers(0, 3))
    shape = draw(st.lists(st.integers(0, 12) | st.sampled_from([-1, 10**18, 2**63]), min_size=ndim, max_size=ndim))
    chunks = draw(st.lists(st.integers(1, 8) | st.sampled_from([0, -2, 10**15]), min_size=ndim, max_size=ndim + 1))
    doc = {
        "zarr_format": draw(st.sampled_from([3, 3, 3, 2, "3"])),
        "node_type": draw(st.sampled_from(["array", "array", "group", "other"])),
        "shape": shape,
        "data_type": draw(DATA_TYPES),
        "chunk_grid": {
            "name": draw(st.sampled_from(["regular", "rectilinear"])),
            "configuration": {"chunk_shape": chunks},
        },
        "chunk_key_encoding": {"name": draw(st.sampled_from(["default", "v2"])), "configuration": {"separator": "/"}},
        "fill_value": draw(st.sampled_from([0, 1.5, "NaN", None, "x", [1, 2]])),
        "codecs": draw(CODECS_V3),
    }
    for key in draw(st.lists(st.sampled_from(sorted(doc)), max_size=2)):
        doc.pop(key, None)
    if draw(st.booleans()):
        doc["attributes"] = draw(st.recursive(st.integers() | st.text(max_size=4), lambda c: st.lists(c, max_size=3)))
    return doc


@st.composite
def zarr_v2_documents(draw) -> dict:
    ndim = draw(st.integers(0, 3))
    return {
        "zarr_format": draw(st.sampled_from([2, 2, 3])),
        "shape": draw(st.lists(st.integers(0, 12) | st.sampled_from([-1, 10**18]), min_size=ndim, max_size=ndim)),
        "chunks": draw(st.lists(st.integers(1, 8) | st.sampled_from([0, -1]), min_size=ndim, max_size=ndim + 1)),
        "dtype": draw(st.sampled_from(["<f8", "|u1", ">i4", "|O", "<U2", "x", [["a", "<f4"]], [["a", "<f4", [2]]]])),
        "compressor": draw(st.sampled_from([None, {"id": "zstd", "level": 1}, {"id": "blosc"}, {"id": "nope"}, 3])),
        "fill_value": draw(st.sampled_from([0, None, "NaN", "x", 1.5])),
        "order": draw(st.sampled_from(["C", "F", "Z"])),
        "filters": draw(st.sampled_from([None, [], [{"id": "delta", "dtype": "<f8"}], [{"id": "pickle"}]])),
    }


def write_store(folder: Path, name: str, document: dict, deep: int) -> Path:
    store = folder / "s.zarr"
    store.mkdir()
    text = json.dumps(document)
    if deep:
        text = text[:-1] + ', "nested": ' + "[" * deep + "]" * deep + "}"
    (store / name).write_text(text)
    # Some chunk files, of bytes no codec produced.
    for key in ("c/0/0", "c/1", "0", "0.0", "c"):
        with contextlib.suppress(OSError):
            (store / key).parent.mkdir(parents=True, exist_ok=True)
            (store / key).write_bytes(bytes(range(64)))
    return store


def zarrs_reading(path: Path) -> np.ndarray | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            array = zarr.open_array(str(path), mode="r")
            if math.prod(array.shape) > COMPARED_ELEMENTS or np.dtype(array.dtype).hasobject:
                return None
            return np.asarray(array[...])
    except Exception:
        return None


@pytest.mark.parametrize(
    ("name", "documents"), [("zarr.json", zarr_v3_documents()), (".zarray", zarr_v2_documents())], ids=["v3", "v2"]
)
@FUZZ
@given(data=st.data())
def test_any_zarr_metadata_is_read_as_zarr_reads_it_or_refused(name, documents, data):
    document = data.draw(documents)
    deep = data.draw(st.sampled_from([0, 0, 0, 50, 100_000]))
    with tempfile.TemporaryDirectory() as folder:
        store = write_store(Path(folder), name, document, deep)
        with bounded("opening generated Zarr metadata"):
            got = read_or_refuse(str(store))
        if got is None:
            return
        expected = zarrs_reading(store)
        assert expected is not None, "daskstream read an array zarr cannot"
        assert_same_values(got, expected)


# ---------------------------------------------------------------------------
# Cluster YAML files

KINDS = ["local"] * 6 + ["remote", "tls", "ssh", "slurm", "pbs", "kubernetes", "nope", 3, None]
# Real setting paths (including ones that run code or listen), and broken spellings of them.
SETTING_PATHS = [
    "daskstream.memory-budget", "daskstream.local.n-workers", "daskstream.local.threads-per-worker",
    "daskstream.local.memory-limit", "daskstream.local.dashboard-address", "daskstream.cluster-files.allow-code",
    "daskstream.planning.max-tasks", "daskstream.ssh.remote-python", "daskstream.nope",
    "scheduler-address", "temporary-directory",
    "distributed.scheduler.preload", "distributed.worker.preload", "distributed.client.preload",
    "distributed.nanny.environ", "distributed.nanny.pre-spawn-environ", "distributed.nanny.pre_spawn_environ",
    "distributed.scheduler.http.routes", "distributed.scheduler.active-memory-manager.policies",
    "distributed.scheduler.allowed-imports", "distributed.client.security-loader", "distributed.scheduler.pickle",
    "distributed.scheduler.contact-address", "distributed.worker.memory.target", "distributed.comm.timeouts.connect",
    "distributed.worker.resources", "distributed.comm.default-scheme", "logging", "logging.distributed",
    "jobqueue.slurm.cores", "jobqueue.slurm.python", "jobqueue.slurm.job-script-prologue", "kubernetes.image",
    "kubernetes.env", "a_b", "", "0", "distributed..worker",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(["127.0.0.1:0", "0.0.0.0:8787", "127.0.0.1:0,0.0.0.0:8799", ":8787", "[::1]:0", "localhost:0",
                     "tcp://127.0.0.1:8786", "tcp://[::1", "inproc://x", "tcp://127.0.0.1:99999", "2GiB", "auto",
                     "planted", "/tmp/planted.py", "$(touch x)", "ghcr.io/dask/dask:latest", "10s"]),
    st.sampled_from(KINDS),
    st.integers(-2, 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
)  # fmt: skip
SETTINGS = st.recursive(
    VALUES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["OMP_NUM_THREADS", "PYTHONPATH", "class", "a", "0.0.0.0"]), inner, max_size=3
        )
    ),
    max_leaves=8,
)


def _laughs(levels: int) -> str:
    lines = ["l0: &l0 [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@st.composite
def cluster_files(draw) -> str:
    """A cluster file: a kind and generated settings, often with YAML built to exhaust a reader, or any text."""
    document: dict = {}
    if draw(st.integers(0, 5)):
        document["daskstream"] = {"cluster": draw(st.sampled_from(KINDS))}
    for path in draw(st.lists(st.sampled_from(SETTING_PATHS), max_size=4)):
        place = document
        *sections, name = path.split(".") if draw(st.booleans()) else [path]
        for section in sections:
            place = place.setdefault(section, {}) if isinstance(place.get(section, {}), dict) else {}
        place[name] = draw(SETTINGS)
    extra = draw(st.sampled_from(["", "", "", "json", "bomb", "deep", "self", "tag", "twice", "text", "binary"]))
    if extra == "json":
        return json.dumps(document)
    text = _yaml_text(document)
    if extra == "bomb":
        text += _laughs(draw(st.integers(2, 12)))
    elif extra == "deep":
        depth = draw(st.sampled_from([10, 40, 5_000]))
        text += "x: " + "[" * depth + "]" * depth + "\n"
    elif extra == "self":
        text += "x: &x [1, *x]\n"
    elif extra == "tag":
        text += "x: " + draw(st.sampled_from(["!!python/object:os.system ls", "!!binary aGk=", "!!set {a}", "!x 1"]))
        text += "\n"
    elif extra == "twice":
        text += "daskstream: {cluster: local}\n"
    elif extra == "text":
        text = draw(st.text(max_size=200))
    elif extra == "binary":
        text = draw(st.binary(max_size=200)).decode("latin1")
    return text


def _yaml_text(document: dict) -> str:
    import yaml

    # Block style, so that the lines added after it are keys of the same mapping.
    return yaml.safe_dump(document, default_flow_style=False) if document else ""


def _leaves(settings, prefix=""):
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@FUZZ
@given(text=cluster_files(), consent=st.sampled_from([False, False, True]))
def test_any_cluster_file_is_loaded_as_screened_data_or_refused(text, consent):
    from daskstream.runtime.addresses import listen_points
    from daskstream.runtime.clusters import check_cluster_config, load_cluster_config

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cluster.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        config = None
        # Longer than for a data file: checking a kubernetes or jobqueue file imports that backend once,
        # which is slow under allocation tracing on a busy machine. A hang still fails.
        with bounded("loading a generated cluster file", seconds=60):
            try:
                config = load_cluster_config(path, allow_code=consent, allow_network_listen=consent)
                check_cluster_config(path, allow_code=consent, allow_network_listen=consent)
            except DaskstreamError:
                pass
    if config is None or consent:
        return
    # What a file loaded without consent holds: no code, no consent of its own, nothing listening beyond loopback.
    for name, value in _leaves(config.settings):
        parts = name.replace("_", "-").split(".")
        assert parts[:2] != ["daskstream", "cluster-files"], name
        if parts[-1] in ("preload", "routes", "policies", "environ", "pre-spawn-environ", "python", "logging"):
            assert not value, f"{name} = {value!r} was let through"
        if name == "daskstream.local.dashboard-address" and value is not None:
            hosts = [host for host, _ in listen_points(value)]
            assert all(host in ("127.0.0.1", "::1", "localhost") for host in hosts), value
    assert config.kind not in ("ssh", "slurm", "pbs", "kubernetes")


# ---------------------------------------------------------------------------
# Sizes chunk indexes and zip directories state: any value is read as the file holds it or refused, never
# believed into an allocation (tests/sources/hostile_files.py builds the files; test_hostile_sizes.py the attacks).


def _hostile_files():
    folder = str(Path(__file__).parent / "sources")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import hostile_files

    return hostile_files


@functools.cache
def _hdf5_template(compression: str | None) -> tuple[bytes, list[tuple[int, int]], np.ndarray]:
    """An HDF5 file indexed by a version 1 B-tree (no checksums to forge), where each chunk's entry is, and
    the data it holds."""
    hostile = _hostile_files()
    with tempfile.TemporaryDirectory() as folder:
        path = hostile.hdf5_file(Path(folder) / "t.h5", "btree-v1", compression=compression)
        raw = path.read_bytes()
        chunks = hostile.stored_chunks(path)
    return raw, [hostile.btree_v1_entry(raw, info, rank=2) for info in chunks], hostile.values()


@FUZZ
@given(
    compression=st.sampled_from(["gzip", None]),
    which=st.integers(0, 3),
    size=st.one_of(
        st.none(), st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 65535, 65536, 65537, 2**31, 2**32 - 1])
    ),
    address=st.one_of(st.none(), st.integers(0, 2**64 - 1), st.integers(0, 300_000)),
)
def test_any_hdf5_chunk_size_or_address_is_read_or_refused_within_bounds(compression, which, size, address):
    raw, entries, expected = _hdf5_template(compression)
    forged = bytearray(raw)
    key, pointer = entries[which]
    if size is not None:
        forged[key : key + 4] = size.to_bytes(4, "little")
    if address is not None:
        forged[pointer : pointer + 8] = address.to_bytes(8, "little")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "forged.h5"
        path.write_bytes(forged)
        with bounded("reading an HDF5 file with a forged chunk index entry"):
            got = read_or_refuse(f"{path}::x")
    if got is not None and forged == raw:
        assert_same_values(got, expected)


@functools.cache
def _zip_template() -> tuple[bytes, np.ndarray]:
    hostile = _hostile_files()
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "s"
        expected = np.arange(256.0, dtype="f4").reshape(16, 16)
        zarr.create_array(store, shape=(16, 16), chunks=(8, 8), dtype="f4", compressors=None)[...] = expected
        path = hostile.zipped_store(store, Path(folder) / "s.zip", compression=zipfile.ZIP_DEFLATED)
        return path.read_bytes(), expected


# Fields of a zip member's local header (signature PK\3\4) and central directory entry (PK\1\2): where each
# is, its width, and values worth trying besides random ones.
_ZIP_FIELDS = {
    "flags": ((6, 8), 2, [0, 1, 8]),
    "method": ((8, 10), 2, [0, 8, 12, 14, 99]),
    "crc": ((14, 16), 4, [0]),
    "packed size": ((18, 20), 4, [0, 1, 2**32 - 1]),
    "size": ((22, 24), 4, [0, 1, 256, 4096, 2**31, 2**32 - 1]),
}


@FUZZ
@given(
    member=st.sampled_from(["c/0/0", "c/1/1", "zarr.json"]),
    field=st.sampled_from(sorted(_ZIP_FIELDS)),
    where=st.sampled_from(["local", "central", "both"]),
    data=st.data(),
)
def test_any_zip_member_size_or_method_is_read_or_refused_within_bounds(member, field, where, data):
    raw, expected = _zip_template()
    (local_at, central_at), width, interesting = _ZIP_FIELDS[field]
    value = data.draw(st.one_of(st.sampled_from(interesting), st.integers(0, 256**width - 1)))
    forged = bytearray(raw)
    name = member.encode()
    for signature, at, name_at in ((b"PK\x03\x04", local_at, 30), (b"PK\x01\x02", central_at, 46)):
        if where not in ("both", "local" if signature == b"PK\x03\x04" else "central"):
            continue
        start = forged.find(signature)
        while start != -1:
            if forged[start + name_at : start + name_at + len(name)] == name:
                forged[start + at : start + at + width] = value.to_bytes(width, "little")
            start = forged.find(signature, start + 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "forged.zip"
        path.write_bytes(forged)
        with bounded("reading a zipped Zarr store with a forged member header"):
            got = read_or_refuse(str(path))
    if got is not None:
        # Every member daskstream reads matches the size and CRC-32 it declares: a read is the data.
        assert_same_values(got, expected)


# --out under any spelling of what the command reads: refused, and nothing there changes.


def _aliasing_folder():
    """Sources in a folder of their own, with links to them, made once for every example."""
    folder = Path(tempfile.mkdtemp(prefix="daskstream-fuzz-out-"))
    data = np.arange(24.0).reshape(4, 6)
    np.save(folder / "a.npy", data)
    zarr.save_array(str(folder / "a.zarr"), data)
    group = zarr.open_group(str(folder / "tree.zarr"), mode="w")
    group.create_array("x", data=data)
    import h5py

    with h5py.File(folder / "a.h5", "w") as f:
        f["x"] = data
        f["kept"] = np.ones(3)
    (folder / "sub").mkdir()
    (folder / "up").symlink_to(folder)
    for name in ("a.npy", "a.h5"):
        (folder / f"soft-{name}").symlink_to(folder / name)
        (folder / f"hard-{name}").hardlink_to(folder / name)
    return folder


_ALIASING = functools.cache(_aliasing_folder)
# What each source is read as, and the names that lead to its data.
_READS = {
    "a.npy": ["a.npy", "soft-a.npy", "hard-a.npy"],
    "a.zarr": ["a.zarr"],
    "tree.zarr::x": ["tree.zarr"],
    "a.h5::/x": ["a.h5", "soft-a.h5", "hard-a.h5"],
}


@st.composite
def _spellings(draw):
    source = draw(st.sampled_from(sorted(_READS)))
    name = draw(st.sampled_from(_READS[source]))
    detours = draw(st.lists(st.sampled_from([".", "sub/..", "up", "up/sub/.."]), max_size=3))
    parts = [*detours, name]
    text = "/".join(parts).replace("/", draw(st.sampled_from(["/", "//"])))
    if source.endswith((".zarr", "::x")) and draw(st.booleans()):
        text += "/"
    absolute = draw(st.booleans())
    return source, text, absolute


def _tree_bytes(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink() and "up" not in p.relative_to(folder).parts
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_spellings(), st.sampled_from(["reduce", "describe"]))
def test_out_under_any_spelling_of_what_is_read_is_refused_and_changes_nothing(spelling, command):
    from click.testing import CliRunner

    from daskstream.cli import main

    folder = _ALIASING()
    source, text, absolute = spelling
    before = _tree_bytes(folder)
    out = str(folder / text) if absolute else text
    args = ["--op", "sum", "--axis", "0"] if command == "reduce" else ["--axis", "0"]
    # describe's several statistics go in no .npy file: that refusal comes first and proves nothing here.
    if command == "describe" and text.rstrip("/").endswith(".npy"):
        return
    with contextlib.chdir(folder):
        result = CliRunner().invoke(main, [command, source, *args, "--quiet", "--out", out])
    assert result.exit_code == 2, (out, result.output)
    assert "destroy the data it reads" in result.output, (out, result.output)
    assert _tree_bytes(folder) == before
