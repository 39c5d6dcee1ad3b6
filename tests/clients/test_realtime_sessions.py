"""Sessions and server requests in the Python realtime client (Realtime, clients/python) against a
real web node, a worker, a webhook worker and beat (docs/protocol.md "The server asking a client",
"Sessions"). The app's server asks a user through the REST API and `on_request` answers: the server
sees the handler's value (GET /api/v1/requests/{id}, the webhook request.answered), an exception
rejects, an answer lost with its link is sent again and the handler runs once, and an answer after
the request timed out is reported. A client whose link is cut while its request waits resumes its
session on the reconnect and gets the outcome pushed; a session id of another user is forgotten and
the client logs in afresh; close_session() returns how many outcomes were discarded."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from switchboard_client import Closed, Outcome, RealtimeError, ServerRequest, SwitchboardClient

from apps_registry.models import RequestEndpoint
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import api_key_create
from foundation.transport.queue_names import queue_client
from messaging.requests.models import Request
from messaging.webhooks.services import webhook_endpoint_create
from tests.clients.test_realtime import Frames, run, until, user
from tests.clients.test_realtime_requests import answer, connections
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.webhook_receiver import WebhookReceiver
from tests.wsclient import wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]
ENV = {
    **FAST_FAILURE_ENV,
    "WEBHOOKS_ALLOW_HTTP": "true",  # the receiver is a plain-HTTP server on 127.0.0.1
    "WEBHOOK_SWEEP_SECONDS": "1",
    "REQUEST_TIMEOUT_SWEEP_SECONDS": "0.5",
}


@pytest.fixture(scope="module")
def web(module_processes, demo_network, django_db_blocker, tmp_path_factory):
    """ANZ with the endpoint `orders.later` (read by nobody: the server answers through the API), a
    webhook endpoint told `request.answered`, an API key; a web node, a worker, a webhook worker, beat."""
    with WebhookReceiver() as told:
        with django_db_blocker.unblock():
            anz = demo_network["anz"]
            RequestEndpoint.objects.create(app=anz, name="orders.later", stream=True, timeout_ms=60_000)
            webhook_endpoint_create(app_id=anz.pk, url=told.url, events=["request.answered"])
            key = api_key_create(app=anz, name="sessions and answers")[1]
            app_snapshots_clear()
        node = module_processes.web("web", **ENV)
        module_processes.worker("worker", **ENV)
        module_processes.webhook_worker("hooks", **ENV)
        start_beat(module_processes, tmp_path_factory.mktemp("beat"), **ENV)
        yield SimpleNamespace(url=node.url, ws_url=node.ws_url, key=key, told=told)
    client = queue_client()
    for stream in client.scan_iter(match="sbq:ANZ:*"):
        client.delete(stream)


def ask(web, user_id: str, content: str, **extra: Any) -> str:
    """The app's server asks a user (POST /api/v1/users/{user}/requests): the request's id."""
    asked = httpx.post(f"{web.url}/api/v1/users/{user_id}/requests", json={"content": content, **extra},
                       headers={"Authorization": f"Bearer {web.key}"}, timeout=10)
    assert asked.status_code == 201, asked.text
    return asked.json()["id"]


def request_state(web, request_id: str) -> dict:
    """What the app's server sees of a request (GET /api/v1/requests/{id})."""
    return httpx.get(f"{web.url}/api/v1/requests/{request_id}", headers={"Authorization": f"Bearer {web.key}"},
                     timeout=10).json()


def delivered(web, message_id: str) -> bool:
    """The SERVER_REQUEST (or outcome) message acknowledged by its recipient."""
    with SwitchboardClient(web.url, web.key, retries=0) as api:
        return all(d["state"] == "delivered" for d in api.message(message_id)["deliveries"])


# --- the server asking the client -----------------------------------------------------------------


