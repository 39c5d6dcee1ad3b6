"""Behind a proxy the client is the rightmost X-Forwarded-For hop that is not a trusted proxy, and
X-Forwarded-Proto counts only from a trusted proxy."""

from __future__ import annotations

import importlib

import pytest
from twisted.web.http_headers import Headers

from foundation.forwarded import client_from_headers, peer_trusted, trusted_networks

PROXIES = trusted_networks(["10.0.0.0/8", "192.0.2.1"])
PROXY = ["10.0.0.2", 44321]
STRANGER = ["203.0.113.9", 5000]


def client(peer, forwarded_for: str | None = None, proto: str | None = None, scheme: str = "http"):
    headers = {}
    if forwarded_for is not None:
        headers[b"x-forwarded-for"] = forwarded_for.encode()
    if proto is not None:
        headers[b"x-forwarded-proto"] = proto.encode()
    return client_from_headers(headers, peer, scheme, PROXIES)


def test_a_client_that_spoofs_the_header_through_a_trusted_proxy_is_seen_at_its_real_address():
    # the client sent "X-Forwarded-For: 127.0.0.1"; the proxy appended the address it saw
    assert client(PROXY, "127.0.0.1, 198.51.100.7")[0] == ["198.51.100.7", 0]


def test_hops_added_by_a_chain_of_trusted_proxies_are_skipped():
    assert client(PROXY, "1.1.1.1, 198.51.100.7, 192.0.2.1, 10.4.4.4")[0] == ["198.51.100.7", 0]


def test_the_header_from_a_peer_that_is_not_a_trusted_proxy_is_ignored():
    assert client(STRANGER, "198.51.100.7") == (STRANGER, "http")
    assert client(STRANGER, "198.51.100.7", proto="https") == (STRANGER, "http")


def test_an_unreadable_hop_ends_the_walk_at_the_last_trusted_hop():
    assert client(PROXY, "198.51.100.7, unknown, 10.4.4.4")[0] == ["10.4.4.4", 0]
    assert client(PROXY, "not-an-address")[0] == PROXY


def test_hops_with_ports_and_ipv6_hops_are_read():
    assert client(PROXY, "198.51.100.7:5555")[0] == ["198.51.100.7", 0]
    assert client(PROXY, "[2001:db8::7]:443, 10.1.1.1")[0] == ["2001:db8::7", 0]


def test_a_request_only_trusted_proxies_touched_is_from_the_leftmost_of_them():
    assert client(PROXY, "10.9.9.9, 10.4.4.4")[0] == ["10.9.9.9", 0]


def test_without_the_header_the_client_is_the_peer():
    assert client(PROXY) == (PROXY, "http")


def test_the_tls_header_counts_only_from_a_trusted_proxy_and_only_the_proxy_s_own_value():
    assert client(PROXY, proto="https")[1] == "https"
    assert client(PROXY, proto="https, http")[1] == "http"  # a client's value, then the proxy's
    assert client(PROXY, proto="gopher")[1] == "http"
    assert client(STRANGER, proto="https")[1] == "http"


def test_every_line_of_a_repeated_header_is_read():
    headers = Headers({b"X-Forwarded-For": [b"127.0.0.1", b"198.51.100.7"]})
    assert client_from_headers(headers, PROXY, "http", PROXIES)[0] == ["198.51.100.7", 0]


@pytest.mark.parametrize("peer, trusted, expected", [
    (["203.0.113.9", 5000], ["10.0.0.0/8"], False),
    (["10.1.2.3", 5000], ["10.0.0.0/8"], True),
    (["10.1.2.3", 5000], [], False),
    (None, ["10.0.0.0/8"], False),
])
def test_proxy_headers_are_believed_only_from_trusted_proxies(peer, trusted, expected):
    assert peer_trusted(peer, trusted_networks(trusted)) is expected


def test_production_settings_leave_the_tls_header_to_the_proxy_check(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db.example:5432/switchboard")
    monkeypatch.setenv("REDIS_URL", "redis://redis.example:6379/0")
    production = importlib.reload(importlib.import_module("config.settings.production"))
    assert getattr(production, "SECURE_PROXY_SSL_HEADER", None) is None
