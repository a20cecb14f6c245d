"""The checks a rule of :mod:`~daskstream.runtime.clusters.rules` makes of one setting's value.

Each builder here returns a rule: a function of the value of one setting (a
whole section for the sections it owns) that says what is wrong with it, if
anything, as a ``_Problem`` naming the consent that would let it through
(:mod:`~daskstream.runtime.clusters.consent`), or none when nothing would.
They tell code (:func:`_code`), environments (:func:`_environment`), words of
a shell command (:func:`_shell_words`), addresses and interfaces a server
listens on (:func:`_listen`, :func:`_host`, :func:`_interface`) and keyword
arguments of a scheduler or worker (:func:`_options`) from plain data; which
setting gets which rule is the table in ``rules``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from daskstream.runtime.addresses import SCHEDULER_SCHEMES, beyond_loopback, listen_points, split_host_port, valid_host
from daskstream.runtime.clusters.consent import ALLOW_CODE, ALLOW_NETWORK_LISTEN
from daskstream.runtime.clusters.dotted_keys import _canonical


@dataclass(frozen=True)
class _Problem:
    """Why one setting is refused, and the consent that would let it through (``None``: nothing would)."""

    reason: str
    needs: str | None = ALLOW_CODE


# A rule looks at the value of one setting (a whole section for the sections it owns) and says
# what is wrong with it, if anything.
_Rule = Callable[[Any], "_Problem | None"]


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == "" or value is False


def _code(reason: str, *harmless: Any) -> _Rule:
    """Code unless empty or one of the values that run only dask's own code."""

    def rule(value: Any) -> _Problem | None:
        if _empty(value) or any(value == h for h in harmless):
            return None
        return _Problem(reason)

    return rule


def _never(reason: str) -> _Rule:
    def rule(value: Any) -> _Problem | None:
        return _Problem(reason, None)

    return rule


def _data(value: Any) -> _Problem | None:
    return None


def _mapping_of(check: Callable[[Any], bool], what: str) -> _Rule:
    def rule(value: Any) -> _Problem | None:
        if value is None or (isinstance(value, Mapping) and all(check(v) for v in value.values())):
            return None
        return _Problem(f"must be a mapping of names to {what}", None)

    return rule


def _one_of(*choices: Any) -> _Rule:
    def rule(value: Any) -> _Problem | None:
        if value is None or value in choices:
            return None
        return _Problem(f"must be one of {', '.join(map(repr, choices))}", None)

    return rule


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


# Environment variables a file may set for worker processes: thread counts and malloc tuning,
# to whole numbers. Any other (PYTHONPATH, LD_PRELOAD, PYTHONSTARTUP, BASH_ENV, PYTHONWARNINGS...)
# can make the process run code.
_HARMLESS_ENVIRONMENT = frozenset(
    _canonical(name)
    for name in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "NUMEXPR_MAX_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "BLIS_NUM_THREADS",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_ARENA_MAX",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TOP_PAD_",
    )
)


def _environment(where: str) -> _Rule:
    def rule(value: Any) -> _Problem | None:
        if value is None or value == {}:
            return None
        if not isinstance(value, Mapping):
            return _Problem("must be a mapping of environment variable names to values", None)
        for name, setting in value.items():
            whole = (_is_number(setting) and float(setting).is_integer()) or (
                isinstance(setting, str) and re.fullmatch(r"[0-9]+", setting)
            )
            if _canonical(str(name)) not in _HARMLESS_ENVIRONMENT or not whole:
                return _Problem(
                    f"sets the environment variable {name} of {where} (variables such as PYTHONPATH and "
                    "LD_PRELOAD run code; a file may set only thread counts and malloc tuning, to whole numbers)"
                )
        return None

    return rule


# A word of a shell command: letters, digits and _@%+=:,./~- , plus $NAME or ${NAME}. No spaces,
# quotes, globs, braces or command substitution, so it stays one argument and runs nothing.
_SHELL_WORD = re.compile(r"(?:[A-Za-z0-9_@%+=:,./~-]|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})*")