def test_a_request_the_server_makes_through_the_api_is_answered_by_on_request_and_the_server_sees_the_value(web):
    seen: list[ServerRequest] = []
    answered: list[dict] = []

    async def scenario():
        async with user(web, "ANZ-54001", acks=True) as alice:
            async def confirm(content: str, request: ServerRequest) -> dict:
                seen.append(request)
                return {"confirmed": content}

            alice.on_request(confirm)
            alice.on("answered", answered.append)
            request_id = await asyncio.to_thread(ask, web, "ANZ-54001", "confirm order 9?", correlation="order-9")
            await until(lambda: len(answered) == 1)
            await until(lambda: delivered(web, seen[0].id))
            return request_id

    request_id = run(scenario())
    assert [(r.request_id, r.content) for r in seen] == [(request_id, "confirm order 9?")]
    assert answered == [{"request_id": request_id, "kind": "resolve", "content": '{"confirmed":"confirm order 9?"}',
                         "replay": False}]
    state = request_state(web, request_id)
    assert (state["direction"], state["state"], state["outcome_content"]) == (
        "to_client", "resolved", '{"confirmed":"confirm order 9?"}')
    [call] = web.told.wait_for(lambda c: c.event == "request.answered" and c.json["data"]["requestId"] == request_id)
    assert {k: call.json["data"][k] for k in ("correlation", "user", "outcome", "content")} == {
        "correlation": "order-9", "user": "ANZ-54001", "outcome": "resolve", "content": '{"confirmed":"confirm order 9?"}'}


def test_an_exception_of_the_handler_rejects_the_request_with_its_message(web):
    async def scenario():
        async with user(web, "ANZ-54011", acks=True) as alice:
            async def refuse(content: str, request: ServerRequest) -> str:
                raise ValueError("order 9 shipped already")

            alice.on_request(refuse)
            request_id = await asyncio.to_thread(ask, web, "ANZ-54011", "cancel order 9?")
            await until(lambda: request_state(web, request_id)["state"] != "waiting")
            return request_id

    state = request_state(web, run(scenario()))
    assert (state["state"], state["outcome"], state["outcome_content"]) == ("rejected", "reject",
                                                                             "order 9 shipped already")


def test_an_answer_lost_with_its_link_is_sent_again_after_the_reconnect_and_the_handler_runs_once(web):
    frames = Frames()
    calls: list[str] = []

    async def scenario():
        async with user(web, "ANZ-54021", acks=True, debug=frames) as alice:
            def lose_the_first_answer(direction: str, frame: dict) -> None:
                if direction == "out" and frame["type"] == "RESOLVE":
                    frames.hooks.remove(lose_the_first_answer)
                    alice._ws.transport.abort()  # the link dies before the answer leaves: no close frame

            frames.hooks.append(lose_the_first_answer)
            alice.on_request(lambda content, request: calls.append(content) or "yes, once")
            request_id = await asyncio.to_thread(ask, web, "ANZ-54021", "once only?")
            await until(lambda: len(frames.of("in", "ANSWER_ACCEPTED")) == 1)
            server_request_id = frames.of("in", "SERVER_REQUEST")[0]["data"]["id"]
            await until(lambda: delivered(web, server_request_id))
            await asyncio.sleep(0.5)  # time for a second answer, were there one
            return request_id

    request_id = run(scenario())
    assert calls == ["once only?"]
    assert len(frames.of("out", "AUTH_CLIENT")) == 2
    assert [f["data"]["requestId"] for f in frames.of("in", "SERVER_REQUEST")] == [request_id] * 2  # (pushed again)
    assert frames.of("out", "RESOLVE") == [{"type": "RESOLVE", "data": {"requestId": request_id, "content": "yes, once"}}] * 2
    assert [f["data"] for f in frames.of("in", "ANSWER_ACCEPTED")] == [{"requestId": request_id}]
    assert (request_state(web, request_id)["state"], request_state(web, request_id)["outcome_content"]) == (
        "resolved", "yes, once")


def test_an_answer_after_the_request_timed_out_is_reported_as_request_closed_and_not_sent_again(web):
    errors: list[RealtimeError] = []
    seen: list[ServerRequest] = []
    frames = Frames()

    async def scenario():
        async with user(web, "ANZ-54031", acks=True, debug=frames) as alice:
            alice.on("error", errors.append)

            async def slow(content: str, request: ServerRequest) -> str:
                seen.append(request)
                await until(lambda: request_state(web, request.request_id)["state"] == "timed_out")
                return "too late"

            alice.on_request(slow)
            request_id = await asyncio.to_thread(ask, web, "ANZ-54031", "quick?", timeoutSeconds=1)
            await until(lambda: len(errors) == 1)
            alice.reconnect()
            await until(lambda: len(frames.of("in", "FETCH_MISSING_MESSAGES_COMPLETE")) == 2)
            await asyncio.sleep(0.5)
            return request_id

    request_id = run(scenario())
    [error] = errors
    assert (error.code, error.data["requestId"]) == ("request_closed", request_id)
    assert str(error).startswith(f"the answer to server request {request_id} was refused (request_closed)")
    assert [r.request_id for r in seen] == [request_id]
    assert len(frames.of("out", "RESOLVE")) == 1
    assert request_state(web, request_id)["state"] == "timed_out"


