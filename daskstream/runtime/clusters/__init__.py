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

The kinds are one registry (:mod:`~daskstream.runtime.clusters.kinds`); what a
cluster file may set, and the consent that lets it set more, is decided in
:mod:`~daskstream.runtime.clusters.rules`.

daskstream's optimizer runs in the scheduler's process and its tasks in the
workers' (:mod:`~daskstream.runtime.versions`): joining a running scheduler,
or starting one whose processes run elsewhere, compares the daskstream, dask,
distributed and numpy they import with this client's, once per connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import dask
import dask.config
from dask.utils import parse_timedelta

from daskstream.config import check_section
from daskstream.documents import read_yaml
from daskstream.errors import ClusterConnectionError, ConfigFileNotFoundError, InvalidArgumentError
from daskstream.runtime.addresses import SCHEDULER_SCHEMES, check_scheduler_address
from daskstream.runtime.clusters.config import ClusterCheck, ClusterConfig, lookup
from daskstream.runtime.clusters.consent import ALLOW_CODE, ALLOW_NETWORK_LISTEN, allowance
from daskstream.runtime.clusters.dotted_keys import sections
from daskstream.runtime.clusters.kinds import CLUSTER_KINDS, applied, job_count, remote_address
from daskstream.runtime.clusters.rules import screen
from daskstream.runtime.versions import ClusterVersions, ask_versions, check_cluster_versions, this_process

if TYPE_CHECKING:
    import distributed

__all__ = [
    "KINDS",
    "ClusterCheck",
    "ClusterConfig",
    "check_cluster",
    "check_cluster_config",
    "connect",
    "join",
    "load_cluster_config",
]

#: The kinds of cluster a file can name, in the order messages list them.
KINDS = tuple(CLUSTER_KINDS)


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
    # The settings it makes for daskstream (not the cluster's description) are checked as the user's are.
    settings_made = {k: v for k, v in section.items() if k in ("memory-budget", "planning", "compute")}
    check_section(settings_made, where=f"cluster configuration {path}")
    for key in CLUSTER_KINDS[kind].required:
        if lookup(settings, key) is None:
            raise InvalidArgumentError(f"cluster configuration {path} ({kind}) lacks the required key '{key}'")
    config = ClusterConfig(
        path=path, kind=kind, settings=settings, allow_code=allow_code, allow_network_listen=allow_network_listen
    )
    screen(config, listens=CLUSTER_KINDS[kind].listens)
    return config


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
    return CLUSTER_KINDS[config.kind].check(config)


def check_cluster(
    target: str | Path, *, allow_code: bool | None = None, allow_network_listen: bool | None = None
) -> ClusterCheck:
    """What ``daskstream cluster check`` reports: a file checked, and the versions its running cluster imports.

    Parameters
    ----------
    target
        A cluster configuration file, checked as :func:`check_cluster_config`
        does; or the address of a running scheduler (``tcp://host:8786``).
    allow_code, allow_network_listen
        As for :func:`load_cluster_config`.

    Returns
    -------
    ClusterCheck
        Its ``lines`` end with the versions of daskstream, dask, distributed
        and numpy on this client, the scheduler and the workers, and its
        ``versions`` hold them (call ``versions.check()`` to raise where they
        differ). For a file of a cluster that is not running (every kind that
        starts one, a remote scheduler nothing answers for) the last line says
        they cannot be compared until it runs, and ``versions`` is ``None``.

    Raises
    ------
    ClusterConnectionError
        ``target`` is an address and no scheduler answers there.
    """
    if isinstance(target, str) and "://" in target:
        kind = "tls" if target.startswith("tls://") else "remote"
        return _with_versions(ClusterCheck(kind, [f"the running scheduler at {target}"]), target, None, None)
    config = load_cluster_config(target, allow_code=allow_code, allow_network_listen=allow_network_listen)
    check = CLUSTER_KINDS[config.kind].check(config)
    if config.kind == "local":
        here = ", ".join(f"{name} {version}" for name, version in this_process().versions.items())
        return _added(check, [f"versions: its processes run this Python environment's ({here})"])
    if CLUSTER_KINDS[config.kind].start is not None:
        return _added(
            check,
            [
                "versions: cannot compare until the cluster runs; once it does, `daskstream cluster check` with "
                "its scheduler's address (tcp://HOST:PORT) compares its scheduler's and workers' with this client's"
            ],
        )
    address, security = remote_address(config)
    with applied(config):
        try:
            _probe(address, _connect_timeout())
        except OSError as exc:
            return _added(
                check, [f"versions: cannot compare until the cluster runs (nothing answers at {address}: {exc})"]
            )
        return _with_versions(check, address, security, str(config.path))


