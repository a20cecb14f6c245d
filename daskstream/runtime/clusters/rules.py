"""What a cluster file may set: screened as data, code and network listening refused without consent.

It is one allow-list, setting by setting, with the reason each rule exists,
so that the question "may a file set this?" has one place to look; the checks
its rules are built from are :mod:`~daskstream.runtime.clusters.setting_checks`,
the consent they ask for :mod:`~daskstream.runtime.clusters.consent`.

A cluster file is data, never code
----------------------------------
Files are read by :func:`daskstream.documents.read_yaml` (no Python
tags, bounded size, depth and aliases), and only settings daskstream knows to
be data are passed on to dask: timeouts, memory thresholds, sizes, certificate
paths, batch resources. Refused unless the user allows them, outside the file:

- **code** (``daskstream.cluster-files.allow-code``): every setting that
  imports a module, calls a named class or function, runs a file or a
  command, or sets environment variables of a process -- distributed's
  ``preload``, ``preload-argv``, ``http.routes``, ``active-memory-manager.policies``,
  ``client.security-loader``, ``scheduler.allowed-imports``, ``nanny.environ``
  and ``nanny.pre-spawn-environ`` (other than thread counts and malloc
  tuning), ``logging``; dask-jobqueue's ``python``, ``worker-command``,
  ``shebang``, ``job-script-prologue``, ``worker-extra-args``,
  ``job-extra-directives`` (batch directives can set the job's environment)
  and any text that is not a plain word in the job script; dask-kubernetes'
  ``image`` (other than dask's own images), ``env``, ``worker-command``,
  ``custom-cluster-spec``, ``scheduler-jupyter``; SSH's ``remote-python``,
  worker and scheduler options such as ``worker_class`` or ``preload``, and
  connect options such as ``proxy_command`` or ``known_hosts: null``; and
  any setting daskstream does not know. The commands that run a batch job's
  or a pod's worker are what such clusters are for, and they run on machines
  that can read your data with your credentials: they are code from the file
  all the same, so they need the same consent.
- **listening on a network** (``daskstream.cluster-files.allow-network-listen``):
  an address in the file that is not loopback, and the kinds whose scheduler
  must be reached from other machines (``ssh``, ``slurm``, ``pbs``,
  ``kubernetes``). A dask scheduler runs whatever any client that reaches it
  sends, so anyone who can reach one can run code as you.

Both settings are read from dask's configuration before the file is read
(``DASK_DASKSTREAM__CLUSTER_FILES__ALLOW_CODE=true``, a YAML file in
``~/.config/dask/``, ``dask.config.set``, or the ``--allow-code`` and
``--allow-network-listen`` options of the ``daskstream`` command); a cluster
file that sets them itself is refused.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from daskstream.errors import InvalidArgumentError, shown
from daskstream.runtime.addresses import valid_host
from daskstream.runtime.clusters.consent import ALLOW_CODE, ALLOW_HINTS, ALLOW_NETWORK_LISTEN
from daskstream.runtime.clusters.dotted_keys import _canonical
from daskstream.runtime.clusters.setting_checks import (
    _all,
    _code,
    _data,
    _environment,
    _host,
    _interface,
    _is_number,
    _is_scalar,
    _listen,
    _mapping_of,
    _never,
    _one_of,
    _options,
    _path_or_paths,
    _Problem,
    _Rule,
    _shell_words,
    _typed,
)

if TYPE_CHECKING:
    from daskstream.runtime.clusters.config import ClusterConfig

__all__ = ["is_dask_image", "screen"]


# --- screening: what a cluster file may set ---------------------------------------------------


def screen(config: ClusterConfig, *, listens: str | None = None) -> None:
    """Refuse the first setting of ``config`` that its consent does not cover; say how many more there are.

    ``listens``: why the file's kind of cluster listens beyond loopback by design (its workers run on
    other machines), which then needs consent too.
    """
    problems: list[tuple[str, _Problem]] = []
    _screen_section(config.settings, (), problems)
    # After the settings: a setting's own reason is the more precise one.
    if listens is not None:
        problems.append(("", _Problem(listens, ALLOW_NETWORK_LISTEN)))
    allowed = {ALLOW_CODE: config.allow_code, ALLOW_NETWORK_LISTEN: config.allow_network_listen}
    refused = [(key, p) for key, p in problems if p.needs is None or not allowed[p.needs]]
    if not refused:
        return
    # Malformed settings first (no consent helps), then code, then listening.
    order = {None: 0, ALLOW_CODE: 1, ALLOW_NETWORK_LISTEN: 2}
    refused.sort(key=lambda item: order[item[1].needs])
    key, problem = refused[0]
    subject = (
        f"cluster configuration {config.path}: {key}" if key else f"cluster configuration {config.path} ({config.kind})"
    )
    message = f"{subject} {problem.reason}"
    if problem.needs is not None:
        message += f"; {ALLOW_HINTS[problem.needs]}"
    if len(refused) > 1:
        message += f" ({len(refused) - 1} more setting(s) of the file are refused too)"
    raise InvalidArgumentError(message)


def _screen_section(section: Mapping, path: tuple[str, ...], problems: list[tuple[str, _Problem]]) -> None:
    for key, value in section.items():
        here = (*path, key)
        dotted = ".".join(here)
        canonical = ".".join(_canonical(part) for part in here)
        rule = _rule_for(canonical)
        if rule is not None:
            problem = rule(value)
            if problem is not None:
                problems.append((f"{dotted} = {shown(value, 120)}", problem))
            continue
        if isinstance(value, Mapping) and value:
            _screen_section(value, here, problems)
            continue
        if canonical in _SECTIONS:
            if not (value is None or isinstance(value, Mapping)):
                problems.append((f"{dotted} = {shown(value, 120)}", _Problem("must be a mapping of settings", None)))
            continue
        problem = _unlisted(canonical)
        if problem is not None:
            problems.append((f"{dotted} = {shown(value, 120)}", problem))


def _rule_for(canonical: str) -> _Rule | None:
    rule = _RULES.get(canonical)
    if rule is not None:
        return rule
    for pattern, pattern_rule in _PATTERN_RULES:
        if fnmatch.fnmatchcase(canonical, pattern):
            return pattern_rule
    return None


def _unlisted(canonical: str) -> _Problem | None:
    """A setting no rule owns: data if allow-listed, else refused (as code where its name says so)."""
    parts = canonical.split(".")
    if parts[0] == "daskstream":
        return _Problem(
            f"is not a daskstream setting a cluster file may make (they are: {', '.join(sorted(_DASKSTREAM_KEYS))})",
            None,
        )
    for word, what in _CODE_WORDS:
        if any(fnmatch.fnmatchcase(part, word) for part in parts):
            return _Problem(f"looks like {what}, which is code")
    if any(fnmatch.fnmatchcase(canonical, pattern) for pattern in _DATA_SETTINGS):
        return None
    return _Problem("is not a setting daskstream knows to be data (it may import or run code)")


# Settings of dask and distributed that are plain data: numbers, durations, sizes, flags,
# certificate paths. Anything not matched here (nor owned by a rule below) needs allow-code.
_DATA_SETTINGS = (
    "temporary-directory",
    "distributed.version",
    "distributed.scheduler.allowed-failures",
    "distributed.scheduler.bandwidth",
    "distributed.scheduler.blocked-handlers",
    "distributed.scheduler.default-data-size",
    "distributed.scheduler.reuse-broadcast-comm",
    "distributed.scheduler.events-cleanup-delay",
    "distributed.scheduler.idle-timeout",
    "distributed.scheduler.no-workers-timeout",
    "distributed.scheduler.work-stealing",
    "distributed.scheduler.work-stealing-interval",
    "distributed.scheduler.worker-saturation",
    "distributed.scheduler.rootish-taskgroup",
    "distributed.scheduler.rootish-taskgroup-dependencies",
    "distributed.scheduler.worker-ttl",
    "distributed.scheduler.unknown-task-duration",
    "distributed.scheduler.validate",
    "distributed.scheduler.dashboard.status.task-stream-length",
    "distributed.scheduler.dashboard.tasks.task-stream-length",
    "distributed.scheduler.dashboard.tls.*",
    "distributed.scheduler.locks.*",
    "distributed.scheduler.active-memory-manager.start",
    "distributed.scheduler.active-memory-manager.interval",
    "distributed.scheduler.active-memory-manager.measure",
    "distributed.worker.blocked-handlers",
    "distributed.worker.use-file-locking",
    "distributed.worker.transfer.*",
    "distributed.worker.connections.*",
    "distributed.worker.daemon",
    "distributed.worker.validate",
    "distributed.worker.lifetime.*",
    "distributed.worker.profile.*",
    "distributed.worker.memory.*",
    "distributed.client.direct-to-workers",
    "distributed.client.heartbeat",
    "distributed.client.scheduler-info-interval",
    "distributed.deploy.*",
    "distributed.adaptive.*",
    "distributed.comm.retry.*",
    "distributed.comm.compression",
    "distributed.comm.shard",
    "distributed.comm.offload",
    "distributed.comm.socket-backlog",
    "distributed.comm.zstd.*",
    "distributed.comm.timeouts.*",
    "distributed.comm.require-encryption",
    "distributed.comm.tls.*",
    "distributed.comm.websockets.*",
    "distributed.diagnostics.computations.max-history",
    "distributed.diagnostics.computations.nframes",
    "distributed.diagnostics.erred-tasks.*",
    "distributed.p2p.*",
    "distributed.admin.large-graph-warning-threshold",
    "distributed.admin.tick.*",
    "distributed.admin.max-error-length",
    "distributed.admin.log-length",
    "distributed.admin.low-level-log-length",
    "distributed.admin.system-monitor.*",
    "daskstream.planning.*",
    "daskstream.compute.*",
)

# Words in a setting's name that mark code: they explain a refusal of a setting daskstream does not list.
_CODE_WORDS = (
    ("preload*", "a module or file to import"),
    ("*routes*", "modules to import into a web server"),
    ("*polic*", "classes to import and call"),
    ("*class*", "a class to import and call"),
    ("*loader*", "a function to import and call"),
    ("*environ*", "environment variables of a process"),
    ("env", "environment variables of a process"),
    ("env-*", "environment variables of a process"),
    ("*import*", "modules to import"),
    ("*command*", "a command to run"),
    ("*cmd*", "a command to run"),
    ("*python*", "the Python to run"),
    ("*prologue*", "commands to run"),
    ("*script*", "a script to run"),
    ("*shebang*", "the interpreter of a script"),
    ("*template*", "a process specification"),
    ("*spec*", "a process specification"),
    ("*plugin*", "plugins to import"),
    ("logging*", "logging configuration, which builds the classes it names"),
    ("*pickle*", "what may be unpickled"),
    ("*hook*", "a function to call"),
    ("*callback*", "a function to call"),
    ("*initializer*", "a function to call"),
    ("*module*", "a module to import"),
    ("*extra*", "extra commands or arguments"),
    ("*jupyter*", "a Jupyter server, which runs code"),
    ("*image*", "a container image to run"),
    ("*exec*", "something to run"),
    ("*handler*", "a handler to import"),
    ("*factory*", "a function to call"),
    ("*serializ*", "how data is (un)pickled"),
)

# daskstream's sections, which hold settings rather than being one.
_SECTIONS = {"daskstream.local", "daskstream.ssh", "daskstream.planning", "daskstream.compute"}

_DASKSTREAM_KEYS = {
    "cluster",
    "memory-budget",
    "jobs",
    "local",
    "ssh",
    "planning",
    "compute",
}


# --- rules for the settings that need more than "data" -------------------------------------------


_WORD_IN_COMMAND = _shell_words("a shell command on the remote host")
_SCHEDULER_OPTIONS: dict[str, _Rule] = {
    "port": _typed(lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a port number"),
    "dashboard": _typed(lambda v: isinstance(v, bool), "true or false"),
    "dashboard_address": _all(_WORD_IN_COMMAND, _listen("the scheduler's dashboard")),
    "host": _all(_WORD_IN_COMMAND, _host("the scheduler")),
    "interface": _interface("the scheduler"),
    "protocol": _one_of("tcp", "tcp://", "tls", "tls://"),
    "idle_timeout": _all(_WORD_IN_COMMAND, _typed(_is_scalar, "a duration")),
}
_WORKER_OPTIONS: dict[str, _Rule] = {
    "nthreads": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "n_workers": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "memory_limit": _all(_WORD_IN_COMMAND, _typed(_is_scalar, "a size")),
    "local_directory": _WORD_IN_COMMAND,
    "death_timeout": _all(_WORD_IN_COMMAND, _typed(_is_scalar, "a duration")),
    "lifetime": _all(_WORD_IN_COMMAND, _typed(_is_scalar, "a duration")),
    "lifetime_stagger": _all(_WORD_IN_COMMAND, _typed(_is_scalar, "a duration")),
    "lifetime_restart": _typed(lambda v: isinstance(v, bool), "true or false"),
    "resources": _all(_WORD_IN_COMMAND, _mapping_of(_is_number, "numbers")),
    "name": _WORD_IN_COMMAND,
    "dashboard": _typed(lambda v: isinstance(v, bool), "true or false"),
    "dashboard_address": _all(_WORD_IN_COMMAND, _listen("a worker's dashboard")),
    "host": _all(_WORD_IN_COMMAND, _host("a worker")),
    "listen_address": _all(_WORD_IN_COMMAND, _host("a worker")),
    "contact_address": _all(_WORD_IN_COMMAND, _host("a worker")),
    "interface": _interface("a worker"),
    "protocol": _one_of("tcp", "tcp://", "tls", "tls://"),
    "worker_port": _typed(lambda v: v is None or isinstance(v, (int, str)), "a port or a port range"),
    "nanny_port": _typed(lambda v: v is None or isinstance(v, (int, str)), "a port or a port range"),
}


_CONNECT_OPTIONS: dict[str, _Rule] = {
    "username": _typed(lambda v: isinstance(v, str), "a user name"),
    "port": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool), "a port number"),
    # Without host keys, whatever answers at a host's name gets the cluster's settings, and the
    # results it sends back are unpickled here.
    "known_hosts": lambda v: (
        None
        if _path_or_paths(v) and v
        else _Problem("turns off the check of the hosts' keys: any machine answering at their names would be trusted")
    ),
    "client_keys": _typed(lambda v: v is None or _path_or_paths(v), "a key file or a list of them"),
    "connect_timeout": _typed(_is_scalar, "a duration"),
    "login_timeout": _typed(_is_scalar, "a duration"),
    "keepalive_interval": _typed(_is_scalar, "a duration"),
    "keepalive_count_max": _typed(lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "password": _typed(lambda v: isinstance(v, str), "text"),
    "passphrase": _typed(lambda v: isinstance(v, str), "text"),
}


def _connect_options(value: Any) -> _Problem | None:
    """asyncssh.connect's options: ``proxy_command``, ``config`` (ProxyCommand) and others run commands here."""
    for options in value if isinstance(value, list) else [value]:
        problem = _options("ssh connection", _CONNECT_OPTIONS)(options)
        if problem is not None:
            return problem
    return None


