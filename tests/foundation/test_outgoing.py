"""Calls to tenants' addresses (foundation.outgoing): one deadline for the whole exchange, a capped
answer, and no call to an address outside the public internet unless an operator allows its network."""

from __future__ import annotations

import time

import pytest

from foundation.outgoing import (
    OutgoingError,
    OutgoingRefused,
    address_refusal,
    networks_parse,
    outgoing_client,
    outgoing_post,
    run_outgoing,
)
from tests.webhook_receiver import WebhookReceiver

LOOPBACK = networks_parse(("127.0.0.0/8", "::1/128"))


def _post(url: str, deadline: float = 2.0, max_bytes: int = 1024):
    async def call():
        client = outgoing_client("test", max_connections=10, max_keepalive=2)
        return await outgoing_post(client, url, content=b"{}", headers={"Content-Type": "application/json"},
                                   deadline=deadline, max_bytes=max_bytes)

    return run_outgoing(call(), deadline)


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("169.254.10.1", "link-local"), ("fe80::1", "link-local"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"), ("0.0.0.0", "unspecified"),
    ("::", "unspecified"), ("10.1.2.3", "private"), ("192.168.1.1", "private"), ("172.16.0.9", "private"),
    ("::ffff:127.0.0.1", "loopback"), ("100.64.0.1", "non-public"), ("224.0.0.1", "multicast"),
])
def test_addresses_outside_the_public_internet_are_refused_by_default(address, kind):
    reason = address_refusal(address)
    assert reason is not None and kind in reason


def test_public_addresses_are_called():
    assert address_refusal("93.184.216.34") is None
    assert address_refusal("2606:4700:4700::1111") is None


def test_an_operator_allows_a_network_explicitly_but_a_broad_one_never_opens_the_metadata_service():
    assert address_refusal("127.0.0.1", LOOPBACK) is None
    assert address_refusal("10.1.2.3", LOOPBACK) is not None
    broad = networks_parse(("169.254.0.0/16",))
    assert address_refusal("169.254.10.1", broad) is None
    assert "metadata" in address_refusal("169.254.169.254", broad)
    assert address_refusal("169.254.169.254", networks_parse(("169.254.169.254/32",))) is None


def test_a_host_name_that_resolves_to_loopback_is_refused_and_never_called(settings):
    settings.OUTGOING_ALLOWED_NETWORKS = []
    with WebhookReceiver() as receiver:
        port = receiver.server.server_address[1]
        for url in (f"http://localhost:{port}/hooks", receiver.url):
            with pytest.raises(OutgoingRefused, match="loopback"):
                _post(url)
        assert receiver.calls == []


def test_an_allowed_network_is_called(settings):
    settings.OUTGOING_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    with WebhookReceiver() as receiver:
        answer = _post(receiver.url)
    assert (answer.status, answer.body, answer.complete) == (200, b'{"received": true}', True)
    assert len(receiver.calls) == 1


def test_a_receiver_that_drips_its_headers_is_cut_off_at_the_deadline_of_the_whole_call(settings):
    settings.OUTGOING_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    with WebhookReceiver(drip=0.1) as dripping:  # every read arrives well within any per-read timeout
        started = time.monotonic()
        with pytest.raises(OutgoingError, match="no answer within 1 s"):
            _post(dripping.url, deadline=1.0)
        took = time.monotonic() - started
        assert len(dripping.calls) == 1
    assert 0.9 <= took < 4.0


def test_only_the_first_bytes_of_a_long_answer_are_read(settings):
    settings.OUTGOING_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    with WebhookReceiver(answer=b"x" * 200_000) as talkative:
        answer = _post(talkative.url, max_bytes=1000)
    assert (answer.status, len(answer.body), answer.complete) == (200, 1000, False)
