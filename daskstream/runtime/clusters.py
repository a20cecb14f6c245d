"""Cluster configurations: one YAML file says where a computation runs.

Each file in ``cluster-configs/`` is plain dask configuration (the sections
``distributed:``, ``jobqueue:`` and ``kubernetes:`` mean what dask,
dask-jobqueue and dask-kubernetes say they mean) plus a ``daskstream:``
section whose ``cluster:`` key names the kind of cluster:

======================  ===========================================================
``local``               a ``LocalCluster`` on this machine (``daskstream.local``)
``remote``              an existing scheduler at ``scheduler-address: tcp://...``
``tls``                 an existing scheduler at ``tls://...``, certificates in
                        ``distributed.comm.tls``
``ssh``                 distributed's ``SSHCluster`` over ``daskstream.ssh.hosts``
``slurm``, ``pbs``      dask-jobqueue, from ``jobqueue.slurm`` / ``jobqueue.pbs``
``kubernetes``          the dask-kubernetes operator's ``KubeCluster``
======================  ===========================================================

Relative certificate paths are read from the folder of the YAML file.
Backends outside distributed are imported only by the kinds that need them.

What a cluster file may set, and the consent that lets it set more, is
decided in :mod:`daskstream.runtime.cluster_rules`.
"""

from __future__ import annotations

import contextlib
import importlib
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import dask
import dask.config
from dask.utils import parse_bytes, parse_timedelta

from daskstream.documents import read_yaml
from daskstream.errors import ClusterConnectionError, ConfigFileNotFoundError, InvalidArgumentError
from daskstream.runtime.addresses import SCHEDULER_SCHEMES, check_scheduler_address, listen_points
from daskstream.runtime.cluster_rules import ALLOW_CODE, ALLOW_NETWORK_LISTEN, allowance, screen, sections

if TYPE_CHECKING:
    import distributed

__all__ = ["KINDS", "ClusterCheck", "ClusterConfig", "check_cluster_config", "connect", "join", "load_cluster_config"]

KINDS = ("local", "remote", "ssh", "slurm", "pbs", "kubernetes", "tls")

# The extra that installs each optional backend, and the module that proves it is there.
_BACKENDS = {
    "slurm": ("dask_jobqueue", "jobqueue"),
    "pbs": ("dask_jobqueue", "jobqueue"),
    "kubernetes": ("dask_kubernetes.operator", "kubernetes"),
    "ssh": ("asyncssh", "ssh"),
}