_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def _shell_words(where: str) -> _Rule:
    """Values that land in a shell command or batch script unquoted: plain words only."""

    def rule(value: Any) -> _Problem | None:
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, (Mapping, list)):
                return _Problem("must be a single value", None)
            if not isinstance(item, str):
                continue
            # $IFS and bash's own variables expand to spaces: they would split one word into arguments.
            names = _VARIABLE.findall(item)
            if not _SHELL_WORD.fullmatch(item) or any(n == "IFS" or n.startswith("BASH") for n in names):
                return _Problem(
                    f"is written into {where} as is, and is not a plain word (letters, digits, _@%+=:,./~- and "
                    "$VARIABLE only): spaces, quotes, ;|&<>, braces and $(...) can add commands"
                )
        return None

    return rule


def _listen(what: str) -> _Rule:
    """An address a server listens on (``HOST:PORT`` forms of distributed's dashboard addresses)."""

    def rule(value: Any) -> _Problem | None:
        if value is None:
            return None
        try:
            points = listen_points(value)
        except ValueError as exc:
            return _Problem(str(exc), None)
        for host, _ in points:
            beyond = beyond_loopback(host)
            if beyond:
                return _Problem(f"would make {what} listen {beyond}", ALLOW_NETWORK_LISTEN)
        return None

    return rule


def _host(what: str) -> _Rule:
    """A host (or ``scheme://host:port``) a server binds to or is reached at."""

    def rule(value: Any) -> _Problem | None:
        if value is None:
            return None
        if not isinstance(value, str):
            return _Problem("must be a host name or address", None)
        scheme, sep, rest = value.rpartition("://")
        if sep and scheme not in SCHEDULER_SCHEMES:
            return _Problem(f"uses {scheme}://; use tcp:// or tls://", None)
        try:
            host, port = split_host_port(rest)
        except ValueError as exc:
            return _Problem(str(exc), None)
        if (port is not None and not re.fullmatch(r"[0-9]{1,5}", port)) or (host and not valid_host(host)):
            return _Problem("is not HOST or HOST:PORT", None)
        beyond = beyond_loopback(host)
        return _Problem(f"would make {what} listen {beyond}", ALLOW_NETWORK_LISTEN) if beyond else None

    return rule


def _interface(what: str) -> _Rule:
    """A network interface name (eth0, ib0, lo) a server binds to."""

    def rule(value: Any) -> _Problem | None:
        if value is None:
            return None
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,32}", value):
            return _Problem("must be the name of a network interface, such as lo or eth0", None)

        families = (socket.AF_INET, socket.AF_INET6)
        addresses = [a.address for a in psutil.net_if_addrs().get(value, []) if a.family in families]
        if addresses and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
            return None
        return _Problem(f"would make {what} listen on the network interface {value}", ALLOW_NETWORK_LISTEN)

    return rule


def _options(role: str, allowed: Mapping[str, _Rule]) -> _Rule:
    """Keyword arguments of a distributed Scheduler or Worker, started on another machine or here."""

    def rule(value: Any) -> _Problem | None:
        if value is None or value == {}:
            return None
        if not isinstance(value, Mapping):
            return _Problem(f"must be a mapping of {role} keyword arguments", None)
        for name, option in value.items():
            check = allowed.get(name)
            if check is None:
                return _Problem(
                    f"passes {name}= to the {role}, which daskstream does not know to be data (options such as "
                    "preload, plugins or worker_class import and run code)"
                )
            problem = check(option)
            if problem is not None:
                return _Problem(f"passes {name}={option!r} to the {role}, which {problem.reason}", problem.needs)
        return None

    return rule


def _all(*rules: _Rule) -> _Rule:
    def rule(value: Any) -> _Problem | None:
        for each in rules:
            problem = each(value)
            if problem is not None:
                return problem
        return None

    return rule


def _typed(check: Callable[[Any], bool], what: str) -> _Rule:
    def rule(value: Any) -> _Problem | None:
        return None if check(value) else _Problem(f"must be {what}", None)

    return rule


def _path_or_paths(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
