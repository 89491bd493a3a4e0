"""``host:port`` as every process reads it: what is accepted, what is refused, and
that whatever is accepted joins back to the same address."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.addr import InvalidAddress, join_host_port, split_host_port

ACCEPTED = [
    ("127.0.0.1:50051", ("127.0.0.1", 50051)),
    ("worker-01.rack_2.example.internal:8080", ("worker-01.rack_2.example.internal", 8080)),
    ("[::1]:80", ("::1", 80)),
    ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
    ("localhost:0", ("localhost", 0)),
]

REFUSED = [
    ("localhost", "is not host:port"),
    (":80", "has no host"),
    ("[]:80", "has no host"),
    ("::1:80", "write an IPv6 host in brackets"),
    ("[:2379", "has no valid host"),
    ("[::1:80", "write an IPv6 host in brackets"),
    ("a]:80", "has no valid host"),
    ("http://host:80", "without a scheme"),
    ("a/b:80", "has no valid host"),
    ("user@host:80", "has no valid host"),
    ("a,b:80", "has no valid host"),
    ("my host:80", "has no valid host"),
    ("host\n:80", "has no valid host"),
    ("host:65536", "has no valid port"),
    ("host:-1", "has no valid port"),
    ("host:\uff18\uff10", "has no valid port"),  # fullwidth digits are not a port
    ("host:", "has no valid port"),
]


@pytest.mark.parametrize(("addr", "split"), ACCEPTED)
def test_accepted(addr: str, split: tuple[str, int]) -> None:
    assert split_host_port(addr) == split
    assert join_host_port(*split) == addr


@pytest.mark.parametrize(("addr", "words"), REFUSED)
def test_refused_with_the_reason(addr: str, words: str) -> None:
    with pytest.raises(InvalidAddress, match=words.replace("[", r"\[")):
        split_host_port(addr)


def test_an_empty_host_only_where_allowed() -> None:
    assert split_host_port(":9100", allow_empty_host=True) == ("", 9100)


@given(st.text(max_size=40))
def test_any_text_is_an_address_or_invalid_and_an_address_round_trips(addr: str) -> None:
    try:
        host, port = split_host_port(addr)
    except InvalidAddress:
        return
    assert 0 <= port <= 65535
    assert host
    assert host.isprintable()
    assert split_host_port(join_host_port(host, port)) == (host, port)
