"""A failure that repeats is logged once per kind and window, with a count."""

from __future__ import annotations

import asyncio
import json
import logging

from channels.testing import WebsocketCommunicator

from foundation.logs import RepeatFilter, loggable
from messaging.gateway.consumers import ClientConsumer


def _record(msg: str, *args, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("postgres is down")
        except RuntimeError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("messaging.intake.batching", logging.ERROR, __file__, 1, msg, args, exc_info)


def test_repeats_of_one_kind_are_held_back_and_counted(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("foundation.logs.time.monotonic", lambda: clock[0])
    repeats = RepeatFilter(window=10)
    passed = [repeats.filter(_record("flushing %d items failed", n, exc=True)) for n in range(5000)]
    assert passed.count(True) == 1
    assert repeats.filter(_record("another kind of failure")) is True
    clock[0] += 11
    summary = _record("flushing %d items failed", 1)
    assert repeats.filter(summary) is True
    assert summary.getMessage() == "flushing 1 items failed (4999 similar suppressed in the last 10s)"


def test_the_filter_stays_bounded_under_a_flood_of_distinct_messages():
    repeats = RepeatFilter(window=10, max_kinds=100)
    for n in range(1000):
        repeats.filter(_record(f"distinct {n}"))
    assert len(repeats._seen) <= 100


def test_client_input_is_logged_on_one_line_with_its_control_characters_escaped():
    assert loggable("ANZ-1\nERROR forged line\r\x1b[31m") == "ANZ-1\\nERROR forged line\\r\\x1b[31m"
    assert loggable("é²-\u202eevil") == "é²-\\u202eevil"  # readable text stays; a direction override does not
    assert loggable("x" * 5000).endswith("…(cut)") and len(loggable("x" * 5000)) < 250


def test_a_refused_user_id_with_a_newline_is_logged_as_one_line(caplog):
    async def refused() -> dict:
        communicator = WebsocketCommunicator(ClientConsumer.as_asgi(), "/ws")
        communicator.scope["client"] = ("127.0.0.1", 40000)
        assert (await communicator.connect(timeout=20))[0]
        await communicator.send_to(text_data=json.dumps({"type": "AUTH_CLIENT", "data": {
            "appId": "app-id-343", "userId": "ANZ-1\nERROR forged: admin logged in", "token": ""}}))
        reply = json.loads(await communicator.receive_from(timeout=20))
        await communicator.disconnect()
        return reply

    with caplog.at_level(logging.INFO, logger="messaging.gateway.connection.handlers"):
        reply = asyncio.run(refused())
    assert reply["data"]["isAuthenticated"] is False
    lines = [r.getMessage() for r in caplog.records if r.name == "messaging.gateway.connection.handlers"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("refused ANZ-1\\nERROR forged: admin logged in: ")
