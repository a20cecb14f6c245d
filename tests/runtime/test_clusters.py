"""Cluster configuration files: every shipped file checks, and real clusters on 127.0.0.1 connect."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dask.array as da
import dask.config
import numpy as np
import pytest
import yaml

import daskstream as ds
from daskstream.errors import ConfigFileNotFoundError, DaskstreamError, InvalidArgumentError
from daskstream.runtime.clusters import KINDS, check_cluster_config, connect, load_cluster_config

CONFIGS = Path(__file__).resolve().parents[2] / "cluster-configs"

# The kinds whose scheduler listens on a network: loaded only with the user's consent.
NETWORK_KINDS = ("ssh", "slurm", "pbs", "kubernetes")


# --- certificates -------------------------------------------------------------------------------


def _write_certificates(folder: Path, *, names=("ca", "node")) -> dict[str, Path]:
    """A CA and one certificate it signed for 127.0.0.1, as PEM files named ``<name>.pem``/``<name>-key.pem``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, public_key, signing_key, *, ca):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(signing_key, hashes.SHA256())

    ca_name, node_name = names
    ca_key = ec.generate_private_key(ec.SECP256R1())
    node_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = build(f"{ca_name} test CA", f"{ca_name} test CA", ca_key.public_key(), ca_key, ca=True)
    node_cert = build("127.0.0.1", f"{ca_name} test CA", node_key.public_key(), ca_key, ca=False)
    paths = {ca_name: folder / f"{ca_name}.pem", node_name: folder / f"{node_name}.pem"}
    paths[ca_name].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[node_name].write_bytes(node_cert.public_bytes(serialization.Encoding.PEM))
    paths[f"{node_name}-key"] = folder / f"{node_name}-key.pem"
    paths[f"{node_name}-key"].write_bytes(
        node_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def _scheduler_address(scheduler_file: Path) -> str:
    return json.loads(scheduler_file.read_text())["address"]


def _write_yaml(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


# --- every shipped file -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_loads_and_checks(name, tmp_path):
    # Checked from a copy, beside certificates made where the file says they are.
    copy = tmp_path / name
    shutil.copy(CONFIGS / name, copy)
    settings = yaml.safe_load(copy.read_text())
    tls = settings.get("distributed", {}).get("comm", {}).get("tls", {})
    if tls:
        made = _write_certificates(tmp_path / "tmp-certs")
        for source, target in [(made["ca"], tls["ca-file"]), (made["node"], tls["client"]["cert"]),
                               (made["node-key"], tls["client"]["key"])]:  # fmt: skip
            (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tmp_path / target)

    network = settings["daskstream"]["cluster"] in NETWORK_KINDS
    config = load_cluster_config(copy, allow_network_listen=network)
    check = check_cluster_config(copy, allow_network_listen=network)

    assert config.kind in KINDS
    assert check.kind == config.kind == config.daskstream["cluster"]
    assert check.lines
    assert all(isinstance(line, str) and line for line in check.lines)


@pytest.mark.parametrize(("name", "directive"), [("slurm.yaml", "#SBATCH"), ("pbs.yaml", "#PBS")])
def test_jobqueue_check_prints_the_job_script_with_the_configured_resources(name, directive, tmp_path):
    settings = yaml.safe_load((CONFIGS / name).read_text())
    kind = settings["daskstream"]["cluster"]
    settings["jobqueue"][kind].update(cores=6, memory="18GiB", processes=3)
    path = _write_yaml(tmp_path / name, settings)

    script = check_cluster_config(path, allow_network_listen=True).job_script

    assert script is not None
    assert directive in script
    directives = "\n".join(line for line in script.splitlines() if line.startswith(directive))
    if kind == "slurm":
        assert "--cpus-per-task=6" in directives
        assert "--mem=18G" in directives
    else:
        assert "ncpus=6" in directives
        assert "mem=18GB" in directives
    # 3 worker processes of 2 threads and 6 GiB each.
    assert "--nworkers 3" in script
    assert "--nthreads 2" in script
    assert "--memory-limit 6.00GiB" in script


def test_kubernetes_check_builds_the_cluster_resource(tmp_path):
    settings = yaml.safe_load((CONFIGS / "kubernetes.yaml").read_text())
    settings["kubernetes"].update(image="example.org/daskstream:1.2", count={"start": 5})
    path = _write_yaml(tmp_path / "kubernetes.yaml", settings)

    # Any image but dask's own runs code of the file's choosing: it needs the user's consent too.
    with pytest.raises(
        InvalidArgumentError, match=r"kubernetes\.image = 'example\.org/daskstream:1\.2' is the container"
    ):
        check_cluster_config(path, allow_network_listen=True)
    check = check_cluster_config(path, allow_network_listen=True, allow_code=True)

    assert check.spec is not None
    assert check.spec["kind"] == "DaskCluster"
    assert check.spec["spec"]["worker"]["replicas"] == 5
    assert check.spec["spec"]["worker"]["spec"]["containers"][0]["image"] == "example.org/daskstream:1.2"
    assert "5 worker(s)" in check.lines[0]


# --- real clusters ------------------------------------------------------------------------------


def test_local_config_starts_a_local_cluster_and_computes():
    config = load_cluster_config(CONFIGS / "local.yaml")
    x = da.arange(10_000, chunks=1_000, dtype="i8")

    client, cluster = connect(config)
    try:
        assert cluster is not None
        assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert len(workers) == config.daskstream["local"]["n-workers"]
        assert all(w["host"] == "127.0.0.1" for w in workers.values())
        assert all(w["nthreads"] == config.daskstream["local"]["threads-per-worker"] for w in workers.values())
        assert client.compute(x.sum()).result(timeout=60) == 10_000 * 9_999 // 2
        # The file's distributed.worker.memory thresholds reached the worker processes.
        pauses = client.run(lambda: dask.config.get("distributed.worker.memory.pause"))
        assert set(pauses.values()) == {config.settings["distributed"]["worker"]["memory"]["pause"]}
    finally:
        client.close()
        cluster.close()
    assert cluster.status.name == "closed"


def test_remote_config_joins_a_running_scheduler_and_leaves_it_running(dask_cluster, tmp_path):
    from distributed import Client

    address = _scheduler_address(dask_cluster)
    path = _write_yaml(tmp_path / "remote.yaml", {"daskstream": {"cluster": "remote"}, "scheduler-address": address})

    client, cluster = connect(load_cluster_config(path))
    with client:
        assert cluster is None
        assert client.scheduler.address == address
        assert client.compute(da.ones((200, 50), chunks=(50, 50)).sum()).result(timeout=60) == 10_000

    with Client(address, timeout="10s") as again:
        assert len(again.scheduler_info(n_workers=-1)["workers"]) == 2


# --- bad configurations -------------------------------------------------------------------------


def _bad(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        # not a mapping of settings
        ("a: [unclosed", InvalidArgumentError, "not valid YAML"),
        ("- just\n- a list\n", InvalidArgumentError, "must be a YAML mapping"),
        ("# only a comment\n", InvalidArgumentError, "is empty"),
        # the kind decides everything else, so it must be there and known
        ("distributed: {}\n", InvalidArgumentError, "no 'daskstream: cluster:' key"),
        ("daskstream: {cluster: yarn}\n", InvalidArgumentError, "unknown cluster kind 'yarn'; known kinds: local"),
        # required keys of each kind
        ("daskstream: {cluster: remote}\n", InvalidArgumentError, "lacks the required key 'scheduler-address'"),
        ("daskstream: {cluster: slurm}\njobqueue: {slurm: {cores: 4}}\n", InvalidArgumentError,
         "'jobqueue.slurm.memory'"),
        ("daskstream: {cluster: tls}\nscheduler-address: tls://127.0.0.1:1\n", InvalidArgumentError,
         "'distributed.comm.tls.ca-file'"),
    ],
)  # fmt: skip
def test_a_bad_config_is_refused_when_loaded_naming_the_file(tmp_path, text, error, message):
    path = _bad(tmp_path, text)
    with pytest.raises(error, match=r"cluster configuration .*cluster\.yaml") as info:
        load_cluster_config(path)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        # a tls:// scheduler needs the tls kind and its certificates
        ("daskstream: {cluster: remote}\nscheduler-address: tls://127.0.0.1:1\n", InvalidArgumentError,
         "needs 'cluster: tls'"),
        ("daskstream: {cluster: remote}\nscheduler-address: 127.0.0.1:8786\n", InvalidArgumentError,
         "has no scheme; write tcp://HOST:PORT"),
        ("daskstream: {cluster: remote}\nscheduler-address: tcp://127.0.0.1:99999\n", InvalidArgumentError,
         "has port 99999, outside 1-65535"),
        ("daskstream: {cluster: remote}\nscheduler-address: 'tcp://[::1'\n", InvalidArgumentError,
         "has an unclosed '['"),
        ("daskstream: {cluster: remote}\nscheduler-address: inproc://x\n", InvalidArgumentError,
         "uses inproc://"),
        ("daskstream: {cluster: remote}\nscheduler-address: 8786\n", InvalidArgumentError, "is not text"),
        ("daskstream: {cluster: tls}\nscheduler-address: tls://127.0.0.1:1\ndistributed: {comm: {tls: "
         "{ca-file: nowhere/ca.pem, client: {cert: nowhere/me.pem}}}}\n", ConfigFileNotFoundError, "nowhere/ca.pem"),
        ("daskstream: {cluster: local, local: {n-workers: 0}}\n", InvalidArgumentError, "positive integer"),
        ("daskstream: {cluster: local, local: {memory-limit: lots}}\n", InvalidArgumentError, "'lots'"),
        ("daskstream: {cluster: ssh, ssh: {hosts: [only-one]}}\n", InvalidArgumentError, "at least two host"),
        ("daskstream: {cluster: slurm, jobs: two}\njobqueue: {slurm: {cores: 4, memory: 8GiB}}\n",
         InvalidArgumentError, "daskstream.jobs"),
        ("daskstream: {cluster: pbs}\njobqueue: {pbs: {cores: 4, memory: plenty}}\n", InvalidArgumentError,
         "pbs"),
    ],
)  # fmt: skip
def test_a_bad_config_is_refused_by_check_naming_the_file(tmp_path, text, error, message):
    path = _bad(tmp_path, text)
    # Consent to listen on a network, so that the other checks of those kinds are reached.
    network = yaml.safe_load(text)["daskstream"]["cluster"] in NETWORK_KINDS
    with pytest.raises(error, match=r"cluster configuration .*cluster\.yaml") as info:
        check_cluster_config(path, allow_network_listen=network)
    assert message in str(info.value)