# Only checks render job scripts; this address is never contacted.
_RENDER_SCHEDULER = "tcp://127.0.0.1:8786"


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster configuration file, read and screened but not acted on.

    Attributes
    ----------
    path
        The YAML file.
    kind
        One of :data:`KINDS`, from the file's ``daskstream.cluster`` key.
    settings
        The whole YAML document, shaped like dask configuration (dotted keys
        such as ``"distributed.worker.memory": ...`` spread into sections).
    allow_code
        Whether settings that run code were allowed when the file was loaded.
    allow_network_listen
        Whether listening beyond loopback was allowed when the file was loaded.
    """

    path: Path
    kind: str
    settings: dict
    allow_code: bool = False
    allow_network_listen: bool = False

    @property
    def daskstream(self) -> dict:
        """The ``daskstream:`` section (``{}`` when the file has none)."""
        return self.settings.get("daskstream") or {}


@dataclass(frozen=True)
class ClusterCheck:
    """What :func:`connect` would do with a configuration, found without starting anything.

    Attributes
    ----------
    kind
        The kind of cluster.
    lines
        A human summary, one fact per line.
    job_script
        For ``slurm`` and ``pbs``: the batch script dask-jobqueue would submit per job.
    spec
        For ``kubernetes``: the ``DaskCluster`` resource the operator would be given.
    """

    kind: str
    lines: list[str]
    job_script: str | None = None
    spec: dict | None = field(default=None)


def load_cluster_config(
    path: str | Path, *, allow_code: bool | None = None, allow_network_listen: bool | None = None
) -> ClusterConfig:
    """Read a cluster configuration file, check its kind and required keys, and screen its settings.

    Parameters
    ----------
    path
        The YAML file.
    allow_code
        Let the file's settings import modules, run files or commands and set
        environment variables. ``None``: the setting ``daskstream.cluster-files.allow-code``
        (false unless the user set it), read before the file is.
    allow_network_listen
        Let the cluster listen on addresses other than loopback. ``None``: the
        setting ``daskstream.cluster-files.allow-network-listen``.

    Raises
    ------
    ConfigFileNotFoundError
        The file does not exist.
    InvalidArgumentError
        The file is not a bounded, valid YAML mapping, names no known kind,
        lacks a key its kind needs, holds a setting that is malformed, or one
        that runs code or listens beyond loopback without the user's consent.
    """
    # Read before the file: nothing in it can change what it is allowed to do.
    allow_code = allowance(ALLOW_CODE, allow_code)
    allow_network_listen = allowance(ALLOW_NETWORK_LISTEN, allow_network_listen)
    path = Path(path).expanduser()
    document = read_yaml(
        path, what="cluster configuration", hint="correct it, or start again from a file in cluster-configs/"
    )
    if document is None:
        raise InvalidArgumentError(f"cluster configuration {path} is empty; start from a file in cluster-configs/")
    if not isinstance(document, dict):
        raise InvalidArgumentError(
            f"cluster configuration {path} must be a YAML mapping of dask settings, not {type(document).__name__}"
        )
    settings = sections(document, path)
    section = settings.get("daskstream") or {}
    kind = section.get("cluster") if isinstance(section, dict) else None
    if kind is None:
        raise InvalidArgumentError(
            f"cluster configuration {path} has no 'daskstream: cluster:' key; set it to one of: {', '.join(KINDS)}"
        )
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidArgumentError(
            f"cluster configuration {path} names unknown cluster kind {kind!r}; known kinds: {', '.join(KINDS)}"
        )
    for key in _REQUIRED[kind]:
        if _lookup(settings, key) is None:
            raise InvalidArgumentError(f"cluster configuration {path} ({kind}) lacks the required key '{key}'")
    config = ClusterConfig(
        path=path, kind=kind, settings=settings, allow_code=allow_code, allow_network_listen=allow_network_listen
    )
    screen(config)
    return config


_REQUIRED: dict[str, tuple[str, ...]] = {
    "local": (),
    "remote": ("scheduler-address",),
    "tls": ("scheduler-address", "distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert"),
    "ssh": ("daskstream.ssh.hosts",),
    "slurm": ("jobqueue.slurm.cores", "jobqueue.slurm.memory"),
    "pbs": ("jobqueue.pbs.cores", "jobqueue.pbs.memory"),
    "kubernetes": ("kubernetes.name", "kubernetes.image"),
}


def check_cluster_config(
    path: str | Path, *, allow_code: bool | None = None, allow_network_listen: bool | None = None
) -> ClusterCheck:
    """Validate a configuration as far as possible without starting or contacting anything.

    Everything :func:`load_cluster_config` refuses is refused here too (with
    the same ``allow_code`` and ``allow_network_listen``). Jobqueue kinds then
    render the job script; kubernetes builds the cluster resource; remote and
    tls check the address and the certificates; ssh checks the hosts.
    """
    config = load_cluster_config(path, allow_code=allow_code, allow_network_listen=allow_network_listen)
    return _CHECKS[config.kind](config)


def connect(config: ClusterConfig) -> tuple[distributed.Client, object | None]:
    """A Client for the configured cluster, and the cluster object started for it.

    The second item is ``None`` when the Client joined a scheduler that was
    already running (``remote``, ``tls``): close only what this returned.
    The configuration is screened again first, with the consent it was loaded
    with, so a hand-made :class:`ClusterConfig` gets no further than a file.
    """
    from distributed import Client

    if config.kind in ("remote", "tls"):
        address, security = _remote_address(config)
        # The file's other settings (timeouts, comm options) hold while the Client connects.
        with _applied(config):
            return join(address, security=security, source=str(config.path)), None
    jobs = _jobs(config) if config.kind in ("slurm", "pbs") else None
    cluster = _start_cluster(config)
    try:
        if jobs is not None:
            cluster.scale(jobs=jobs)
        with _applied(config):
            client = Client(cluster)
    except BaseException:
        cluster.close()
        raise
    return client, cluster


def join(address: str, *, security: Any = None, source: str | None = None) -> distributed.Client:
    """A Client to the scheduler running at ``address``; a clear error when none answers.

    Parameters
    ----------
    address
        ``tcp://host:port`` or ``tls://host:port`` (see :func:`daskstream.runtime.addresses.check_scheduler_address`).
    security
        distributed's ``Security`` for a TLS scheduler.
    source
        The cluster file that named the address, for the error message.

    Raises
    ------
    InvalidArgumentError
        ``address`` is not one daskstream can join.
    ClusterConnectionError
        Nothing listens there, the connection timed out, or the TLS handshake failed.
    """
    from distributed import Client
    from distributed.security import Security

    check_scheduler_address(
        address, what=f"cluster configuration {source}: scheduler-address" if source else "scheduler address"
    )
    if address.startswith("tls://") and security is None:
        # Certificates may come from dask's own configuration (distributed.comm.tls).
        security = Security()
        if security.get_connection_args("client").get("ssl_context") is None:
            raise ClusterConnectionError(
                f"{address} is a TLS scheduler and no client certificate is configured; connect through a "
                "cluster file with the certificates (see cluster-configs/tls.yaml: daskstream --cluster tls.yaml)"
            )
    timeout = dask.config.get("distributed.comm.timeouts.connect")
    try:
        _probe(address, timeout)
        return Client(address, security=security, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        where = f" (from {source})" if source else ""
        hint = (
            "check the certificates and that this client's are signed by the scheduler's CA"
            if address.startswith("tls://")
            else "check the address and that the scheduler is running (a tls:// scheduler needs the "
            "certificates of a cluster file, see cluster-configs/tls.yaml)"
        )
        raise ClusterConnectionError(f"no dask scheduler answered at {address}{where} ({exc}); {hint}") from None


def _probe(address: str, timeout: Any) -> None:
    """Fail at once where nothing listens at a tcp:// or tls:// address.

    distributed's Client retries a refused connection until its timeout runs
    out (30 s by default); a port with no listener is worth saying so now.
    """

    parts = urlsplit(address)
    if parts.scheme not in SCHEDULER_SCHEMES or parts.hostname is None or parts.port is None:
        return
    socket.create_connection((parts.hostname, parts.port), timeout=parse_timedelta(timeout)).close()


def _start_cluster(config: ClusterConfig) -> Any:
    options = config.daskstream.get(config.kind) or {}
    # Workers and job classes read their settings from dask.config while they are created.
    with _applied(config), _started(config):
        if config.kind == "local":
            from distributed import LocalCluster

            local = _local_options(config)
            return LocalCluster(
                host="127.0.0.1",
                # The scheduler always serves HTTP (8787 on its host when unset): pin it to loopback.
                dashboard_address=_dashboard_points(local["dashboard-address"]) or "127.0.0.1:0",
                n_workers=local["n-workers"],
                threads_per_worker=local["threads-per-worker"],
                memory_limit=local["memory-limit"],
            )
        if config.kind in ("slurm", "pbs"):
            module = _backend(config, f"dask_jobqueue.{config.kind}")
            cluster_cls = module.SLURMCluster if config.kind == "slurm" else module.PBSCluster
            return cluster_cls()
        if config.kind == "kubernetes":
            return _backend(config, "dask_kubernetes.operator").KubeCluster()
        # ssh
        _backend(config, "asyncssh")
        from distributed import SSHCluster

        hosts = _ssh_hosts(config)
        return SSHCluster(
            hosts,
            connect_options=options.get("connect-options") or {},
            worker_options=options.get("worker-options") or {},
            scheduler_options=options.get("scheduler-options") or {},
            remote_python=options.get("remote-python"),
        )


@contextlib.contextmanager
def _started(config: ClusterConfig) -> Iterator[None]:
    """Errors of a cluster that would not start, as one line naming the file."""
    try:
        yield
    except (TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(
            f"cluster configuration {config.path} ({config.kind}): the cluster refused its settings "
            f"({_innermost(exc)}); correct them, or compare with the file in cluster-configs/"
        ) from exc
    except (OSError, RuntimeError, TimeoutError) as exc:
        if isinstance(exc, (ClusterConnectionError, ConfigFileNotFoundError)):
            raise
        raise ClusterConnectionError(
            f"cluster configuration {config.path} ({config.kind}): the cluster did not start "
            f"({_innermost(exc)}); check what the file asks for is there and free"
        ) from exc


def _innermost(exc: BaseException) -> str:
    # distributed wraps the reason a cluster failed in "Cluster failed to start" layers.
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _check_local(config: ClusterConfig) -> ClusterCheck:
    local = _local_options(config)
    budget = config.daskstream.get("memory-budget", "not set")
    dashboard = _dashboard_points(local["dashboard-address"])
    shown = ", ".join(_show_point(host, port) for host, port in dashboard) if dashboard else "127.0.0.1, a free port"
    return ClusterCheck(
        "local",
        [
            f"LocalCluster on 127.0.0.1: {local['n-workers']} worker(s) x {local['threads-per-worker']} thread(s)",
            f"memory limit per worker: {local['memory-limit']}; daskstream memory budget: {budget}",
            f"dashboard: {shown}",
        ],
    )


def _show_point(host: str, port: int) -> str:
    where = f"[{host}]" if ":" in host else (host or "every interface")
    return f"{where}:{port}" if port else f"{where}, a free port"


def _check_remote(config: ClusterConfig) -> ClusterCheck:
    address, security = _remote_address(config)
    lines = [f"connect to the running scheduler at {address}"]
    if security is not None:
        lines += [
            f"CA certificate: {security.tls_ca_file}",
            f"client certificate: {security.tls_client_cert}",
            f"client key: {security.tls_client_key or 'inside the certificate file'}",
            f"require encryption: {security.require_encryption}",
        ]
    return ClusterCheck(config.kind, lines)


def _check_jobqueue(config: ClusterConfig) -> ClusterCheck:
    module = _backend(config, f"dask_jobqueue.{config.kind}")
    job_cls = module.SLURMJob if config.kind == "slurm" else module.PBSJob
    with _applied(config):
        try:
            script = job_cls(scheduler=_RENDER_SCHEDULER, name="dask-worker").job_script()
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"cluster configuration {config.path} ({config.kind}): {exc}") from exc
    section = config.settings["jobqueue"][config.kind]
    jobs = _jobs(config)
    return ClusterCheck(
        config.kind,
        [
            f"{config.kind.upper()} jobs: {jobs}, each {section['cores']} core(s) and {section['memory']}",
            "job script (the scheduler address is filled in when the cluster starts):",
        ],
        job_script=script,
    )


def _check_kubernetes(config: ClusterConfig) -> ClusterCheck:
    operator = _backend(config, "dask_kubernetes.operator")
    with _applied(config):
        get = dask.config.get
        try:
            spec = operator.make_cluster_spec(
                name=get("kubernetes.name"),
                image=get("kubernetes.image"),
                n_workers=get("kubernetes.count.start"),
                resources=get("kubernetes.resources"),
                env=get("kubernetes.env"),
                worker_command=get("kubernetes.worker-command"),
                scheduler_service_type=get("kubernetes.scheduler-service-type"),
                idle_timeout=get("kubernetes.idle-timeout") or 0,
            )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(f"cluster configuration {config.path} (kubernetes): {exc}") from exc
        namespace = get("kubernetes.namespace") or "the current namespace"
    workers = spec["spec"]["worker"]["replicas"]
    return ClusterCheck(
        "kubernetes",
        [
            f"DaskCluster {spec['metadata']['name']!r} in {namespace}: {workers} worker(s) of image {_worker_image(spec)}"
        ],
        spec=spec,
    )


def _worker_image(spec: dict) -> str:
    return spec["spec"]["worker"]["spec"]["containers"][0]["image"]


def _check_ssh(config: ClusterConfig) -> ClusterCheck:
    _backend(config, "asyncssh")
    hosts = _ssh_hosts(config)
    return ClusterCheck(
        "ssh",
        [f"SSHCluster: scheduler on {hosts[0]}, workers on {', '.join(hosts[1:])}"],
    )


_CHECKS = {
    "local": _check_local,
    "remote": _check_remote,
    "tls": _check_remote,
    "ssh": _check_ssh,
    "slurm": _check_jobqueue,
    "pbs": _check_jobqueue,
    "kubernetes": _check_kubernetes,
}


def _local_options(config: ClusterConfig) -> dict[str, Any]:
    local = {"n-workers": 1, "threads-per-worker": 1, "memory-limit": "auto", "dashboard-address": None}
    given = config.daskstream.get("local") or {}
    if not isinstance(given, Mapping):
        raise InvalidArgumentError(
            f"cluster configuration {config.path}: daskstream.local must be a mapping of LocalCluster settings, "
            f"not {given!r}"
        )
    local.update(given)
    for key in ("n-workers", "threads-per-worker"):
        value = local[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(
                f"cluster configuration {config.path}: daskstream.local.{key} must be a positive integer, not {value!r}"
            )
    limit = local["memory-limit"]
    if limit != "auto":
        try:
            # parse_bytes reads text and numbers; anything else is not a size.
            if isinstance(limit, bool) or not isinstance(limit, (str, int, float)) or parse_bytes(limit) <= 0:
                raise ValueError
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"cluster configuration {config.path}: daskstream.local.memory-limit must be a size "
                f"such as '2GiB' or 'auto', not {limit!r}"
            ) from None
    return local


def _dashboard_points(value: Any) -> list[tuple[str, int]]:
    """The (host, port) pairs a local dashboard address names; ``[]`` for none.

    Read from a screened configuration: the address was parsed and, without
    the user's consent, held to loopback when the file was loaded (see cluster_rules).
    """
    return [] if value is None else listen_points(value)


def _remote_address(config: ClusterConfig) -> tuple[str, Any]:
    address = config.settings["scheduler-address"]
    scheme = "tls://" if config.kind == "tls" else "tcp://"
    what = f"cluster configuration {config.path}: scheduler-address"
    check_scheduler_address(address, what=what)
    if not address.startswith(scheme):
        hint = " (a tls:// scheduler needs 'cluster: tls' and certificates)" if address.startswith("tls://") else ""
        raise InvalidArgumentError(f"{what} {address!r} must start with {scheme}{hint}")
    if config.kind == "remote":
        return address, None
    from distributed.security import Security

    tls = config.settings["distributed"]["comm"]["tls"]
    client = tls.get("client") or {}
    return address, Security(
        tls_ca_file=_certificate(config, "distributed.comm.tls.ca-file", tls["ca-file"]),
        tls_client_cert=_certificate(config, "distributed.comm.tls.client.cert", client["cert"]),
        tls_client_key=_certificate(config, "distributed.comm.tls.client.key", client.get("key")),
        require_encryption=bool(_lookup(config.settings, "distributed.comm.require-encryption")),
    )


def _certificate(config: ClusterConfig, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"cluster configuration {config.path}: {key} must be a file path, not {value!r}")
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = config.path.parent / path
    if not path.is_file():
        raise ConfigFileNotFoundError(f"cluster configuration {config.path}: {key} names {path}, which does not exist")
    return str(path)


def _jobs(config: ClusterConfig) -> int:
    jobs = config.daskstream.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise InvalidArgumentError(
            f"cluster configuration {config.path}: daskstream.jobs must be a whole number of jobs, not {jobs!r}"
        )
    return jobs


def _ssh_hosts(config: ClusterConfig) -> list[str]:
    hosts = config.daskstream["ssh"]["hosts"]
    if not isinstance(hosts, list) or len(hosts) < 2 or not all(isinstance(h, str) and h for h in hosts):
        raise InvalidArgumentError(
            f"cluster configuration {config.path}: daskstream.ssh.hosts must list at least two host names "
            f"(the scheduler's first, then the workers'), not {hosts!r}"
        )
    return hosts


def _backend(config: ClusterConfig, module: str) -> Any:
    package, extra = _BACKENDS[config.kind]
    try:
        importlib.import_module(package)
        return importlib.import_module(module)
    except ImportError as exc:
        raise InvalidArgumentError(
            f"cluster configuration {config.path} ({config.kind}) needs {exc.name or package}, "
            f"which is not installed; install it with: pip install 'daskstream[{extra}]'"
        ) from exc


@contextlib.contextmanager
def _applied(config: ClusterConfig) -> Iterator[None]:
    """The file's settings on top of the current dask config, leaf by leaf, once screened again."""
    screen(config)
    with dask.config.set(dict(_leaves(config.settings))):
        yield


def _leaves(settings: Mapping, prefix: str = "") -> Iterator[tuple[str, Any]]:
    # dask.config.set replaces a whole section given as a dict; dotted leaves keep its other defaults.
    # Recursion is bounded: documents are read no deeper than documents.MAX_DEPTH.
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _lookup(settings: Mapping, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value
