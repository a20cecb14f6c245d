"""The kinds of cluster a file can name, in one registry: what each needs, how it starts, how it is checked.

Each :class:`ClusterKind` says which keys a file of that kind must set, the
optional package it needs (and the extra that installs it), whether its
scheduler listens beyond loopback by design, how its cluster starts and how it
is checked without starting anything. Backends outside distributed are
imported only by the kinds that need them.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import dask.config
from dask.utils import parse_bytes

from daskstream.dependencies import installed_version, optional_import
from daskstream.errors import ConfigFileNotFoundError, InvalidArgumentError
from daskstream.runtime.addresses import check_scheduler_address, listen_points
from daskstream.runtime.clusters.config import ClusterCheck, ClusterConfig, leaves, lookup
from daskstream.runtime.clusters.rules import is_dask_image, screen
from daskstream.runtime.stopping import ctrl_c_kept_from_children

# Only checks render job scripts; this address is never contacted.
_RENDER_SCHEDULER = "tcp://127.0.0.1:8786"


@dataclass(frozen=True)
class ClusterKind:
    """One kind of cluster a file can name (``daskstream: cluster: <name>``).

    Attributes
    ----------
    name
        The kind's name in files.
    required
        Dotted keys a file of this kind must set.
    check
        What :func:`~daskstream.runtime.clusters.check_cluster_config` reports, found without
        starting or contacting anything.
    start
        Starts the cluster (in the file's settings); ``None`` for kinds that join a scheduler
        already running at the file's ``scheduler-address``.
    backend
        ``(package, extra)``: the optional package the kind needs and the daskstream extra that
        installs it; ``None`` when distributed is enough.
    listens
        Why its scheduler listens beyond loopback by design (its workers run on other machines),
        which needs the user's consent; ``None`` for kinds that stay on loopback unless told otherwise.
    scaled_in_jobs
        Whether the cluster is scaled to ``daskstream.jobs`` batch jobs once started.
    """

    name: str
    required: tuple[str, ...]
    check: Callable[[ClusterConfig], ClusterCheck]
    start: Callable[[ClusterConfig], Any] | None = None
    backend: tuple[str, str] | None = None
    listens: str | None = None
    scaled_in_jobs: bool = False


@contextlib.contextmanager
def applied(config: ClusterConfig) -> Iterator[None]:
    """The file's settings on top of the current dask config, leaf by leaf, once screened again."""
    screen(config, listens=CLUSTER_KINDS[config.kind].listens)
    with dask.config.set(dict(leaves(config.settings))):
        yield


def backend(config: ClusterConfig, module: str) -> Any:
    """``module`` of the kind's optional backend; a one-line error naming the package, its version and the
    extra that installs it when it is missing or too old."""
    package, extra = CLUSTER_KINDS[config.kind].backend or (module, None)
    with warnings.catch_warnings():
        # asyncssh imports cryptography's DSA keys, which recent cryptography releases deprecate on import: a
        # warning about a key type the user never chose, printed on every SSH cluster's start.
        warnings.filterwarnings("ignore", message="DSA is deprecated", category=UserWarning)
        return optional_import(
            module, package=package, needed_for=f"cluster configuration {config.path} ({config.kind})", extra=extra
        )


# --- starting ----------------------------------------------------------------------------------


def _start_local(config: ClusterConfig) -> Any:
    from distributed import LocalCluster

    local = local_options(config)
    with ctrl_c_kept_from_children():  # its workers are stopped by this process, not by Ctrl-C
        return LocalCluster(
            host="127.0.0.1",
            # The scheduler always serves HTTP (8787 on its host when unset): pin it to loopback.
            dashboard_address=_dashboard_points(local["dashboard-address"]) or "127.0.0.1:0",
            n_workers=local["n-workers"],
            threads_per_worker=local["threads-per-worker"],
            memory_limit=local["memory-limit"],
        )


def _start_jobqueue(config: ClusterConfig) -> Any:
    module = backend(config, f"dask_jobqueue.{config.kind}")
    return (module.SLURMCluster if config.kind == "slurm" else module.PBSCluster)()


def _start_kubernetes(config: ClusterConfig) -> Any:
    operator = backend(config, "dask_kubernetes.operator")
    with dask.config.set({"kubernetes.env": _pod_environment(config)}):
        return operator.KubeCluster()


def _pod_environment(config: ClusterConfig) -> dict[str, str]:
    """The pods' environment: the file's, and on dask's own images (which lack daskstream) this daskstream.

    dask's images install the packages ``EXTRA_PIP_PACKAGES`` names when a
    pod starts; without daskstream there, workers could not run its tasks.
    """
    env = dict(dask.config.get("kubernetes.env") or {})
    image = str(dask.config.get("kubernetes.image") or "")
    if is_dask_image(image):
        env.setdefault("EXTRA_PIP_PACKAGES", f"daskstream=={installed_version('daskstream')}")
    return env


def _start_ssh(config: ClusterConfig) -> Any:
    backend(config, "asyncssh")
    from distributed import SSHCluster

    options = config.daskstream.get("ssh") or {}
    return SSHCluster(
        _ssh_hosts(config),
        connect_options=options.get("connect-options") or {},
        worker_options=options.get("worker-options") or {},
        scheduler_options=options.get("scheduler-options") or {},
        remote_python=options.get("remote-python"),
    )


# --- checking ----------------------------------------------------------------------------------


def _check_local(config: ClusterConfig) -> ClusterCheck:
    local = local_options(config)
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
    address, security = remote_address(config)
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
    module = backend(config, f"dask_jobqueue.{config.kind}")
    job_cls = module.SLURMJob if config.kind == "slurm" else module.PBSJob
    with applied(config):
        try:
            script = job_cls(scheduler=_RENDER_SCHEDULER, name="dask-worker").job_script()
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"cluster configuration {config.path} ({config.kind}): {exc}") from exc
    section = config.settings["jobqueue"][config.kind]
    count = job_count(config)
    return ClusterCheck(
        config.kind,
        [
            f"{config.kind.upper()} jobs: {count}, each {section['cores']} core(s) and {section['memory']}",
            "job script (the scheduler address is filled in when the cluster starts):",
        ],
        job_script=script,
    )


