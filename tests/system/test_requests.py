"""Requests end to end (docs/protocol.md, "Requests"): real web nodes, a worker reading the queue
intake, a webhook worker and beat; the app's server is this test, reading its request stream with
its own queue credential and answering on its intake stream, or a real local webhook receiver."""

from __future__ import annotations

import json
import os
import signal
import time
from types import SimpleNamespace

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from apps_registry.models import ClientApp, Domain, RequestEndpoint, UserDistribution
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import api_key_create
from foundation.transport.queue_names import (
    REQUESTS_GROUP,
    acl_user_prefix,
    intake_key,
    queue_client,
    queue_redis_url,
    requests_acl_user,
    requests_key,
)
from messaging.intake.stream.credentials import queue_credential_create
from messaging.intake.stream.models import QueueCredential
from messaging.requests.models import Request
from messaging.webhooks.services import webhook_endpoint_create
from tests.messaging.intake.stream.conftest import writer_for
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.system.test_hostile_bytes import metric
from tests.webhook_receiver import WebhookReceiver
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system

APP_ID = "app-id-req"
ENV = {
    **FAST_FAILURE_ENV,
    "WEBHOOKS_ALLOW_HTTP": "true",  # the receivers are plain-HTTP servers on 127.0.0.1
    "WEBHOOK_SWEEP_SECONDS": "1",
    "WEBHOOK_RETRY_BASE_SECONDS": "0.3",
    "WEBHOOK_RETRY_MAX_SECONDS": "0.5",
    "WEBHOOK_MAX_ATTEMPTS": "2",
    "WEBHOOK_TIMEOUT_SECONDS": "3",
    "REQUEST_TIMEOUT_SWEEP_SECONDS": "0.5",
}


@pytest.fixture(scope="module")
def receivers():
    with (WebhookReceiver(answer=b'{"resolve": "placed by the webhook"}') as answering,
          WebhookReceiver(status=202, answer=b"") as later, WebhookReceiver(status=500) as failing,
          WebhookReceiver() as told):
        yield SimpleNamespace(answering=answering, later=later, failing=failing, told=told)


@pytest.fixture(scope="module")
def app(demo_network, django_db_blocker, receivers):
    """REQ, open, homed here, with an endpoint for each way in; its queue credential and an API key."""
    with django_db_blocker.unblock():
        here = Domain.objects.get(name="domain-01")
        req = ClientApp.objects.create(app_name="REQ", app_id=APP_ID, master_user_id="REQ-1", auth_mode="none",
                                       api_rate_limit_per_second=10_000, api_rate_limit_burst=10_000)
        UserDistribution.objects.create(app=req, domain=here, range_from=0, range_to=None)
        endpoints = [
            RequestEndpoint(app=req, name="orders.place", stream=True, max_in_flight_per_user=3),
            RequestEndpoint(app=req, name="orders.quick", webhook_url=receivers.answering.url),
            RequestEndpoint(app=req, name="orders.later", webhook_url=receivers.later.url, timeout_ms=60_000),
            RequestEndpoint(app=req, name="orders.broken", webhook_url=receivers.failing.url),
        ]
        RequestEndpoint.objects.bulk_create(endpoints)
        # (before any node starts: a node hears of a new webhook endpoint within its cache's lifetime)
        webhook_endpoint_create(app_id=req.pk, url=receivers.told.url, events=["request.answered", "request.timed_out"])
        _, password = queue_credential_create(app=req)
        _, key = api_key_create(app=req, name="requests")
        _, other_key = api_key_create(app=ClientApp.objects.get(app_name="BNZ"), name="nosy")
        secret = RequestEndpoint.objects.get(name="orders.quick").webhook_secret
        app_snapshots_clear()
    yield SimpleNamespace(password=password, key=key, other_key=other_key, secret=secret)
    client = queue_client()
    with django_db_blocker.unblock():
        QueueCredential.objects.all().delete()
    for user in client.execute_command("ACL", "USERS"):
        if user.decode().startswith(acl_user_prefix()):
            client.execute_command("ACL", "DELUSER", user)
    for key in client.scan_iter(match="sbq:*"):
        client.delete(key)


