"""The server REST API against real daphne web nodes and a real Celery worker, talked to with the
Python client (switchboard_client, clients/python) and real WebSocket clients."""

from __future__ import annotations

import threading

import httpx
import pytest
from django.db import transaction
from django.utils import timezone
from switchboard_client import ApiError, SwitchboardClient

from apps_registry.models import ApiKey, ClientApp
from apps_registry.services import api_key_create, api_key_revoke
from messaging.core.store import OutgoingMessage, messages_store
from messaging.models import Delivery, Message
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system
KEY_CACHE_SECONDS = 1


@pytest.fixture(scope="module")
def keys(demo_network, django_db_blocker):
    """Committed API keys (ANZ, BNZ, LIM; one of ANZ's to be revoked); ANZ lets clients subscribe to
    `news.*`; LIM has a tight API rate limit."""
    with django_db_blocker.unblock():
        ClientApp.objects.filter(app_name="ANZ").update(client_subscriptions_allowed=True,
                                                        public_channel_patterns=["news.*"])
        ClientApp.objects.filter(app_name="LIM").update(api_rate_limit_per_second=0.2, api_rate_limit_burst=3)
        made = {name: api_key_create(app=demo_network[name], name=f"{name} server")[1] for name in ("anz", "bnz", "lim")}
        made["revocable"] = api_key_create(app=demo_network["anz"], name="to revoke")[1]
    return made


@pytest.fixture(scope="module")
def nodes(module_processes, keys):
    """Two web nodes and a worker."""
    env = {"API_KEY_CACHE_SECONDS": str(KEY_CACHE_SECONDS)}
    first = module_processes.web("web-a", **env)
    second = module_processes.web("web-b", **env)
    module_processes.worker("worker")
    return first, second


@pytest.fixture
def anz_api(nodes, keys):
    with SwitchboardClient(nodes[0].url, keys["anz"], retries=0) as client:
        yield client


def _subscribed(client: WsClient, channel: str, **extra) -> dict:
    client.send("SUBSCRIBE", {"channel": channel, **extra})
    return client.recv_type("SUBSCRIBED")


def test_push_publish_answers_with_the_live_subscribers_on_any_node(nodes, anz_api, keys):
    with WsClient(nodes[1].ws_url) as reader:  # subscribed on the other node
        reader.auth("ANZ-3101")
        assert _subscribed(reader, "news.sport")["data"] == {"channel": "news.sport", "offset": 0}
        wait_for(lambda: anz_api.channel_members("news.sport")[0] == 1, timeout=10)
        response = httpx.post(f"{nodes[0].url}/messages", json={"channel": "news.sport", "message": {"score": "2-1"}},
                              headers={"Authorization": f"Bearer {keys['anz']}"})
        assert response.status_code == 202 and response.json() == {"subscribers": 1}
        frame = reader.recv_type("CHANNEL_MESSAGE")
        assert frame["data"] == {"channel": "news.sport", "content": '{"score":"2-1"}', "offset": 1}


def test_a_reliable_send_reaches_a_connected_user_and_its_record_says_delivered(nodes, anz_api):
    with WsClient(nodes[1].ws_url) as bob:
        bob.auth("ANZ-3201")
        sent = anz_api.send("ANZ-3201", "your order shipped", reference="order-1")
        frame = bob.recv_type("MESSAGE")
        assert frame["data"] == {"from": "ANZ-123223", "content": "your order shipped", "id": sent["id"], "seq": 1}
        assert frame["reference"] == "order-1"
        wait_for(lambda: anz_api.message(sent["id"])["deliveries"][0]["state"] == "delivered", timeout=15)
        delivery = anz_api.message(sent["id"])["deliveries"][0]
        assert delivery["sent_at"] and delivery["delivered_at"] and delivery["attempts"] == 0


def test_a_fast_send_reaches_every_connection_of_its_recipients(nodes, anz_api):
    with WsClient(nodes[0].ws_url) as one, WsClient(nodes[1].ws_url) as two:
        one.auth("ANZ-3301")
        two.auth("ANZ-3301")
        assert anz_api.send(["ANZ-3301", "ANZ-3302"], "typing", feature="FAST")["connections"] == 2
        for client in (one, two):
            assert client.recv_type("MESSAGE")["data"] == {"from": "ANZ-123223", "content": "typing"}


def test_wrong_revoked_and_other_app_keys_are_refused(nodes, keys, django_db_blocker):
    url = nodes[0].url
    with SwitchboardClient(url, keys["revocable"], retries=0) as doomed:
        assert doomed.presence("ANZ-1")["domain"] == "domain-01"
        with django_db_blocker.unblock():
            api_key_revoke(api_key=ApiKey.objects.get(name="to revoke"))

        def refused() -> bool:
            try:
                doomed.presence("ANZ-1")
            except ApiError as exc:
                return exc.status == 401 and exc.code == "invalid_api_key"
            return False

        wait_for(refused, timeout=KEY_CACHE_SECONDS + 5)
    wrong = keys["anz"][:-3] + "zzz"
    assert httpx.get(f"{url}/api/v1/users/ANZ-1/presence", headers={"Authorization": f"Bearer {wrong}"}
                     ).status_code == 401
    latin = httpx.get(f"{url}/api/v1/users/ANZ-1/presence", headers={"Authorization": "Bearer sb_é".encode("latin-1")})
    assert latin.status_code == 401 and latin.json()["error"] == "invalid_api_key"
    with SwitchboardClient(url, keys["bnz"], retries=0) as other:
        for call in (lambda: other.send("ANZ-1", "x"), lambda: other.presence("ANZ-1"),
                     lambda: other.disconnect("ANZ-1"), lambda: other.subscribe("news.x", "ANZ-1")):
            with pytest.raises(ApiError) as out_of_reach:
                call()
            assert out_of_reach.value.status == 404