# --- sessions -------------------------------------------------------------------------------------


def test_a_client_whose_link_is_cut_while_its_request_waits_resumes_its_session_and_gets_the_outcome_pushed(web):
    frames = Frames()
    logins: list[dict] = []

    async def scenario():
        async with user(web, "ANZ-54101", acks=True, debug=frames) as alice:
            alice.on("connected", logins.append)
            session = alice.session_id
            asking = asyncio.create_task(alice.request("orders.later", "resume me"))
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 1)
            request_id = frames.of("in", "REQUEST_ACCEPTED")[0]["data"]["id"]
            alice._ws.transport.abort()  # the link dies: no close frame (the server is not told)
            await until(lambda: len(logins) == 1 and len(frames.of("in", "FETCH_MISSING_MESSAGES_COMPLETE")) == 2)
            await until(lambda: connections(web, "ANZ-54101") == 1)  # (the cut connection is gone on the server)
            answered = await asyncio.to_thread(answer, web, request_id, "resolve", "found you")
            outcome: Outcome = await asking
            return session, request_id, answered, outcome

    session, request_id, answered, outcome = run(scenario())
    assert answered.status_code == 200
    assert [f["data"].get("sessionId") for f in frames.of("out", "AUTH_CLIENT")] == [None, session]
    assert [f["data"]["sessionId"] for f in frames.of("in", "AUTH_CLIENT_REPLY")] == [session, session]
    assert logins == [{"app_id": "app-id-343", "user_id": "ANZ-54101", "session_id": session, "resumed": True}]
    assert (outcome.content, outcome.request_id) == ("found you", request_id)
    # Pushed: it came after the reconnect's fetch was complete, and no fetch asked for it.
    kinds = [f["type"] for d, f in frames.seen if d == "in"]
    assert kinds.index("RESOLVE") > len(kinds) - 1 - kinds[::-1].index("FETCH_MISSING_MESSAGES_COMPLETE")
    assert len(frames.of("out", "FETCH_MISSING_MESSAGES_REQUEST")) == 2


def test_a_session_id_of_another_user_is_forgotten_and_the_client_logs_in_with_a_new_one(web):
    errors: list[RealtimeError] = []

    async def scenario():
        async with user(web, "ANZ-54111") as owner:
            theirs = owner.session_id
        other = user(web, "ANZ-54112", session_id=theirs)
        other.on("error", errors.append)
        async with other:
            return theirs, other.session_id, other.state

    theirs, mine, state = run(scenario())
    assert theirs and mine and mine != theirs
    assert state == "connected"
    assert [e.reason for e in errors] == ["authentication refused", "wrong_user"]


def test_close_session_returns_how_many_outcomes_waited_for_the_session_and_ends_the_client(web):
    frames = Frames()

    async def ask_and_go_away():
        async with user(web, "ANZ-54121", acks=True, debug=frames) as before:
            asking = [asyncio.create_task(before.request("orders.later", text)) for text in ("waited", "later")]
            await until(lambda: len(frames.of("in", "REQUEST_ACCEPTED")) == 2)
        for task in asking:
            with pytest.raises(Closed):  # closed before the answers: the requests wait on the server
                await task
        return before.session_id

    session = run(ask_and_go_away())
    waited, later = (f["data"]["id"] for f in frames.of("in", "REQUEST_ACCEPTED"))
    assert answer(web, waited, "resolve", "waits for the session").status_code == 200
    wait_for(lambda: Request.objects.get(pk=int(waited)).message_id is not None)  # (its outcome is stored)

    async def come_back_and_end_the_session():
        after = user(web, "ANZ-54121", acks=True, session_id=session)  # (no `outcome` listener: not acknowledged)
        await after.connect()
        resumed = after.session_id
        discarded = await after.close_session()
        return resumed, discarded, (after.state, after.session_id)

    resumed, discarded, ended = run(come_back_and_end_the_session())
    assert resumed == session
    assert discarded == 1
    assert ended == ("closed", None)
    assert answer(web, later, "resolve", "nobody waits for this").status_code == 200

    async def a_new_client_fetches():
        got: list[Outcome] = []
        synced = asyncio.Event()
        anew = user(web, "ANZ-54121", acks=True)
        anew.on("outcome", got.append)
        anew.on("synced", lambda _: synced.set())
        async with anew:
            await asyncio.wait_for(synced.wait(), 10)
            await asyncio.sleep(0.5)
        return got

    assert run(a_new_client_fetches()) == []  # the discarded outcome, and none for the request answered later
