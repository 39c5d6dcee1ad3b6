"""The resume extension (docs/protocol.md, "Resuming (extension)") against a real web node (daphne):
a raw WebSocket client that opted in with `offsets=1` misses what the Pusher HTTP API published while
it was away, resumes from the last offset it saw and gets exactly the missed events in order, then
the live ones."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.pusher import ANZ_APP_ID, ANZ_KEY, signed_query

pytestmark = [pytest.mark.system, pytest.mark.django_db]
CHANNEL = "scores.resume"


class RawPusher:
    """A Pusher client at the frame level that opted into offsets."""

    def __init__(self, port: int) -> None:
        self.ws: ClientConnection = connect(f"ws://127.0.0.1:{port}/app/{ANZ_KEY}?protocol=7&client=raw&offsets=1")
        assert self.recv()["event"] == "pusher:connection_established"

    def recv(self, timeout: float = 10) -> dict:
        return json.loads(self.ws.recv(timeout=timeout))

    def recv_until(self, event: str, timeout: float = 10) -> list[dict]:
        """The frames up to and including the first `event`."""
        frames = [self.recv(timeout)]
        while frames[-1]["event"] != event:
            frames.append(self.recv(timeout))
        return frames

    def send(self, event: str, data: dict) -> None:
        self.ws.send(json.dumps({"event": event, "data": data}))

    def subscribe(self, channel: str) -> None:
        self.send("pusher:subscribe", {"channel": channel})
        assert self.recv()["event"] == "pusher_internal:subscription_succeeded"

    def close(self) -> None:
        self.ws.close()


def publish(web, name: str, data: str) -> None:
    """What an app's server does with the `pusher` server library's trigger."""
    path = f"/apps/{ANZ_APP_ID}/events"
    body = json.dumps({"name": name, "data": data, "channel": CHANNEL}).encode()
    response = httpx.post(f"{web.url}{path}?{signed_query('POST', path, body=body)}", content=body,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text


def test_a_client_that_resumes_gets_exactly_what_it_missed_in_order_then_the_live_events(node):
    first = RawPusher(node.port)
    first.subscribe(CHANNEL)
    publish(node, "goal", "1-0")
    seen = first.recv()
    assert (seen["event"], seen["data"]) == ("goal", "1-0")
    last_offset = seen["offset"]
    first.close()

    for score in ("2-0", "2-1", "3-1"):  # while it is away
        publish(node, "goal", score)

    again = RawPusher(node.port)
    again.subscribe(CHANNEL)
    again.send("pusher:resume", {"channel": CHANNEL, "since": last_offset})
    frames = again.recv_until("pusher:resumed")
    missed = [f for f in frames if f["event"] == "goal"]
    assert [f["data"] for f in missed] == ["2-0", "2-1", "3-1"]
    assert [f["offset"] for f in missed] == [last_offset + 1, last_offset + 2, last_offset + 3]
    assert json.loads(frames[-1]["data"]) == {"offset": last_offset + 3}
    assert all(f["channel"] == CHANNEL for f in frames)

    publish(node, "goal", "4-1")  # then the live stream, from the offset after the replay
    live = again.recv()
    assert (live["event"], live["data"], live["offset"]) == ("goal", "4-1", last_offset + 4)
    again.close()
