"""What a /ws connection checks on a raw frame, before parsing it: its size (a few KiB before
AUTH_CLIENT) and its rate. The consumer is driven directly: these checks need no socket."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from messaging.core.protocol import parse_frame
from messaging.gateway import consumers
from messaging.gateway.consumers import ClientConsumer
from messaging.gateway.limits import ConnectionLimits


@pytest.fixture
def parsed(monkeypatch) -> list[str]:
    """Every frame the consumer parsed."""
    seen: list[str] = []

    def counting_parse(text):
        seen.append(text)
        return parse_frame(text)

    monkeypatch.setattr(consumers, "parse_frame", counting_parse)
    return seen


def connection(*, authenticated: bool) -> tuple[ClientConsumer, list[str], list[int]]:
    consumer = ClientConsumer()
    limits = ConnectionLimits.for_app(50, 60) if authenticated else ConnectionLimits.preauth()
    consumer.life = SimpleNamespace(authenticated=authenticated, limits=limits)
    written: list[str] = []
    closed: list[int] = []

    async def write(text: str) -> bool:
        written.append(text)
        return True

    async def close_with(code: int, reason: str = "") -> None:
        closed.append(code)

    consumer.write, consumer.close_with = write, close_with
    return consumer, written, closed


def receive(consumer: ClientConsumer, *frames: str) -> None:
    async def run() -> None:
        for frame in frames:
            await consumer.receive(text_data=frame)

    asyncio.run(run())


def test_before_authentication_a_frame_over_a_few_kib_closes_with_1009_unparsed(settings, parsed):
    consumer, _, closed = connection(authenticated=False)
    receive(consumer, json.dumps({"type": "PING", "data": {"pad": "x" * settings.WS_PREAUTH_MAX_FRAME_BYTES}}))
    assert closed == [1009] and parsed == []


def test_the_preauth_size_counts_utf8_bytes_not_characters(settings, parsed):
    euros = "€" * (settings.WS_PREAUTH_MAX_FRAME_BYTES // 3)  # under the limit in characters, over it in bytes
    consumer, _, closed = connection(authenticated=False)
    receive(consumer, json.dumps({"type": "PING", "data": {"pad": euros}}, ensure_ascii=False))
    assert closed == [1009] and parsed == []


def test_after_authentication_the_same_frame_is_taken(settings, parsed):
    consumer, _, closed = connection(authenticated=True)
    receive(consumer, json.dumps({"type": "TELEPORT", "data": {"pad": "x" * settings.WS_PREAUTH_MAX_FRAME_BYTES}}))
    assert closed == [] and len(parsed) == 1


def test_frames_beyond_the_budget_before_authentication_are_never_parsed(parsed):
    consumer, written, closed = connection(authenticated=False)
    receive(consumer, *["{not json"] * 60)
    assert 20 <= len(parsed) <= 22  # the burst before authentication (and what refilled meanwhile)
    assert closed[:1] == [1008]  # the rest were refused on arrival, and persistent excess closes the connection


def test_an_authenticated_client_pays_for_garbage_before_it_is_parsed_too(parsed):
    consumer, written, _ = connection(authenticated=True)
    receive(consumer, *["{not json"] * 290)
    assert 240 <= len(parsed) < 260  # the frame budget (4 x the app's burst of 60), whatever the frames hold
    assert sum("rate limit exceeded" in text for text in written) == 290 - len(parsed)