def _check_kubernetes(config: ClusterConfig) -> ClusterCheck:
    operator = backend(config, "dask_kubernetes.operator")
    with applied(config):
        get = dask.config.get
        try:
            # A copy: the spec holds the config's own dicts (resources, env), which dask.config.set
            # empties again on leaving, so the spec shown would lose them.
            spec = copy.deepcopy(
                operator.make_cluster_spec(
                    name=get("kubernetes.name"),
                    image=get("kubernetes.image"),
                    n_workers=get("kubernetes.count.start"),
                    resources=get("kubernetes.resources"),
                    env=_pod_environment(config),
                    worker_command=get("kubernetes.worker-command"),
                    scheduler_service_type=get("kubernetes.scheduler-service-type"),
                    idle_timeout=get("kubernetes.idle-timeout") or 0,
                )
            )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(f"cluster configuration {config.path} (kubernetes): {exc}") from exc
        namespace = get("kubernetes.namespace") or "the current namespace"
        installs = (
            _pod_environment(config).get("EXTRA_PIP_PACKAGES") if is_dask_image(get("kubernetes.image")) else None
        )
    workers = spec["spec"]["worker"]["replicas"]
    image = _worker_image(spec)
    lines = [f"DaskCluster {spec['metadata']['name']!r} in {namespace}: {workers} worker(s) of image {image}"]
    if installs:
        lines.append(
            f"dask's image does not carry daskstream: each pod installs {installs} from the package index as it "
            "starts (EXTRA_PIP_PACKAGES); for pods that start at once, build an image with it"
        )
    return ClusterCheck("kubernetes", lines, spec=spec)


def _worker_image(spec: dict) -> str:
    return spec["spec"]["worker"]["spec"]["containers"][0]["image"]


def _check_ssh(config: ClusterConfig) -> ClusterCheck:
    backend(config, "asyncssh")
    hosts = _ssh_hosts(config)
    return ClusterCheck(
        "ssh",
        [f"SSHCluster: scheduler on {hosts[0]}, workers on {', '.join(hosts[1:])}"],
    )


# --- a file's settings, read for its kind -----------------------------------------------------------


def local_options(config: ClusterConfig) -> dict[str, Any]:
    """The ``daskstream.local`` options of a ``local`` file, with their defaults, checked."""
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
    the user's consent, held to loopback when the file was loaded (see rules.py).
    """
    return [] if value is None else listen_points(value)


def remote_address(config: ClusterConfig) -> tuple[str, Any]:
    """The scheduler address of a ``remote`` or ``tls`` file, and the TLS ``Security`` (``None`` for remote)."""
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
        require_encryption=bool(lookup(config.settings, "distributed.comm.require-encryption")),
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


def job_count(config: ClusterConfig) -> int:
    """How many batch jobs a ``slurm`` or ``pbs`` file asks for (``daskstream.jobs``, 1 by default)."""
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


# --- the registry -------------------------------------------------------------------------------

_BATCH_SCHEDULER = (
    "starts a dask scheduler on this machine that listens on its network interfaces, so that the batch "
    "jobs' workers reach it; anyone else who reaches it can run code as you"
)


def _batch_kind(name: str) -> ClusterKind:
    """A dask-jobqueue kind: workers in batch jobs of the ``name`` scheduler, ``daskstream.jobs`` of them."""
    return ClusterKind(
        name,
        (f"jobqueue.{name}.cores", f"jobqueue.{name}.memory"),
        _check_jobqueue,
        _start_jobqueue,
        backend=("dask-jobqueue", "jobqueue"),
        listens=_BATCH_SCHEDULER,
        scaled_in_jobs=True,
    )


CLUSTER_KINDS: dict[str, ClusterKind] = {
    kind.name: kind
    for kind in (
        ClusterKind("local", (), _check_local, _start_local),
        ClusterKind("remote", ("scheduler-address",), _check_remote),
        ClusterKind(
            "ssh",
            ("daskstream.ssh.hosts",),
            _check_ssh,
            _start_ssh,
            backend=("asyncssh", "ssh"),
            listens="starts a dask scheduler and workers on the hosts it names, listening on their networks; "
            "anyone who reaches the scheduler can run code as you there",
        ),
        _batch_kind("slurm"),
        _batch_kind("pbs"),
        ClusterKind(
            "kubernetes",
            ("kubernetes.name", "kubernetes.image"),
            _check_kubernetes,
            _start_kubernetes,
            backend=("dask-kubernetes", "kubernetes"),
            listens="starts a dask scheduler and workers in Kubernetes pods, listening on the cluster's network; "
            "anyone who reaches the scheduler can run code with its permissions",
        ),
        ClusterKind(
            "tls",
            ("scheduler-address", "distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert"),
            _check_remote,
        ),
    )
}


__all__ = ["CLUSTER_KINDS", "ClusterKind", "applied", "backend", "job_count", "local_options", "remote_address"]