@pytest.fixture(scope="module")
def cluster(module_processes, app, tmp_path_factory):
    first = module_processes.web("web-1", **ENV)
    second = module_processes.web("web-2", **ENV)
    module_processes.worker("worker", **ENV)
    module_processes.webhook_worker("hooks", **ENV)
    start_beat(module_processes, tmp_path_factory.mktemp("beat"), **ENV)
    return SimpleNamespace(first=first, second=second, processes=module_processes)


def _reader(password: str) -> redis.Redis:
    """The app's server reading its request stream, as its request-stream ACL user."""
    parsed = redis.connection.parse_url(queue_redis_url())
    return redis.Redis(host=parsed["host"], port=parsed["port"], db=parsed.get("db", 0),
                       username=requests_acl_user("REQ"), password=password, socket_timeout=10,
                       retry=Retry(NoBackoff(), 0))


def _read_requests(reader: redis.Redis, want: int = 1, timeout: float = 15) -> list[dict[str, str]]:
    deadline, found = time.monotonic() + timeout, []
    while len(found) < want and time.monotonic() < deadline:
        try:
            answer = reader.xreadgroup(REQUESTS_GROUP, "server-1", {requests_key("REQ"): ">"}, count=100, block=500)
        except redis.ResponseError as exc:  # the group is made with the stream's first entry
            if "NOGROUP" not in str(exc):
                raise
            time.sleep(0.2)
            continue
        for _, entries in answer or []:
            for entry_id, fields in entries:
                reader.xack(requests_key("REQ"), REQUESTS_GROUP, entry_id)
                found.append({k.decode(): v.decode() for k, v in fields.items()})
    return found


def _client(url: str, user: str) -> WsClient:
    ws = WsClient(url)
    assert ws.auth(user, app_id=APP_ID, acks=True)["data"]["isAuthenticated"] is True
    return ws


def _request(ws: WsClient, endpoint: str, content: str, cmid: str, **extra) -> dict:
    ws.send("REQUEST", {"endpoint": endpoint, "content": content, "clientMessageId": cmid, **extra})
    return ws.recv_until(lambda f: f["type"] in ("REQUEST_ACCEPTED", "INVALID_MESSAGE"))


def _outcome(ws: WsClient, timeout: float = 20) -> dict:
    frame = ws.recv_until(lambda f: f["type"] in ("RESOLVE", "REJECT"), timeout=timeout)
    ws.send("ACK", {"ids": [frame["data"]["id"]]})
    return frame


@pytest.mark.django_db
def test_a_request_reaches_the_servers_stream_and_its_answer_on_the_intake_reaches_the_client(cluster, app):
    reader = _reader(app.password)
    with _client(cluster.first.ws_url, "REQ-1001") as ws:
        accepted = _request(ws, "orders.place", '{"sku": 7}', "r-1")
        assert accepted["type"] == "REQUEST_ACCEPTED" and accepted["data"]["clientMessageId"] == "r-1"
        [told] = _read_requests(reader)
        assert told["requestId"] == accepted["data"]["id"] and told["from"] == "REQ-1001"
        assert (told["endpoint"], told["content"], told["domain"]) == ("orders.place", '{"sku": 7}', "domain-01")
        assert told["answerUrl"].endswith(f"/api/v1/requests/{told['requestId']}")
        writer_for("REQ", app.password).xadd(intake_key("REQ"), {"replyTo": told["requestId"], "outcome": "resolve",
                                                                 "content": "order 7 placed"})
        outcome = _outcome(ws)
    assert outcome["type"] == "RESOLVE"
    assert {k: outcome["data"][k] for k in ("requestId", "clientMessageId", "content")} == {
        "requestId": told["requestId"], "clientMessageId": "r-1", "content": "order 7 placed"}
    assert outcome["data"]["id"].isdigit() and isinstance(outcome["data"]["seq"], int)  # (the outcome's own id: ACKed by it)


