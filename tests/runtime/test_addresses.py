"""Scheduler addresses: daskstream's checks and distributed's parser, which connects, read them alike."""

from __future__ import annotations

import ipaddress

import pytest
from distributed.comm.addressing import parse_address, parse_host_port
from hypothesis import given
from hypothesis import strategies as st

from daskstream.errors import InvalidArgumentError
from daskstream.runtime.addresses import check_scheduler_address

_LABEL = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}[A-Za-z0-9]", fullmatch=True)
_HOSTS = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.lists(_LABEL, min_size=1, max_size=4).map(".".join),
    st.just("localhost"),
)


@given(scheme=st.sampled_from(["tcp", "tls"]), host=_HOSTS, port=st.integers(1, 65535))
def test_every_well_formed_address_is_accepted_as_distributed_reads_it(scheme, host, port):
    address = f"{scheme}://{host}:{port}"
    assert check_scheduler_address(address) == address
    read_scheme, location = parse_address(address, strict=True)
    read_host, read_port = parse_host_port(location)
    assert (read_scheme, read_port) == (scheme, port)
    expected = host.strip("[]")
    assert read_host == expected or ipaddress.ip_address(read_host) == ipaddress.ip_address(expected)


@given(text=st.text(alphabet="tcpls:/[]0123456789.abf-@#?% \t", max_size=40))
def test_an_address_accepted_is_the_one_distributed_connects_to(text):
    try:
        checked = check_scheduler_address(text)
    except InvalidArgumentError as exc:
        refusal = str(exc)
    else:
        refusal = None
    if refusal is not None:
        assert repr(text) in refusal  # names what was given
        return
    scheme, location = parse_address(checked, strict=True)
    host, port = parse_host_port(location)
    assert checked == f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("tcp://127.0.0.1", "has no port"),
        ("udp://127.0.0.1:8786", "uses udp://"),
        ("tcp://127.0.0.1:99999", "outside 1-65535"),
        ("tcp://::1:8786", "without the brackets"),
        ("tcp://user@127.0.0.1:8786", "is not tcp://HOST:PORT"),
    ],
)
def test_a_malformed_address_is_refused_saying_what_is_wrong(address, says):
    with pytest.raises(InvalidArgumentError, match=says):
        check_scheduler_address(address)