def _ssh_host_names(value: Any) -> _Problem | None:
    if isinstance(value, list) and all(isinstance(h, str) and valid_host(h) for h in value):
        return None
    return _Problem("must list host names or IP addresses (the scheduler's first, then the workers')", None)


# Kubernetes names: lowercase letters, digits and dashes; {user} and {uuid} are filled in by
# dask-kubernetes (other {fields} would be filled from this process's environment).
_KUBERNETES_NAME = re.compile(r"(?:[a-z0-9-]|\{user\}|\{uuid\})+")
# dask's own images run dask's own code; any other runs code chosen by the file.
_DASK_IMAGES = re.compile(
    r"(?:ghcr\.io/dask/dask|(?:docker\.io/)?daskdev/dask)(?::[A-Za-z0-9._-]+)?(?:@sha256:[0-9a-f]{64})?"
)


def is_dask_image(image: Any) -> bool:
    """Whether ``image`` is one of dask's own container images (``ghcr.io/dask/dask``, ``daskdev/dask``)."""
    return isinstance(image, str) and _DASK_IMAGES.fullmatch(image) is not None


def _kubernetes_image(value: Any) -> _Problem | None:
    if not isinstance(value, str):
        return _Problem("must name a container image", None)
    if is_dask_image(value):
        return None
    return _Problem("is the container image every scheduler and worker pod runs: code chosen by the file")