def _with_versions(check: ClusterCheck, address: str, security: Any, source: str | None) -> ClusterCheck:
    """``check`` with the versions the scheduler at ``address`` and its workers import, beside this client's."""
    client = _client(address, security=security, source=source)
    try:
        found = ask_versions(client)
    finally:
        client.close()
    return _added(check, found.lines(), found)


def _added(check: ClusterCheck, lines: list[str], versions: ClusterVersions | None = None) -> ClusterCheck:
    """``check`` with ``lines`` about versions added to its summary, and the ``versions`` found."""
    # A job script's summary ends with the line that introduces the script, printed just after it.
    at = len(check.lines) - 1 if check.job_script else len(check.lines)
    return dataclasses.replace(check, lines=[*check.lines[:at], *lines, *check.lines[at:]], versions=versions)


def connect(config: ClusterConfig) -> tuple[distributed.Client, object | None]:
    """A Client for the configured cluster, and the cluster object started for it.

    The second item is ``None`` when the Client joined a scheduler that was
    already running (``remote``, ``tls``): close only what this returned.
    The configuration is screened again first, with the consent it was loaded
    with, so a hand-made :class:`ClusterConfig` gets no further than a file.

    Raises
    ------
    ClusterVersionError
        The scheduler, or a worker already connected, of a cluster that runs
        elsewhere (not ``local``) cannot import daskstream or imports other
        versions than this client (see :mod:`daskstream.runtime.versions`).
    """
    from distributed import Client

    kind = CLUSTER_KINDS[config.kind]
    if kind.start is None:
        address, security = remote_address(config)
        # The file's other settings (timeouts, comm options) hold while the Client connects.
        with applied(config):
            return join(address, security=security, source=str(config.path)), None
    jobs = job_count(config) if kind.scaled_in_jobs else None
    # Workers and job classes read their settings from dask.config while they are created.
    with applied(config), _started(config):
        cluster = kind.start(config)
    try:
        if jobs is not None:
            cluster.scale(jobs=jobs)
        with applied(config):
            client = Client(cluster)
    except BaseException:
        cluster.close()
        raise
    if kind.listens is not None:
        # Its scheduler or workers run on other machines, in Python environments of their own; a local
        # cluster's processes run this one.
        try:
            check_cluster_versions(client)
        except BaseException:
            client.close()
            cluster.close()
            raise
    return client, cluster


def join(address: str, *, security: Any = None, source: str | None = None) -> distributed.Client:
    """A Client to the scheduler running at ``address``, once its processes import what this client does.

    A clear error when no scheduler answers, or when the scheduler or a
    worker cannot import daskstream or imports other versions of it, dask,
    distributed or numpy (see :mod:`daskstream.runtime.versions`): daskstream
    plans each computation in the scheduler's process and runs it in the
    workers'.

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
    ClusterVersionError
        The scheduler or a worker differs from this client; the Client is closed.
    """
    client = _client(address, security=security, source=source)
    try:
        check_cluster_versions(client)
    except BaseException:
        client.close()
        raise
    return client


def _client(address: str, *, security: Any, source: str | None) -> distributed.Client:
    """A Client to the scheduler at ``address``, its versions not yet compared (see :func:`join`)."""
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
    timeout = _connect_timeout()
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


def _connect_timeout() -> Any:
    """How long a Client waits to connect: ``distributed.comm.timeouts.connect``."""
    # distributed's defaults enter dask.config when it is imported.
    import distributed  # noqa: F401

    return dask.config.get("distributed.comm.timeouts.connect")


def _probe(address: str, timeout: Any) -> None:
    """Fail at once where nothing listens at a tcp:// or tls:// address.

    distributed's Client retries a refused connection until its timeout runs
    out (30 s by default); a port with no listener is worth saying so now.
    """

    parts = urlsplit(address)
    if parts.scheme not in SCHEDULER_SCHEMES or parts.hostname is None or parts.port is None:
        return
    socket.create_connection((parts.hostname, parts.port), timeout=parse_timedelta(timeout)).close()


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
