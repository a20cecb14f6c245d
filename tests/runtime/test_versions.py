"""The scheduler and workers import what this client does, or joining them is one clear error.

Real ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1, each given a
preload that makes it a process without daskstream, or with another version of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from distributed import Client

import daskstream as ds
from daskstream.errors import ClusterVersionError, DaskstreamError
from daskstream.runtime.schedulers import current
from daskstream.runtime.versions import COMPARED, ClusterVersions, ProcessVersions, ask_versions, this_process

# A process where daskstream is not installed: every import of it is refused, as Python refuses a missing one.
WITHOUT_DASKSTREAM = """
import sys


class RefuseDaskstream:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "daskstream":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, RefuseDaskstream())
"""

# A process with another daskstream release installed.
OTHER_VERSION = """
import daskstream

daskstream.__version__ = "0.0.1"
"""


def _preload(folder: Path, name: str, text: str) -> tuple[str, str]:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return ("--preload", str(path))


def _address(scheduler_file: Path) -> str:
    return json.loads(scheduler_file.read_text())["address"]


def _daskstream_all(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Each ``daskstream`` command in its own process, all at once (each pays Python's start-up alone)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "daskstream", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "10s"},
        )
        for command in commands
    ]
    done = []
    for proc, command in zip(procs, commands, strict=True):
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    return done


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("daskstream: error: ")
    return line


def _remote_file(folder: Path, address: str) -> Path:
    path = folder / "remote.yaml"
    path.write_text(yaml.safe_dump({"daskstream": {"cluster": "remote"}, "scheduler-address": address}))
    return path


# --- real processes -----------------------------------------------------------------------------


def test_a_scheduler_without_daskstream_is_one_error_at_session_and_in_cluster_check(tmp_path, start_dask_processes):
    scheduler_file = start_dask_processes(
        tmp_path, nworkers=1, scheduler_options=_preload(tmp_path, "without", WITHOUT_DASKSTREAM)
    )
    address = _address(scheduler_file)
    said = f"scheduler {address}: daskstream not importable. "

    with pytest.raises(ClusterVersionError) as info, ds.session(address):
        pytest.fail("the session should not start")
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert message.startswith(said)
    assert f"install this client's daskstream=={ds.__version__} on the scheduler and every worker" in message
    assert "worker" not in message.split(". ")[0]  # the worker has what this client has
    assert current() is None

    checked, computing = _daskstream_all(
        ["cluster", "check", str(_remote_file(tmp_path, address))],
        ["reduce", _ones(tmp_path), "--op", "sum", "--quiet", "--scheduler", address],
    )
    assert said in _one_line_error(checked)
    # The versions are listed before the error, the scheduler's daskstream as not importable.
    (row,) = [line for line in checked.stdout.splitlines() if line.startswith(f"scheduler {address}")]
    assert row.split()[2:4] == ["not", "importable"]
    assert said in _one_line_error(computing)


def test_a_worker_with_another_daskstream_is_named_with_both_versions(tmp_path, start_dask_processes):
    scheduler_file = start_dask_processes(
        tmp_path, nworkers=1, worker_options=_preload(tmp_path, "other", OTHER_VERSION)
    )
    address = _address(scheduler_file)

    with pytest.raises(ClusterVersionError) as info, ds.session(address):
        pytest.fail("the session should not start")
    message = str(info.value)
    with Client(address, timeout="10s") as client:
        (worker,) = [w.address for w in ask_versions(client).workers]
    assert message.startswith(f"worker {worker}: daskstream 0.0.1 vs this client's {ds.__version__}. ")
    assert f"scheduler {address}" not in message

    (done,) = _daskstream_all(["cluster", "check", "--json", address])
    assert f"worker {worker}: daskstream 0.0.1" in _one_line_error(done)
    found = json.loads(done.stdout)["versions"]
    assert found["scheduler"]["versions"]["daskstream"] == ds.__version__
    assert [w["versions"]["daskstream"] for w in found["workers"]] == ["0.0.1"]


def test_a_cluster_that_matches_joins_and_its_versions_are_listed(dask_cluster, tmp_path):
    address = _address(dask_cluster)

    with ds.session(address, progress=False) as s:
        assert s.compute(ds.reduce(ds.open(_ones(tmp_path)), "sum", dtype="f8")) == (100.0,)

    by_address, by_file = _daskstream_all(["cluster", "check", address], ["cluster", "check", "--json",
                                          str(_remote_file(tmp_path, address))])  # fmt: skip
    assert by_address.returncode == 0, by_address.stderr
    assert by_address.stderr == ""
    lines = by_address.stdout.splitlines()
    assert lines[0] == f"the running scheduler at {address}"
    assert lines[1].split() == ["versions", *COMPARED]
    here = [this_process().versions[name] for name in COMPARED]
    assert lines[2].split() == ["this", "client", *here]
    assert lines[3].split() == ["scheduler", address, *here]
    assert lines[4].split() == ["2", "workers", *here]
    assert by_file.returncode == 0, by_file.stderr
    found = json.loads(by_file.stdout)["versions"]
    assert found["differences"] == []
    assert len(found["workers"]) == 2


def test_a_file_whose_cluster_is_not_running_says_versions_wait_for_it(tmp_path, unused_port):
    remote = _remote_file(tmp_path, f"tcp://127.0.0.1:{unused_port}")
    local = Path(__file__).resolve().parents[2] / "cluster-configs" / "local.yaml"
    stopped, started_locally = _daskstream_all(["cluster", "check", str(remote)], ["cluster", "check", str(local)])

    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines()[-1].startswith(
        f"versions: cannot compare until the cluster runs (nothing answers at tcp://127.0.0.1:{unused_port}"
    )
    assert started_locally.returncode == 0, started_locally.stderr
    assert f"daskstream {ds.__version__}" in started_locally.stdout.splitlines()[-1]


def _ones(folder: Path) -> str:
    np.save(folder / "ones.npy", np.ones((10, 10)))
    return str(folder / "ones.npy")


@pytest.fixture
def unused_port() -> int:
    # A port nothing listens on: bound, then closed.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the comparison -----------------------------------------------------------------------------

HERE = ProcessVersions("client", "", {"daskstream": "0.2.0", "dask": "2025.6.0", "distributed": "2025.6.0",
                                      "numpy": "2.1.3"}, {})  # fmt: skip


def _process(role: str, address: str, **versions: str | None) -> ProcessVersions:
    failures = {name: f"ModuleNotFoundError: No module named '{name}'" for name, v in versions.items() if v is None}
    return ProcessVersions(role, address, {**HERE.versions, **versions}, failures)


def _cluster(scheduler: ProcessVersions | None = None, *workers: ProcessVersions) -> ClusterVersions:
    return ClusterVersions("tcp://s:1", HERE, scheduler or dataclasses.replace(HERE, role="scheduler",
                           address="tcp://s:1"), workers)  # fmt: skip


@pytest.mark.parametrize(
    ("differing", "said"),
    [
        # numpy agrees within a major version: its pickles and promotion rules hold across minor releases
        ({"numpy": "2.0.0"}, None),
        ({"numpy": "1.26.4"}, "worker tcp://w:1: numpy 1.26.4 vs this client's 2.1.3"),
        # daskstream, dask and distributed must be the same release
        ({"daskstream": "0.2.1"}, "worker tcp://w:1: daskstream 0.2.1 vs this client's 0.2.0"),
        ({"dask": "2025.5.1"}, "worker tcp://w:1: dask 2025.5.1 vs this client's 2025.6.0"),
        ({"distributed": None}, "worker tcp://w:1: distributed not importable"),
    ],
)  # fmt: skip
def test_what_must_agree(differing, said):
    found = _cluster(None, _process("worker", "tcp://w:1", **differing))
    if said is None:
        assert found.differences() == []
        found.check()
        return
    assert found.differences() == [said]
    with pytest.raises(ClusterVersionError, match=r"install this client's daskstream==0\.2\.0") as info:
        found.check()
    # The fix names the version of each package that differs.
    (name,) = differing
    assert f"{name}=={HERE.versions[name]}" in str(info.value)


def test_workers_that_differ_alike_are_one_phrase_naming_three_and_counting_the_rest():
    old = [_process("worker", f"tcp://w:{i}", daskstream="0.1.0") for i in range(5)]
    absent = _process("scheduler", "tcp://s:1", daskstream=None)
    found = _cluster(absent, *old, _process("worker", "tcp://w:9"))

    assert found.differences() == [
        "scheduler tcp://s:1: daskstream not importable",
        "workers tcp://w:0, tcp://w:1, tcp://w:2 and 2 more: daskstream 0.1.0 vs this client's 0.2.0",
    ]
    rows = found.lines()
    assert rows[3].split() == ["5", "workers", "0.1.0", "2025.6.0", "2025.6.0", "2.1.3"]
    assert rows[4].split() == ["worker", "tcp://w:9", "0.2.0", "2025.6.0", "2025.6.0", "2.1.3"]


def test_a_process_that_did_not_answer_or_failed_otherwise_says_why():
    silent = ProcessVersions("worker", "tcp://w:1", {}, {}, unanswered="OSError: Timed out")
    broken = _process("worker", "tcp://w:2", daskstream=None)
    broken = dataclasses.replace(broken, failures={"daskstream": "ImportError: numpy.core.multiarray failed"})
    found = _cluster(None, silent, broken)

    assert found.differences() == [
        "worker tcp://w:1: did not say what it imports (OSError: Timed out)",
        "worker tcp://w:2: daskstream not importable (ImportError: numpy.core.multiarray failed)",
    ]
    (row,) = [line for line in found.lines() if line.startswith("worker tcp://w:1 ")]
    assert row.endswith(" did not answer (OSError: Timed out)")


def test_the_error_is_a_daskstream_error_and_a_runtime_error():
    with pytest.raises(DaskstreamError):
        _cluster(None, _process("worker", "tcp://w:1", daskstream="9")).check()
    with pytest.raises(RuntimeError):
        _cluster(None, _process("worker", "tcp://w:1", daskstream="9")).check()