def _jobqueue_rules(kind: str) -> dict[str, _Rule]:
    base = f"jobqueue.{kind}"
    in_script = _shell_words("the batch job script")
    words = (
        "name", "cores", "memory", "processes", "walltime", "queue", "account", "project",
        "local-directory", "shared-temp-directory", "log-directory", "resource-spec", "job-cpu",
        "job-mem", "death-timeout", "nanny", "protocol", "memory-per-core-property-name",
    )  # fmt: skip
    rules: dict[str, _Rule] = {f"{base}.{word}": in_script for word in words}
    rules.update(
        {
            f"{base}.interface": _all(in_script, _interface("the scheduler and the workers")),
            f"{base}.python": _code("is the Python the batch jobs run"),
            f"{base}.worker-command": _code("is the module the batch jobs run", "distributed.cli.dask_worker"),
            f"{base}.shebang": _code("is the interpreter of the batch job script", "#!/usr/bin/env bash"),
            f"{base}.job-script-prologue": _code("adds shell commands to the batch job script"),
            f"{base}.env-extra": _code("adds shell commands to the batch job script"),
            f"{base}.worker-extra-args": _code("adds arguments to the worker command (--preload runs code)"),
            f"{base}.extra": _code("adds arguments to the worker command (--preload runs code)"),
            f"{base}.job-extra-directives": _code("adds batch directives, which can set the job's environment"),
            f"{base}.job-extra": _code("adds batch directives, which can set the job's environment"),
            f"{base}.job-directives-skip": _typed(
                lambda v: v is None or (isinstance(v, list) and all(isinstance(i, str) for i in v)), "a list of text"
            ),
            f"{base}.header-skip": _typed(
                lambda v: v is None or (isinstance(v, list) and all(isinstance(i, str) for i in v)), "a list of text"
            ),
            f"{base}.scheduler-options": _options("scheduler started on this machine", _SCHEDULER_OPTIONS),
        }
    )
    return rules


