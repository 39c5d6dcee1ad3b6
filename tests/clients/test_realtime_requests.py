"""Requests from the Python realtime client (Realtime.request, clients/python) against a real web
node, a worker and beat: the app's server answers through the REST API (docs/protocol.md,
"Requests"). A request whose acceptance was lost is sent again and stored once, and its outcome,
answered while the client's link was dead, comes with the fetch after it reconnects and is returned
once; a request nobody answers raises RequestRejected with reason "timeout"; a refusal raises at once
with its code; the same client_message_id from a restarted client (resuming its session) gets the first
outcome again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from switchboard_client import Closed, Outcome, RequestRejected, SwitchboardClient

from apps_registry.models import RequestEndpoint
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import api_key_create
from foundation.transport.queue_names import queue_client
from tests.clients.test_realtime import Frames, run, until, user
from tests.processes import start_beat
from tests.wsclient import wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]
ENV = {"REQUEST_TIMEOUT_SWEEP_SECONDS": "0.5"}


@pytest.fixture(scope="module")
def web(module_processes, demo_network, django_db_blocker, tmp_path_factory):
    """ANZ with the endpoint `orders.place`, read from its request stream (by nobody here: the server
    answers through the API), an API key, a web node, a worker and beat (for timeouts)."""
    with django_db_blocker.unblock():
        RequestEndpoint.objects.create(app=demo_network["anz"], name="orders.place", stream=True, timeout_ms=60_000)
        key = api_key_create(app=demo_network["anz"], name="request answers")[1]
        app_snapshots_clear()
    node = module_processes.web("web", **ENV)
    module_processes.worker("worker", **ENV)
    start_beat(module_processes, tmp_path_factory.mktemp("beat"), **ENV)
    yield SimpleNamespace(url=node.url, ws_url=node.ws_url, key=key)
    client = queue_client()
    for stream in client.scan_iter(match="sbq:ANZ:*"):
        client.delete(stream)


def answer(web, request_id: str, outcome: str, content: str) -> httpx.Response:
    """The app's server answers a request (POST /api/v1/requests/{id}/resolve or /reject)."""
    return httpx.post(f"{web.url}/api/v1/requests/{request_id}/{outcome}", json={"content": content},
                      headers={"Authorization": f"Bearer {web.key}"}, timeout=10)


def delivered(web, message_id: str) -> bool:
    """What the app's server sees: the outcome message acknowledged by its recipient."""
    with SwitchboardClient(web.url, web.key, retries=0) as api:
        return all(d["state"] == "delivered" for d in api.message(message_id)["deliveries"])


def connections(web, user_id: str) -> int:
    presence = httpx.get(f"{web.url}/api/v1/users/{user_id}/presence", headers={"Authorization": f"Bearer {web.key}"},
                         timeout=10)
    return presence.json()["connections"]


def test_a_request_answered_while_the_clients_link_was_dead_returns_its_outcome_once_after_the_reconnect(web):
    frames = Frames()
    unclaimed: list[Outcome] = []

    async def scenario():
        back = asyncio.Event()
        logins = 0

        async def token() -> str:
            nonlocal logins
            logins += 1
            if logins > 2:
                await back.wait()  # the third connection waits: the user is away meanwhile
            return "token-1"

        async with user(web, "ANZ-53001", acks=True, token=token, debug=frames) as alice:
            alice.on("outcome", unclaimed.append)

            def lose_the_first_acceptance(direction: str, frame: dict) -> None:
                if direction == "in" and frame["type"] == "REQUEST_ACCEPTED":
                    frames.hooks.remove(lose_the_first_acceptance)
                    alice.reconnect()  # the acceptance is read from a socket that is gone

            frames.hooks.append(lose_the_first_acceptance)
            asking = asyncio.create_task(alice.request("orders.place", '{"sku": 7}', timeout_ms=120_000))
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 2)
            alice._ws.transport.abort()  # the link dies: no close frame (the server is not touched)
            await until(lambda: connections(web, "ANZ-53001") == 0)
            request_id = frames.of("in", "REQUEST_ACCEPTED")[-1]["data"]["id"]
            answered = await asyncio.to_thread(answer, web, request_id, "resolve", "order 7 placed")
            back.set()
            outcome = await asking
            await asyncio.sleep(0.5)  # time for a second copy, were there one
            return request_id, answered, outcome

    request_id, answered, outcome = run(scenario())
    assert answered.status_code == 200 and answered.json()["replay"] is False
    sent = frames.of("out", "REQUEST")
    assert len(sent) == 2 and sent[0] == sent[1]  # the same REQUEST, clientMessageId and all
    accepted = [f["data"] for f in frames.of("in", "REQUEST_ACCEPTED")]
    assert accepted == [{"id": request_id, "clientMessageId": sent[0]["data"]["clientMessageId"]},
                        {"id": request_id, "clientMessageId": sent[0]["data"]["clientMessageId"], "duplicate": True}]
    assert (outcome.content, outcome.request_id, outcome.kind, outcome.duplicate) == (
        "order 7 placed", request_id, "resolve", True)
    assert [f["data"]["id"] for f in frames.of("in", "RESOLVE")] == [outcome.id] and unclaimed == []
    assert [f["data"]["ids"] for f in frames.of("out", "ACK")] == [[outcome.id]]
    fetches = [i for i, (d, f) in enumerate(frames.seen) if f["type"] == "FETCH_MISSING_MESSAGES_REQUEST"]
    resolve_at = next(i for i, (d, f) in enumerate(frames.seen) if f["type"] == "RESOLVE")
    assert len(fetches) == 3 and resolve_at > fetches[-1]  # (fetched by the third connection)
    wait_for(lambda: delivered(web, outcome.id))


