"""Requests over Socket.IO (docs/protocol.md, "Socket.IO" and "Requests"), with the real
socket.io-client (Node) and python-socketio against a real web node and worker: the `request` event
is acknowledged with the request's id, the app's server answers through the REST API, and the
outcome comes as a `resolve` or `reject` event whose callback, in ACK mode, is its ACK; a request
sent again with its clientMessageId is a duplicate, and its outcome comes again."""

from __future__ import annotations

import httpx
import pytest

from apps_registry.models import RequestEndpoint
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import api_key_create
from foundation.transport.queue_names import queue_client
from messaging.models import Delivery, DeliveryState
from tests.sioclients import NodeClient, SioUser
from tests.wsclient import wait_for

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def web(module_processes, demo_network, django_db_blocker):
    """ANZ with the endpoint `orders.place` (on its request stream, read by nobody: the server answers
    through the API), its API key, a web node and a worker."""
    with django_db_blocker.unblock():
        RequestEndpoint.objects.create(app=demo_network["anz"], name="orders.place", stream=True, timeout_ms=60_000)
        key = api_key_create(app=demo_network["anz"], name="socket.io requests")[1]
        app_snapshots_clear()
    node = module_processes.web("web")
    module_processes.worker("worker")
    node.api_key = key
    yield node
    client = queue_client()
    for stream in client.scan_iter(match="sbq:ANZ:*"):
        client.delete(stream)


def answer(web, request_id: str, outcome: str, content: str) -> None:
    """The app's server answers (POST /api/v1/requests/{id}/resolve or /reject)."""
    answered = httpx.post(f"{web.url}/api/v1/requests/{request_id}/{outcome}", json={"content": content},
                          headers={"Authorization": f"Bearer {web.api_key}"}, timeout=10)
    assert answered.status_code == 200, answered.text


@pytest.mark.django_db
def test_a_request_answered_through_the_api_arrives_as_a_resolve_event_and_its_callback_is_the_ack(web):
    with NodeClient() as alice:
        alice.connect(web.url, "ANZ-54001", acks=True)
        accepted = alice.call("request", {"endpoint": "orders.place", "content": '{"sku": 7}', "clientMessageId": "s-1"})
        assert accepted["id"].isdigit() and accepted == {"id": accepted["id"], "clientMessageId": "s-1"}
        answer(web, accepted["id"], "resolve", "order 7 placed")
        resolved = alice.wait_event("resolve")
    outcome = resolved["args"][0]
    assert {k: outcome[k] for k in ("requestId", "clientMessageId", "content")} == {
        "requestId": accepted["id"], "clientMessageId": "s-1", "content": "order 7 placed"}
    assert outcome["id"].isdigit() and isinstance(outcome["seq"], int) and "reason" not in outcome
    assert resolved["acked"]
    wait_for(lambda: Delivery.objects.filter(message_id=int(outcome["id"]), state=DeliveryState.DELIVERED).count() == 1)


@pytest.mark.django_db
def test_a_request_sent_again_with_its_client_message_id_is_a_duplicate_and_its_outcome_comes_again(web):
    with NodeClient() as alice:
        alice.connect(web.url, "ANZ-54011", acks=True)
        request = {"endpoint": "orders.place", "content": "once", "clientMessageId": "s-2"}
        first = alice.call("request", request)
        answer(web, first["id"], "reject", "out of stock")
        rejected = alice.wait_event("reject")["args"][0]
        again = alice.call("request", request)
        rejected_again = alice.wait_event("reject")["args"][0]
    assert again == {"id": first["id"], "clientMessageId": "s-2", "duplicate": True}
    assert rejected_again == rejected and rejected["content"] == "out of stock" and "reason" not in rejected


@pytest.mark.django_db
def test_a_request_without_a_client_message_id_or_to_an_unknown_endpoint_is_refused_in_its_callback(web):
    with NodeClient() as alice:
        alice.connect(web.url, "ANZ-54021")
        no_id = alice.call("request", {"endpoint": "orders.place", "content": "x"})
        unknown = alice.call("request", {"endpoint": "orders.nope", "content": "x", "clientMessageId": "s-3"})
    assert (no_id["error"], no_id["code"]) == ("INVALID_MESSAGE", "invalid_request")
    assert (unknown["error"], unknown["code"], unknown["detail"]) == ("INVALID_MESSAGE", "unknown_endpoint",
                                                                      "unknown endpoint")


@pytest.mark.django_db
def test_a_python_socketio_client_gets_its_rejected_request_as_a_reject_event(web):
    with SioUser(web.url, "ANZ-54031", acks=True) as bob:
        accepted = bob.call("request", {"endpoint": "orders.place", "content": "x", "clientMessageId": "s-4"})
        answer(web, accepted["id"], "reject", "no")
        rejected = bob.next("reject")
        assert (rejected["requestId"], rejected["clientMessageId"], rejected["content"]) == (accepted["id"], "s-4", "no")
        wait_for(lambda: Delivery.objects.filter(message_id=int(rejected["id"]),
                                                 state=DeliveryState.DELIVERED).count() == 1)


@pytest.mark.django_db
def test_a_server_request_arrives_as_an_event_whose_callback_answers_it(web):
    asked = httpx.post(f"{web.url}/api/v1/users/ANZ-54041/requests", json={"content": "confirm?",
                                                                          "correlation": "c-9"},
                       headers={"Authorization": f"Bearer {web.api_key}"}, timeout=10)
    assert asked.status_code == 201
    request_id = asked.json()["id"]
    with SioUser(web.url, "ANZ-54041", acks=True) as carol:
        carol.client.on("server_request", lambda data: (carol.events.put(("server_request", data)),
                                                        {"resolve": "confirmed"})[1])
        carol.call("fetch_missing", {"count": 10})
        got = carol.next("server_request")
        assert (got["requestId"], got["content"]) == (request_id, "confirm?")

        def answered() -> bool:
            state = httpx.get(f"{web.url}/api/v1/requests/{request_id}",
                              headers={"Authorization": f"Bearer {web.api_key}"}, timeout=10).json()
            return (state["state"], state["outcome_content"]) == ("resolved", "confirmed")
        wait_for(answered)
        wait_for(lambda: Delivery.objects.filter(message_id=int(got["id"]), state=DeliveryState.DELIVERED).count() == 1)