def test_the_rate_limit_answers_429_with_retry_after_on_every_node(nodes, keys):
    statuses, retry_after = [], None
    for i in range(8):  # burst 3 at 0.2/s, drawn from both nodes' shared bucket
        response = httpx.get(f"{nodes[i % 2].url}/api/v1/users/LIM-1/presence",
                             headers={"Authorization": f"Bearer {keys['lim']}"})
        statuses.append(response.status_code)
        if response.status_code == 429:
            retry_after = response.headers["Retry-After"]
            assert response.json()["error"] == "rate_limited"
    assert 3 <= statuses.count(200) <= 4 and statuses.count(429) >= 4  # (a slow run may refill one token)
    assert retry_after.isdigit() and int(retry_after) >= 1


@pytest.mark.django_db
def test_concurrent_retries_with_one_idempotency_key_store_one_message(nodes, keys):
    body = {"to": "ANZ-3401", "content": "charge once", "reference": "inv-77"}
    start = threading.Barrier(8)
    answers: list[tuple[int, dict]] = []

    def post(url: str) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['anz']}",
                                                 "Idempotency-Key": "inv-77-charge"}) as client:
            start.wait()
            response = client.post("/api/v1/messages", json=body)
            answers.append((response.status_code, response.json()))

    threads = [threading.Thread(target=post, args=(nodes[i % 2].url,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 8
    stored = [a for status, a in answers if status == 201]
    assert all(status in (201, 409) for status, _ in answers)
    assert stored and all(a == stored[0] for a in stored)
    assert Message.objects.filter(content="charge once").count() == 1


def test_disconnecting_a_user_closes_its_connections_on_every_node_with_1000(nodes, anz_api):
    with WsClient(nodes[0].ws_url) as one, WsClient(nodes[1].ws_url) as two:
        one.auth("ANZ-3501")
        two.auth("ANZ-3501")
        assert anz_api.presence("ANZ-3501") == {"user_id": "ANZ-3501", "domain": "domain-01", "online": True,
                                                "connections": 2}
        assert anz_api.disconnect("ANZ-3501") == 2
        assert one.wait_closed() == 1000 and two.wait_closed() == 1000
    wait_for(lambda: anz_api.presence("ANZ-3501")["online"] is False, timeout=10)


def test_a_server_subscription_feeds_a_users_live_connection_and_history_replays_it(nodes, anz_api):
    with WsClient(nodes[1].ws_url) as carol:
        carol.auth("ANZ-3601")
        assert anz_api.subscribe("orders.3601", "ANZ-3601")["created"] is True
        wait_for(lambda: anz_api.channel_members("orders.3601")[1] == [{"user_id": "ANZ-3601", "connections": 1}]
                 and anz_api.channel_members("orders.3601")[0] == 1, timeout=10)
        published = anz_api.publish("orders.3601", "packed")
        assert published["subscribers"] == 1
        frame = carol.recv_type("CHANNEL_MESSAGE")
        assert frame["data"] == {"channel": "orders.3601", "content": "packed", "offset": published["offset"]}
        anz_api.follow("ANZ-3601", "ANZ-3602")
        wait_for(lambda: anz_api.publish("@ANZ-3602", "hi followers")["subscribers"] == 1, timeout=10)
        assert carol.recv_type("CHANNEL_MESSAGE")["data"]["channel"] == "@ANZ-3602"
    assert [h["content"] for h in anz_api.history("orders.3601")] == ["packed"]


def test_a_requeued_dead_letter_is_delivered(nodes, anz_api, demo_network, django_db_blocker):
    # Committed (the nodes must see it), and dead before routing could take it: one transaction.
    with django_db_blocker.unblock(), transaction.atomic():
        stored = messages_store(messages=[OutgoingMessage(app_id=demo_network["anz"].pk, sender="ANZ-3702",
                                                          recipients=("ANZ-3701",), content="second chance")])[0]
        Delivery.objects.filter(pk=stored.delivery_ids[0]).update(state="dead", attempts=3, next_attempt_at=None,
                                                                  dead_at=timezone.now(), last_error="gave up")
    assert stored.delivery_ids[0] in [d["id"] for d in anz_api.dead_letters()]
    with WsClient(nodes[0].ws_url) as dave:
        dave.auth("ANZ-3701")
        assert anz_api.requeue(list(stored.delivery_ids)) == 1
        assert dave.recv_type("MESSAGE", timeout=20)["data"]["content"] == "second chance"


def test_the_node_serves_the_schema_docs_and_request_metrics(nodes, anz_api):
    url = nodes[0].url
    anz_api.presence("ANZ-1")
    anz_api.send("ANZ-1", "counted")
    assert httpx.get(f"{url}/api/schema/", headers={"Accept": "application/json"}).json()["info"]["title"]
    assert "swagger-ui" in httpx.get(f"{url}/api/docs/").text
    metrics = httpx.get(f"{url}/metrics").text
    assert 'route="api-user-presence"' in metrics and 'switchboard_api_sends_total{feature="RELIABLE"}' in metrics