def test_a_request_nobody_answers_in_time_raises_request_rejected_with_reason_timeout(web):
    async def scenario():
        async with user(web, "ANZ-53011", acks=True) as alice:
            with pytest.raises(RequestRejected) as rejected:
                await alice.request("orders.place", "slow", timeout_ms=700)
            return rejected.value

    rejected = run(scenario())
    assert (rejected.frame_type, rejected.reason, rejected.content, rejected.code) == ("REJECT", "timeout", "", None)
    assert rejected.request_id.isdigit() and rejected.id.isdigit()
    late = answer(web, rejected.request_id, "resolve", "too late")
    assert late.status_code == 409 and late.json()["error"] == "request_closed"


def test_a_request_the_server_rejects_raises_with_its_content_and_no_reason(web):
    frames = Frames()

    async def scenario():
        async with user(web, "ANZ-53021", acks=True, debug=frames) as alice:
            asking = asyncio.create_task(alice.request("orders.place", "9 please"))
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 1)
            await asyncio.to_thread(answer, web, frames.of("in", "REQUEST_ACCEPTED")[0]["data"]["id"], "reject",
                                    "out of stock")
            with pytest.raises(RequestRejected) as rejected:
                await asking
            return rejected.value

    rejected = run(scenario())
    assert (rejected.frame_type, rejected.reason, rejected.content) == ("REJECT", None, "out of stock")
    assert str(rejected) == f"request {rejected.request_id} rejected: out of stock"


def test_a_request_to_an_endpoint_the_app_does_not_have_is_refused_at_once_with_its_code(web):
    async def scenario():
        async with user(web, "ANZ-53031", acks=True) as alice:
            with pytest.raises(RequestRejected) as refused:
                await alice.request("orders.nope", "x")
            return refused.value

    refused = run(scenario())
    assert (refused.frame_type, refused.code, refused.request_id) == ("INVALID_MESSAGE", "unknown_endpoint", None)


def test_the_same_client_message_id_from_a_restarted_client_gets_the_first_outcome_again_as_a_duplicate(web):
    frames = Frames()

    async def scenario():
        async with user(web, "ANZ-53041", acks=True, debug=frames) as before:
            asking = asyncio.create_task(before.request("orders.place", "once", client_message_id="rt-53041"))
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 1)
        with pytest.raises(Closed):  # closed before the answer: the request waits on the server
            await asking
        # The restarted client resumes the session that made the request (its outcome is pushed there).
        async with user(web, "ANZ-53041", acks=True, debug=frames, session_id=before.session_id) as after:
            again = asyncio.create_task(after.request("orders.place", "once", client_message_id="rt-53041"))
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 2)
            await asyncio.to_thread(answer, web, frames.of("in", "REQUEST_ACCEPTED")[1]["data"]["id"], "resolve",
                                    "done once")
            first = await again
        async with user(web, "ANZ-53041", acks=True) as later:
            return first, await later.request("orders.place", "once", client_message_id="rt-53041")

    first, repeated = run(scenario())
    assert (first.content, first.duplicate) == ("done once", True)
    assert (repeated.content, repeated.request_id, repeated.id, repeated.duplicate) == (
        "done once", first.request_id, first.id, True)


def test_the_outcome_of_a_request_made_before_a_restart_is_an_outcome_event_acknowledged_once_handled(web):
    frames = Frames()

    async def scenario():
        async with user(web, "ANZ-53051", acks=True, debug=frames) as before:
            asking = asyncio.create_task(before.request("orders.place", "then restart"))
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 1)
        with pytest.raises(Closed):
            await asking
        request_id = frames.of("in", "REQUEST_ACCEPTED")[0]["data"]["id"]
        await asyncio.to_thread(answer, web, request_id, "reject", "no longer wanted")
        got: list[Outcome] = []
        async with user(web, "ANZ-53051", acks=True) as after:
            after.on("outcome", got.append)
            await until(lambda: len(got) == 1)
            await until(lambda: delivered(web, got[0].id))
        return request_id, got

    request_id, got = run(scenario())
    assert [(o.kind, o.content, o.request_id, o.reason) for o in got] == [
        ("reject", "no longer wanted", request_id, None)]