_RULES: dict[str, _Rule] = {
    # daskstream's own section
    "daskstream.cluster": _data,
    "daskstream.memory-budget": _typed(_is_scalar, "a size such as 2GiB, or auto"),
    "daskstream.jobs": _data,
    "daskstream.local.n-workers": _data,
    "daskstream.local.threads-per-worker": _data,
    "daskstream.local.memory-limit": _data,
    "daskstream.local.dashboard-address": _listen("the dashboard"),
    "daskstream.ssh.hosts": _ssh_host_names,
    "daskstream.ssh.connect-options": _connect_options,
    "daskstream.ssh.worker-options": _options("workers", _WORKER_OPTIONS),
    "daskstream.ssh.scheduler-options": _options("scheduler", _SCHEDULER_OPTIONS),
    "daskstream.ssh.remote-python": _code("is the Python run on the remote hosts"),
    "daskstream.cluster-files": _never(
        "is the user's consent, which a cluster file cannot give itself; remove it from the file and set it "
        "outside (--allow-code, --allow-network-listen, or your own dask configuration)"
    ),
    # dask's address of the scheduler a Client joins: checked in full where it is joined.
    "scheduler-address": _data,
    # distributed: mappings of free names, choices, addresses and environments
    "distributed.scheduler.default-task-durations": _mapping_of(_is_scalar, "durations"),
    "distributed.worker.resources": _mapping_of(_is_number, "numbers"),
    "distributed.worker.multiprocessing-method": _one_of("spawn", "forkserver", "fork"),
    "distributed.comm.default-scheme": _one_of("tcp", "tls"),
    "distributed.scheduler.contact-address": _host("the scheduler"),
    "distributed.nanny.environ": _environment("the worker processes"),
    "distributed.nanny.pre-spawn-environ": _environment("the worker processes and of this process"),
    # distributed: code, named for clear messages (unlisted settings are refused anyway)
    "distributed.scheduler.preload": _code("imports the modules or runs the Python files it names in the scheduler"),
    "distributed.worker.preload": _code("imports the modules or runs the Python files it names in each worker"),
    "distributed.nanny.preload": _code("imports the modules or runs the Python files it names in each nanny"),
    "distributed.client.preload": _code("imports the modules or runs the Python files it names in this process"),
    "distributed.scheduler.preload-argv": _code("passes arguments to the scheduler's preload modules"),
    "distributed.worker.preload-argv": _code("passes arguments to the workers' preload modules"),
    "distributed.nanny.preload-argv": _code("passes arguments to the nannies' preload modules"),
    "distributed.client.preload-argv": _code("passes arguments to this process's preload modules"),
    "distributed.scheduler.active-memory-manager.policies": _code(
        "imports and calls the class each policy names", [{"class": "distributed.active_memory_manager.ReduceReplicas"}]
    ),
    "distributed.scheduler.http.routes": _code("imports the modules it names into the scheduler's web server"),
    "distributed.worker.http.routes": _code("imports the modules it names into each worker's web server"),
    "distributed.client.security-loader": _code("imports and calls the function it names when the Client connects"),
    "distributed.scheduler.allowed-imports": _code(
        "lets the scheduler import the modules clients name", ["dask", "distributed"]
    ),
    "distributed.scheduler.pickle": _one_of(True, False),
    "logging": _code("configures Python logging, which builds the classes and handlers it names"),
    "logging-file-config": _code("reads a logging file, whose settings Python evaluates as code"),
    "distributed.logging": _code("configures Python logging, which builds the classes and handlers it names"),
    # dask-jobqueue
    **_jobqueue_rules("slurm"),
    **_jobqueue_rules("pbs"),
    # dask-kubernetes (the operator's KubeCluster)
    "kubernetes.name": _typed(
        lambda v: isinstance(v, str) and bool(_KUBERNETES_NAME.fullmatch(v)),
        "a Kubernetes name (lowercase letters, digits and -, with {user} and {uuid} filled in)",
    ),
    "kubernetes.namespace": _typed(
        lambda v: v is None or (isinstance(v, str) and bool(re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", v))),
        "a Kubernetes namespace or null",
    ),
    "kubernetes.image": _kubernetes_image,
    "kubernetes.count.start": _typed(
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a number"
    ),
    "kubernetes.count.max": _typed(lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a number"),
    "kubernetes.resources": _typed(lambda v: v is None or isinstance(v, Mapping), "a mapping of requests and limits"),
    "kubernetes.env": _environment("the scheduler and worker pods"),
    "kubernetes.worker-command": _code("is the command every worker pod runs", "dask-worker"),
    "kubernetes.scheduler-service-type": lambda v: (
        None
        if v in (None, "ClusterIP")
        else _Problem(f"would make the scheduler listen outside the Kubernetes cluster ({v})", ALLOW_NETWORK_LISTEN)
    ),
    "kubernetes.idle-timeout": _typed(_is_scalar, "a duration"),
    "kubernetes.resource-timeout": _typed(_is_scalar, "a duration"),
    "kubernetes.shutdown-on-close": _typed(lambda v: isinstance(v, bool), "true or false"),
    "kubernetes.port-forward-cluster-ip": _typed(lambda v: v is None or isinstance(v, bool), "true, false or null"),
    "kubernetes.scheduler-forward-port": _typed(lambda v: v is None or isinstance(v, int), "a port number"),
    "kubernetes.create-mode": _one_of("CREATE_OR_CONNECT", "CREATE_ONLY", "CONNECT_ONLY"),
    "kubernetes.custom-cluster-spec": _code("is a whole cluster resource, with the commands its pods run"),
    "kubernetes.scheduler-jupyter": _code("starts a Jupyter server in the scheduler pod, which runs code"),
}

# Rules that own every setting under a prefix.
_PATTERN_RULES: tuple[tuple[str, _Rule], ...] = (
    ("daskstream.planning.*", _data),
    ("daskstream.compute.*", _data),
    ("kubernetes.resources.*", _data),
)