@pytest.mark.django_db
def test_the_request_streams_reader_may_read_and_acknowledge_its_own_stream_and_nothing_else(cluster, app):
    reader = _reader(app.password)
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.xadd(requests_key("REQ"), {"forged": "entry"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.xreadgroup("switchboard", "thief", {intake_key("REQ"): ">"}, count=1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.xack(intake_key("REQ"), "switchboard", "0-1")


@pytest.mark.django_db
def test_a_webhook_that_answers_in_its_response_resolves_the_request_signed_and_once(cluster, app, receivers):
    with _client(cluster.first.ws_url, "REQ-1002") as ws:
        accepted = _request(ws, "orders.quick", "now please", "q-1")
        outcome = _outcome(ws)
    assert (outcome["type"], outcome["data"]["content"]) == ("RESOLVE", "placed by the webhook")
    calls = [c for c in receivers.answering.calls if c.json["data"]["requestId"] == accepted["data"]["id"]]
    assert len(calls) == 1 and calls[0].signed_with(app.secret) and calls[0].event == "request.received"
    assert calls[0].json["data"]["content"] == "now please" and calls[0].json["app"] == APP_ID
    resolved = 'switchboard_requests_recent{endpoint="orders.quick",state="resolved"}'
    assert metric(cluster.second, resolved) >= 1  # (read from the table: any node tells it)
    assert metric(cluster.second, 'switchboard_request_outcome_seconds_gcount{endpoint="orders.quick"}') >= 1


@pytest.mark.django_db
def test_a_request_sent_again_after_its_socket_died_is_a_duplicate_with_the_stored_outcome(cluster, app, receivers):
    with _client(cluster.first.ws_url, "REQ-1003") as ws:
        first = _request(ws, "orders.quick", "once only", "dup-1")
        first_outcome = ws.recv_until(lambda f: f["type"] == "RESOLVE")  # never acknowledged: the socket dies
    with _client(cluster.second.ws_url, "REQ-1003") as ws:
        again = _request(ws, "orders.quick", "once only", "dup-1")
        outcome = _outcome(ws)
    assert again["data"] == {"id": first["data"]["id"], "clientMessageId": "dup-1", "duplicate": True}
    assert outcome["data"]["id"] == first_outcome["data"]["id"] and outcome["data"]["content"] == "placed by the webhook"
    asked = [c for c in receivers.answering.calls if c.json["data"]["requestId"] == first["data"]["id"]]
    assert len(asked) == 1  # the server was asked once


@pytest.mark.django_db
def test_a_request_nobody_answers_in_time_is_rejected_with_timeout_and_a_late_answer_is_refused(cluster, app):
    with _client(cluster.first.ws_url, "REQ-1004") as ws:
        accepted = _request(ws, "orders.later", "slow", "t-1", timeoutMs=700)
        outcome = _outcome(ws)
    assert outcome["type"] == "REJECT" and outcome["data"]["reason"] == "timeout"
    request_id = accepted["data"]["id"]
    late = httpx.post(f"{cluster.first.url}/api/v1/requests/{request_id}/resolve", json={"content": "too late"},
                      headers={"Authorization": f"Bearer {app.key}"})
    assert late.status_code == 409 and late.json()["error"] == "request_closed"
    state = httpx.get(f"{cluster.first.url}/api/v1/requests/{request_id}", headers={"Authorization": f"Bearer {app.key}"})
    assert state.json()["state"] == "timed_out" and state.json()["reason"] == "timeout"


@pytest.mark.django_db
def test_a_server_answering_later_through_the_api_resolves_once_and_a_replay_changes_nothing(cluster, app):
    headers = {"Authorization": f"Bearer {app.key}"}
    with _client(cluster.first.ws_url, "REQ-1005") as ws:
        request_id = _request(ws, "orders.later", "take your time", "l-1")["data"]["id"]
        url = f"{cluster.first.url}/api/v1/requests/{request_id}"
        first = httpx.post(f"{url}/reject", json={"content": "out of stock"}, headers=headers)
        replay = httpx.post(f"{url}/reject", json={"content": "out of stock"}, headers=headers)
        other = httpx.post(f"{url}/resolve", json={"content": "in stock after all"}, headers=headers)
        outcome = _outcome(ws)
        time.sleep(0.5)
        assert [f for f in ws.recv_all(quiet=0.5) if f["type"] in ("RESOLVE", "REJECT")] == []
    assert (first.status_code, first.json()["replay"]) == (200, False)
    assert (replay.status_code, replay.json()["replay"]) == (200, True)
    assert other.status_code == 409
    assert (outcome["type"], outcome["data"]["content"]) == ("REJECT", "out of stock") and "reason" not in outcome["data"]
    state = httpx.get(url, headers=headers).json()
    assert (state["state"], state["answered_via"], state["outcome_content"]) == ("rejected", "api", "out of stock")


@pytest.mark.django_db
def test_another_apps_key_cannot_see_or_answer_a_request(cluster, app):
    with _client(cluster.first.ws_url, "REQ-1006") as ws:
        request_id = _request(ws, "orders.later", "private", "p-1")["data"]["id"]
    headers = {"Authorization": f"Bearer {app.other_key}"}
    assert httpx.get(f"{cluster.first.url}/api/v1/requests/{request_id}", headers=headers).status_code == 404
    assert httpx.post(f"{cluster.first.url}/api/v1/requests/{request_id}/resolve", json={"content": "x"},
                      headers=headers).status_code == 404


@pytest.mark.django_db
def test_a_request_whose_webhook_is_dead_lettered_is_rejected_with_endpoint_failed(cluster, app, receivers):
    with _client(cluster.first.ws_url, "REQ-1007") as ws:
        _request(ws, "orders.broken", "will fail", "f-1")
        outcome = _outcome(ws, timeout=30)
    assert outcome["type"] == "REJECT" and outcome["data"]["reason"] == "endpoint_failed"
    assert len(receivers.failing.calls) >= 2  # (WEBHOOK_MAX_ATTEMPTS)


@pytest.mark.django_db
def test_bad_requests_are_refused_with_a_code_and_the_connection_goes_on(cluster, app):
    with _client(cluster.first.ws_url, "REQ-1008") as ws:
        assert _request(ws, "no.such", "x", "b-1")["data"]["code"] == "unknown_endpoint"
        assert _request(ws, "orders.place", "x", "b-2", timeoutMs=10**9)["data"]["code"] == "timeout_too_long"
        ws.send("REQUEST", {"endpoint": "orders.place", "content": "x"})
        assert ws.recv_type("INVALID_MESSAGE")["data"]["code"] == "invalid_request"
        for i in range(3):  # the endpoint's cap: 3 in flight per user
            assert _request(ws, "orders.place", "x", f"cap-{i}")["type"] == "REQUEST_ACCEPTED"
        refused = _request(ws, "orders.place", "x", "cap-3")
        assert (refused["type"], refused["data"]["code"], refused["data"]["limit"]) == (
            "INVALID_MESSAGE", "too_many_requests", 3)
        assert _request(ws, "orders.quick", "still served", "b-3")["type"] == "REQUEST_ACCEPTED"


@pytest.mark.django_db
def test_a_request_whose_web_node_is_killed_gets_its_outcome_once_on_another_node(cluster, app):
    spare = cluster.processes.web("web-3", **ENV)
    reader = _reader(app.password)
    _read_requests(reader, want=10**6, timeout=1)  # (what earlier tests left on the stream)
    ws = _client(spare.ws_url, "REQ-1009")
    request_id = _request(ws, "orders.place", "survive this", "k-1")["data"]["id"]
    [told] = [t for t in _read_requests(reader) if t["requestId"] == request_id]
    os.kill(spare.popen.pid, signal.SIGKILL)
    spare.popen.wait(10)
    writer_for("REQ", app.password).xadd(intake_key("REQ"), {"replyTo": told["requestId"], "outcome": "resolve",
                                                             "content": "answered while you were away"})
    wait_for(lambda: Request.objects.get(pk=int(request_id)).state == "resolved", timeout=20)
    with _client(cluster.first.ws_url, "REQ-1009") as back:
        back.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
        frames = back.recv_all(quiet=1.5)
    outcomes = [f for f in frames if f["type"] == "RESOLVE"]
    assert len(outcomes) == 1 and outcomes[0]["data"]["content"] == "answered while you were away"
    assert json.loads(json.dumps(outcomes[0]["data"]))["clientMessageId"] == "k-1"


# --- sessions -------------------------------------------------------------------------------------


def _login(url: str, user: str, **extra) -> tuple[WsClient, str]:
    ws = WsClient(url)
    reply = ws.auth(user, app_id=APP_ID, acks=True, **extra)["data"]
    assert reply["isAuthenticated"] is True
    return ws, reply["sessionId"]


def _answer(cluster, app, request_id: str, content: str) -> None:
    answered = httpx.post(f"{cluster.first.url}/api/v1/requests/{request_id}/resolve", json={"content": content},
                          headers={"Authorization": f"Bearer {app.key}"})
    assert answered.status_code == 200


@pytest.mark.django_db
def test_a_session_resumed_on_another_node_gets_the_outcome_of_the_request_it_made_before(cluster, app):
    ws, session = _login(cluster.first.ws_url, "REQ-2001")
    request_id = _request(ws, "orders.later", "resume me", "s-1")["data"]["id"]
    ws.close()  # lost in a tunnel
    back, resumed = _login(cluster.second.ws_url, "REQ-2001", sessionId=session)
    with back:
        assert resumed == session
        _answer(cluster, app, request_id, "found you")
        outcome = _outcome(back)
    assert (outcome["type"], outcome["data"]["content"], outcome["data"]["requestId"]) == ("RESOLVE", "found you",
                                                                                           request_id)


@pytest.mark.django_db
def test_an_outcome_is_pushed_to_the_session_that_asked_and_not_to_the_users_other_session(cluster, app):
    asking, _ = _login(cluster.first.ws_url, "REQ-2002")
    other, _ = _login(cluster.second.ws_url, "REQ-2002")
    with asking, other:
        request_id = _request(asking, "orders.later", "mine", "s-2")["data"]["id"]
        _answer(cluster, app, request_id, "only for the asker")
        assert _outcome(asking)["data"]["content"] == "only for the asker"
        assert [f for f in other.recv_all(quiet=1.0) if f["type"] == "RESOLVE"] == []
    fresh, _ = _login(cluster.first.ws_url, "REQ-2003")  # (fetch from any connection still returns one)
    with fresh:
        request_id = _request(fresh, "orders.later", "fetch me", "s-3")["data"]["id"]
        fresh.close()
    _answer(cluster, app, request_id, "fetched")
    with WsClient(cluster.second.ws_url) as plain:
        plain.auth("REQ-2003", app_id=APP_ID)
        plain.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
        frames = plain.recv_all(quiet=1.0)
    assert [f["data"]["content"] for f in frames if f["type"] == "RESOLVE"] == ["fetched"]


@pytest.mark.django_db
def test_a_session_id_of_another_user_is_refused_with_wrong_user(cluster, app):
    owner, session = _login(cluster.first.ws_url, "REQ-2004")
    owner.close()
    with WsClient(cluster.second.ws_url) as thief:
        reply = thief.auth("REQ-2005", app_id=APP_ID, sessionId=session)
        code = thief.wait_closed()
    assert reply["data"]["isAuthenticated"] is False and code == 1008
    with WsClient(cluster.second.ws_url) as forger:
        assert forger.auth("REQ-2005", app_id=APP_ID, sessionId="sMadeUpByTheClient.abc")["data"][
            "isAuthenticated"] is False


@pytest.mark.django_db
def test_close_session_discards_what_waited_for_it_and_drops_later_outcomes(cluster, app):
    ws, session = _login(cluster.first.ws_url, "REQ-2006")
    waited = _request(ws, "orders.later", "answered while away", "c-1")["data"]["id"]
    later = _request(ws, "orders.later", "answered after the close", "c-2")["data"]["id"]
    ws.close()
    _answer(cluster, app, waited, "waits for the session")
    wait_for(lambda: Request.objects.get(pk=int(waited)).message_id is not None)
    back, resumed = _login(cluster.second.ws_url, "REQ-2006", sessionId=session)
    with back:
        assert resumed == session
        back.send("CLOSE_SESSION", {})
        closed = back.recv_type("SESSION_CLOSED")
        assert back.wait_closed() == 1000
    assert closed["data"] == {"sessionId": session, "discarded": 1}
    _answer(cluster, app, later, "nobody waits for this")
    with WsClient(cluster.first.ws_url) as anew:
        reply = anew.auth("REQ-2006", app_id=APP_ID, sessionId=session)["data"]
        assert reply["isAuthenticated"] is True and reply["sessionId"] != session  # it ended: a new one
        anew.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
        frames = anew.recv_all(quiet=1.0)
    assert [f for f in frames if f["type"] in ("RESOLVE", "REJECT")] == []
    assert Request.objects.get(pk=int(later)).state == "resolved"  # answered, its outcome not stored


# --- the server asking a client ---------------------------------------------------------------------


@pytest.fixture
def told(receivers):
    """REQ's webhook endpoint for its requests' answers and timeouts."""
    return receivers.told


def _ask(cluster, app, user: str, content: str, **extra) -> str:
    asked = httpx.post(f"{cluster.first.url}/api/v1/users/{user}/requests", json={"content": content, **extra},
                       headers={"Authorization": f"Bearer {app.key}"})
    assert asked.status_code == 201, asked.text
    return asked.json()["id"]


@pytest.mark.django_db
def test_a_server_request_answered_after_the_client_reconnected_reaches_the_servers_webhook(cluster, app, told):
    request_id = _ask(cluster, app, "REQ-3001", "confirm order 9?", correlation="order-9")
    with WsClient(cluster.second.ws_url) as ws:
        ws.auth("REQ-3001", app_id=APP_ID, acks=True)
        ws.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
        asked = ws.recv_type("SERVER_REQUEST")
        assert (asked["data"]["requestId"], asked["data"]["content"]) == (request_id, "confirm order 9?")
        ws.send("ACK", {"ids": [asked["data"]["id"]]})
        ws.send("RESOLVE", {"requestId": request_id, "content": "yes"})
        assert ws.recv_type("ANSWER_ACCEPTED")["data"] == {"requestId": request_id}
        ws.send("REJECT", {"requestId": request_id, "content": "no, after all"})
        assert ws.recv_type("INVALID_MESSAGE")["data"]["code"] == "request_closed"
    [call] = told.wait_for(lambda c: c.event == "request.answered" and c.json["data"]["requestId"] == request_id)
    assert {k: call.json["data"][k] for k in ("correlation", "user", "outcome", "content")} == {
        "correlation": "order-9", "user": "REQ-3001", "outcome": "resolve", "content": "yes"}
    state = httpx.get(f"{cluster.first.url}/api/v1/requests/{request_id}",
                      headers={"Authorization": f"Bearer {app.key}"}).json()
    assert (state["direction"], state["state"], state["outcome_content"]) == ("to_client", "resolved", "yes")


@pytest.mark.django_db
def test_no_user_answers_a_request_made_of_another_and_an_unanswered_one_times_out(cluster, app, told):
    request_id = _ask(cluster, app, "REQ-3002", "are you there?", correlation="ping-1", timeoutSeconds=1.5)
    with WsClient(cluster.first.ws_url) as intruder:
        intruder.auth("REQ-3003", app_id=APP_ID)
        intruder.send("RESOLVE", {"requestId": request_id, "content": "it is me"})
        assert intruder.recv_type("INVALID_MESSAGE")["data"]["code"] == "not_found"
    [call] = told.wait_for(lambda c: c.event == "request.timed_out" and c.json["data"]["requestId"] == request_id)
    assert call.json["data"]["correlation"] == "ping-1"
    with WsClient(cluster.first.ws_url) as late:
        late.auth("REQ-3002", app_id=APP_ID)
        late.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
        assert [f for f in late.recv_all(quiet=1.0) if f["type"] == "SERVER_REQUEST"] == []  # withdrawn


@pytest.mark.django_db
def test_a_request_stream_lost_with_its_group_comes_back_with_its_group(cluster, app):
    queue_client().delete(requests_key("REQ"))  # (what a Redis restarted empty leaves)
    reader = _reader(app.password)
    with _client(cluster.first.ws_url, "REQ-4001") as ws:
        request_id = _request(ws, "orders.place", "after the loss", "g-1")["data"]["id"]
        assert reader.xreadgroup(REQUESTS_GROUP, "server-1", {requests_key("REQ"): ">"}, count=10, block=5000)[0][1][
            0][1][b"requestId"].decode() == request_id
