"""Addresses of dask schedulers, dashboards and workers, parsed and checked.

Functions over text (except :func:`beyond_loopback`, which resolves host
names): what a scheduler address daskstream may join looks like, the
``HOST:PORT`` forms a server may be told to listen on, and whether an
address reaches beyond this machine.

A scheduler address is checked here for messages that say what is wrong,
then read by distributed's own parser, which is what connects: the two must
agree. Listen addresses are parsed here and handed to distributed as
(host, port) pairs, so what was checked is what it binds; its own string
form cannot write an IPv6 host (``[::1]:8787``).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Any

from daskstream.errors import InvalidArgumentError

__all__ = [
    "SCHEDULER_SCHEMES",
    "beyond_loopback",
    "check_scheduler_address",
    "listen_points",
    "split_host_port",
    "valid_host",
]

# The schemes daskstream joins a running scheduler over.
SCHEDULER_SCHEMES = ("tcp", "tls")


def check_scheduler_address(address: Any, *, what: str = "scheduler address") -> str:
    """``address`` if it is one daskstream can join: ``tcp://`` or ``tls://``, a host, and a port.

    Parameters
    ----------
    address
        ``tcp://HOST:PORT`` or ``tls://HOST:PORT``; an IPv6 host in brackets
        (``tcp://[::1]:8786``).
    what
        How messages name it (``"cluster configuration x.yaml: scheduler-address"``).

    Raises
    ------
    InvalidArgumentError
        Another scheme, no host, no port or one outside 1-65535, or anything
        else after the port.

    Examples
    --------
    >>> check_scheduler_address("tcp://[::1]:8786")
    'tcp://[::1]:8786'
    >>> check_scheduler_address("tcp://127.0.0.1:99999")
    Traceback (most recent call last):
    ...
    daskstream.errors.InvalidArgumentError: scheduler address 'tcp://127.0.0.1:99999' has port 99999, outside 1-65535; give the port the scheduler listens on, as in tcp://127.0.0.1:8786
    """
    example = "as in tcp://127.0.0.1:8786"
    if isinstance(address, str) and ("[" in address or address.count(":") > 2):
        example = "as in tcp://[::1]:8786"
    if not isinstance(address, str):
        raise InvalidArgumentError(f"{what} {address!r} is not text; write it {example}")
    scheme, sep, rest = address.partition("://")
    if not sep:
        raise InvalidArgumentError(f"{what} {address!r} has no scheme; write tcp://HOST:PORT, {example}")
    if scheme not in SCHEDULER_SCHEMES:
        raise InvalidArgumentError(
            f"{what} {address!r} uses {scheme}://, which daskstream does not connect over; use tcp://HOST:PORT, "
            "or tls://HOST:PORT with the certificates of a cluster file (see cluster-configs/tls.yaml)"
        )
    if not rest or re.search(r"[/?#@\s]", rest):
        raise InvalidArgumentError(f"{what} {address!r} is not {scheme}://HOST:PORT; write it {example}")
    try:
        host, port_text = split_host_port(rest)
    except ValueError as exc:
        raise InvalidArgumentError(f"{what} {address!r} {exc}; write it {example}") from None
    if port_text is None:
        raise InvalidArgumentError(
            f"{what} {address!r} has no port; write {scheme}://{rest}:PORT (a dask scheduler listens on 8786 "
            "unless told otherwise)"
        )
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
        shown = f"port {int(port_text)}" if re.fullmatch(r"[0-9]+", port_text) else f"port {port_text!r}"
        raise InvalidArgumentError(
            f"{what} {address!r} has {shown}, outside 1-65535; give the port the scheduler listens on, {example}"
        )
    if not valid_host(host):
        raise InvalidArgumentError(
            f"{what} {address!r} has no valid host ({host!r}); give a host name or an IP address, {example}"
        )
    # distributed connects to the address as its own parser reads it: that is what was checked above, or it
    # is refused (the checks above are here for their messages, not as a second reading).
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        read_scheme, location = parse_address(address, strict=True)
        read_host, read_port = parse_host_port(location)
    except (ValueError, TypeError):
        read_scheme, read_host, read_port = None, None, None
    if (read_scheme, read_host, read_port) != (scheme, host, int(port_text)):
        raise InvalidArgumentError(
            f"{what} {address!r} is read by dask as {read_scheme}://{read_host}:{read_port}, not as host {host!r} "
            f"and port {int(port_text)}; write it {example}"
        )
    return address


_LISTEN_FORMS = "write HOST:PORT, such as 127.0.0.1:8787 or [::1]:8787 (port 0: a free one)"


def listen_points(value: Any) -> list[tuple[str, int]]:
    """The (host, port) pairs an address to listen on names, as distributed reads it.

    ``8787``, ``":8787"``, ``"host:8787"``, ``"[::1]:8787"``, ``"host"`` (a
    free port), comma-separated lists of those, or a list. An empty host
    means every interface. Raises ValueError for anything else.
    """
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
    points = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"is not an address; {_LISTEN_FORMS}")
        if isinstance(item, int):
            host, port_text = "", str(item)
        elif isinstance(item, str):
            text = item.strip()
            if re.fullmatch(r"[0-9]+", text):
                host, port_text = "", text
            else:
                try:
                    host, port = split_host_port(text)
                except ValueError as exc:
                    raise ValueError(f"{exc}; {_LISTEN_FORMS}") from None
                port_text = "0" if port is None else port
        else:
            raise ValueError(f"is not an address; {_LISTEN_FORMS}")
        if not re.fullmatch(r"[0-9]+", port_text):
            raise ValueError(f"has port {port_text!r}, which is not a number; {_LISTEN_FORMS}")
        if int(port_text) > 65535:
            raise ValueError(f"has port {int(port_text)}, outside 0-65535 (0: a free port); {_LISTEN_FORMS}")
        if host and not valid_host(host):
            raise ValueError(f"has no valid host ({host!r}); {_LISTEN_FORMS}")
        points.append((host, int(port_text)))
    if not points:
        raise ValueError(f"names no address; {_LISTEN_FORMS}")
    return points


def split_host_port(text: str) -> tuple[str, str | None]:
    """``host``/``host:port``/``[v6]``/``[v6]:port`` as (host, port text or None); ValueError otherwise."""
    if text.startswith("["):
        host, closed, tail = text[1:].partition("]")
        if not closed:
            raise ValueError("has an unclosed '['")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"has {host!r} in brackets, which is not an IPv6 address") from None
        if not tail:
            return host, None
        if not tail.startswith(":"):
            raise ValueError("has something other than :PORT after the IPv6 address")
        return host, tail[1:]
    host, colon, port = text.rpartition(":")
    if not colon:
        return text, None
    if ":" in host:
        raise ValueError("has an IPv6 host without the brackets of [ADDRESS]:PORT")
    return host, port


_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)


def valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(host):
        return False
    # All-numeric names are IPv4 addresses written wrong (999.1.1.1), not host names.
    return not all(label.isdigit() for label in host.rstrip(".").split("."))


def beyond_loopback(host: str) -> str | None:
    """Where listening on ``host`` reaches beyond this machine, in words; ``None`` for loopback only."""
    if host in ("", "*"):
        return "on every network interface"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        return None if address.is_loopback else f"on {host}, which is not a loopback address"
    try:
        # The stubs allow an (int, bytes) address, which only an IPv6 family on a Python built
        # without IPv6 gives; over TCP the address is (host text, port, ...), so str() keeps it as is.
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return f"on {host}, which does not resolve here (so it cannot be shown to be loopback)"
    outside = sorted(a for a in found if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    return f"on {host}, which resolves to {', '.join(outside)}" if outside else None