def test_a_missing_file_is_named():
    with pytest.raises(ConfigFileNotFoundError, match=r"cluster configuration .*nowhere\.yaml does not exist"):
        load_cluster_config("nowhere.yaml")


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [("slurm.yaml", "dask_jobqueue", "jobqueue"), ("kubernetes.yaml", "dask_kubernetes", "kubernetes"),
     ("ssh.yaml", "asyncssh", "ssh")],
)  # fmt: skip
def test_a_missing_backend_names_the_pip_command(name, module, extra):
    # A fresh interpreter in which the backend cannot be imported, as where it is not installed.
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from daskstream.runtime.clusters import check_cluster_config\n"
        f"check_cluster_config({str(CONFIGS / name)!r})\n"
    )
    env = {**os.environ, "DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_NETWORK_LISTEN": "true"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0
    assert f"MissingDependencyError: cluster configuration {CONFIGS / name}" in out.stderr
    assert f"pip install 'daskstream[{extra}]'" in out.stderr


def test_errors_are_daskstream_errors_and_builtins(tmp_path):
    with pytest.raises(DaskstreamError):
        load_cluster_config(tmp_path / "absent.yaml")
    with pytest.raises(FileNotFoundError):
        load_cluster_config(tmp_path / "absent.yaml")
    with pytest.raises(ValueError, match="unknown cluster kind"):
        load_cluster_config(_bad(tmp_path, "daskstream: {cluster: mesos}\n"))


def test_numpy_result_through_the_local_cluster_matches_numpy(tmp_path):
    path = _write_yaml(
        tmp_path / "local.yaml",
        {
            "daskstream": {
                "cluster": "local",
                "local": {"n-workers": 1, "threads-per-worker": 2, "memory-limit": "1GiB"},
            }
        },
    )
    data = np.random.default_rng(0).standard_normal((400, 30))
    client, cluster = connect(load_cluster_config(path))
    try:
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 1
        result = client.compute(da.from_array(data, chunks=(100, 30)).mean(axis=0)).result(timeout=60)
    finally:
        client.close()
        cluster.close()
    np.testing.assert_allclose(result, data.mean(axis=0))


# --- TLS end to end -----------------------------------------------------------------------------


def _daskstream(*args, env=None, timeout=180):
    """The daskstream command in a subprocess: a client that hangs cannot hang the test suite."""
    return subprocess.run(
        [sys.executable, "-m", "daskstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _tls_config(path: Path, address: str, ca: Path, cert: Path, key: Path) -> Path:
    """The shipped tls.yaml, pointed at ``address`` and at the given certificates."""
    document = yaml.safe_load((CONFIGS / "tls.yaml").read_text())
    document["scheduler-address"] = address
    tls = document["distributed"]["comm"]["tls"]
    tls["ca-file"] = str(ca)
    tls["client"] = {"cert": str(cert), "key": str(key)}
    return _write_yaml(path, document)


def test_tls_cluster_computes_through_tls_yaml_and_refuses_clients_without_its_certificates(
    tmp_path, start_dask_processes, sample_files
):
    from distributed.security import Security

    import daskstream as ds
    from daskstream.runtime.session import session

    certs = _write_certificates(tmp_path / "certs")
    rogue = _write_certificates(tmp_path / "rogue", names=("rogue", "intruder"))
    options = ("--protocol", "tls", "--tls-ca-file", str(certs["ca"]),
               "--tls-cert", str(certs["node"]), "--tls-key", str(certs["node-key"]))  # fmt: skip
    security = Security(
        tls_ca_file=str(certs["ca"]),
        tls_client_cert=str(certs["node"]),
        tls_client_key=str(certs["node-key"]),
        require_encryption=True,
    )
    scheduler_file = start_dask_processes(tmp_path, options=options, security=security, nworkers=1)
    address = _scheduler_address(scheduler_file)
    assert address.startswith("tls://127.0.0.1:")
    good = _tls_config(tmp_path / "tls.yaml", address, certs["ca"], certs["node"], certs["node-key"])

    # From Python: an HDF5 source, read by the worker over a TLS-only cluster.
    h5, data = sample_files["hdf5-chunked"]
    with session(cluster=good, progress=False) as s:
        assert s.address == address
        (total,) = s.compute(ds.reduce(ds.open(h5), "sum", dtype="f8"))
    assert total == pytest.approx(data.sum(dtype="f8"), rel=1e-12)

    # From the command line, through the same file: a Zarr source.
    zarr_path, data = sample_files["zarr-v3-sharded"]
    done = _daskstream("reduce", zarr_path, "--op", "max", "--axis", "0", "--cluster", str(good), "--json")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(json.loads(done.stdout)["result"], data.max(axis=0))

    # Refused: no certificate at all, and a certificate from another CA. Short connect timeouts:
    # a refused TLS handshake is retried until the timeout runs out.
    impostor = _tls_config(tmp_path / "rogue.yaml", address, rogue["rogue"], rogue["intruder"], rogue["intruder-key"])
    quick = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}
    for where, message in (
        (["--scheduler", address], "no client certificate is configured"),
        (["--cluster", str(impostor)], f"no dask scheduler answered at {address}"),
    ):
        refused = _daskstream("reduce", zarr_path, "--op", "sum", *where, env=quick, timeout=120)
        assert refused.returncode == 2, (where, refused.stderr)
        assert refused.stderr.count("\n") == 1
        assert "Traceback" not in refused.stderr
        assert message in refused.stderr


def test_kubernetes_check_shows_the_files_resources_and_installs_daskstream_on_dasks_image(tmp_path):
    check = check_cluster_config(CONFIGS / "kubernetes.yaml", allow_network_listen=True)
    settings = yaml.safe_load((CONFIGS / "kubernetes.yaml").read_text())["kubernetes"]
    for part in ("worker", "scheduler"):
        (container,) = check.spec["spec"][part]["spec"]["containers"]
        # The file's requests and limits, as the pods will get them (not emptied once the check is done).
        assert container["resources"] == settings["resources"]
        assert {"name": "EXTRA_PIP_PACKAGES", "value": f"daskstream=={ds.__version__}"} in container["env"]
    assert any("does not carry daskstream" in line for line in check.lines)
    # What a person reads: no YAML anchors or aliases, and one final newline.
    shown = subprocess.run(
        [sys.executable, "-m", "daskstream", "cluster", "check", str(CONFIGS / "kubernetes.yaml"),
         "--allow-network-listen"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "&id" not in shown
    assert "*id" not in shown
    assert shown.endswith("\n")
    assert not shown.endswith("\n\n")
    assert shown.count("cpu: '2'") == 4  # requests and limits, scheduler and workers
