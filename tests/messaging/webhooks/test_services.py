"""Webhook endpoints of an app, and which events get recorded for which endpoints."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from foundation.outbound import claim_token
from messaging.channels.services import channel_occupancy_record
from messaging.core.delivery.claims import deliveries_claim
from messaging.core.delivery.lost_nodes import lost_nodes_settle
from messaging.core.delivery.retry import deliveries_fail, deliveries_sweep
from messaging.core.store import message_send
from messaging.models import WebhookDelivery, WebhookEndpoint
from messaging.webhooks.selectors import webhook_endpoint_get, webhook_endpoint_list, webhook_events_forget
from messaging.webhooks.services import (
    WebhookNotice,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhooks_record,
)
from presence.lost_nodes import ReapedNode
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_cache():
    webhook_events_forget()
    yield
    webhook_events_forget()


@pytest.fixture
def anz():
    return make_app(max_delivery_attempts=2)


@pytest.fixture
def bnz():
    return make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")


def _recorded(**filters) -> list[tuple[str, str]]:
    return sorted(WebhookDelivery.objects.filter(**filters).values_list("endpoint__url", "event"))


# --- endpoints -----------------------------------------------------------------------------------


def test_an_endpoint_is_created_with_a_signing_secret_returned_once(anz):
    endpoint, secret = webhook_endpoint_create(app_id=anz.pk, url="https://hooks.example.com/sb",
                                               events=["user.connected", "user.connected", "channel.vacated"])
    assert secret.startswith("whsec_") and len(secret) > 40
    assert endpoint.secret == secret  # stored as is: the platform signs with it
    assert endpoint.events == ["user.connected", "channel.vacated"]
    assert webhook_endpoint_create(app_id=anz.pk, url="https://b.example.com")[0].events == ["*"]
    assert webhook_endpoint_create(app_id=anz.pk, url="https://c.example.com",
                                   events=["*", "user.connected"])[0].events == ["*"]


def test_plain_http_is_refused_unless_the_platform_allows_it(anz, settings):
    settings.WEBHOOKS_ALLOW_HTTP = False
    with pytest.raises(ValidationError) as refused:
        webhook_endpoint_create(app_id=anz.pk, url="http://hooks.example.com/sb")
    assert "https://" in str(refused.value.message_dict["url"])
    settings.WEBHOOKS_ALLOW_HTTP = True
    assert webhook_endpoint_create(app_id=anz.pk, url="http://127.0.0.1:9/hooks")[0].pk


@pytest.mark.parametrize("url", ["https://169.254.169.254/latest/meta-data", "https://[::1]/hooks",
                                 "https://10.0.0.5/hooks", "https://[fe80::1]/hooks"])
def test_an_endpoint_at_an_address_the_platform_never_calls_is_refused(anz, url, settings):
    settings.OUTGOING_ALLOWED_NETWORKS = []
    with pytest.raises(ValidationError) as refused:
        webhook_endpoint_create(app_id=anz.pk, url=url)
    assert "Not called" in str(refused.value.message_dict["url"])


@pytest.mark.parametrize("url", ["ftp://hooks.example.com", "hooks.example.com/sb", "https://", "https://x.example/"
                                 + "a" * 500])
def test_what_is_not_an_http_url_is_refused(anz, url):
    with pytest.raises(ValidationError):
        webhook_endpoint_create(app_id=anz.pk, url=url)


def test_unknown_events_are_refused_by_the_service_and_by_the_database(anz):
    with pytest.raises(ValidationError) as refused:
        webhook_endpoint_create(app_id=anz.pk, url="https://a.example.com", events=["user.connected", "user.typing"])
    assert "user.typing" in str(refused.value)
    for events in (["user.typing"], [], ["webhook.test"]):
        with pytest.raises(IntegrityError), transaction.atomic():
            WebhookEndpoint.objects.create(app=anz, url="https://a.example.com", events=events)
    with pytest.raises(IntegrityError), transaction.atomic():
        WebhookEndpoint.objects.create(app=anz, url="ftp://a.example.com")


def test_an_apps_endpoints_are_its_own_to_list_and_delete(anz, bnz):
    mine, _ = webhook_endpoint_create(app_id=anz.pk, url="https://anz.example.com")
    theirs, _ = webhook_endpoint_create(app_id=bnz.pk, url="https://bnz.example.com")
    assert [e.url for e in webhook_endpoint_list(app_id=anz.pk)] == ["https://anz.example.com"]
    assert webhook_endpoint_get(app_id=anz.pk, endpoint_id=theirs.pk) is None
    assert webhook_endpoint_delete(app_id=anz.pk, endpoint_id=theirs.pk) is False
    assert WebhookEndpoint.objects.filter(pk=theirs.pk).exists()
    assert webhook_endpoint_delete(app_id=anz.pk, endpoint_id=mine.pk) is True
    assert webhook_endpoint_list(app_id=anz.pk) == []


# --- recording -----------------------------------------------------------------------------------


def test_an_event_is_recorded_for_each_enabled_endpoint_of_the_app_that_wants_it(anz, bnz):
    webhook_endpoint_create(app_id=anz.pk, url="https://all.example.com")
    webhook_endpoint_create(app_id=anz.pk, url="https://users.example.com", events=["user.connected"])
    webhook_endpoint_create(app_id=anz.pk, url="https://channels.example.com", events=["channel.occupied"])
    webhook_endpoint_create(app_id=anz.pk, url="https://off.example.com", enabled=False)
    webhook_endpoint_create(app_id=bnz.pk, url="https://bnz.example.com")

    assert webhooks_record(notices=[WebhookNotice(anz.pk, "user.connected", {"userId": "ANZ-7"})]) == 2

    assert _recorded() == [("https://all.example.com", "user.connected"),
                           ("https://users.example.com", "user.connected")]
    row = WebhookDelivery.objects.get(endpoint__url="https://users.example.com")
    assert row.payload == {"id": str(row.id), "event": "user.connected", "app": "app-id-343",
                           "created": int(row.created_at.timestamp()), "data": {"userId": "ANZ-7"}}
    assert (row.state, row.attempts, row.claim is not None, row.next_attempt_at > row.created_at) == (
        "pending", 0, True, True)


def test_an_app_without_endpoints_for_an_event_costs_no_query_once_its_cache_is_warm(anz):
    webhook_endpoint_create(app_id=anz.pk, url="https://channels.example.com", events=["channel.occupied"])
    notice = WebhookNotice(anz.pk, "user.connected", {"userId": "ANZ-7"})
    assert webhooks_record(notices=[notice]) == 0
    with CaptureQueriesContext(connection) as queries:
        assert webhooks_record(notices=[notice] * 50) == 0
    assert queries.captured_queries == []


def test_an_endpoint_deleted_or_disabled_elsewhere_gets_nothing_even_while_a_cache_believes_otherwise(anz):
    endpoint, _ = webhook_endpoint_create(app_id=anz.pk, url="https://gone.example.com")
    notice = WebhookNotice(anz.pk, "user.connected", {"userId": "ANZ-7"})
    assert webhooks_record(notices=[notice]) == 1  # the cache now says "ANZ wants user.connected"
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False)  # another node's console
    assert webhooks_record(notices=[notice]) == 0
    WebhookEndpoint.objects.filter(pk=endpoint.pk).delete()
    assert webhooks_record(notices=[notice]) == 0


def test_an_endpoint_being_deleted_while_events_are_recorded_is_left_out_and_the_callers_transaction_commits(anz):
    # A web node records presence events in the transaction of its batch of sessions: an operator
    # deleting an endpoint at that moment must not fail the batch (every login in it) at commit.
    endpoint, _ = webhook_endpoint_create(app_id=anz.pk, url="https://gone.example.com")
    notice = WebhookNotice(anz.pk, "user.connected", {"userId": "ANZ-7"})
    outcome: dict = {}

    def record_in_a_batch() -> None:
        try:
            with transaction.atomic():
                outcome["recorded"] = webhooks_record(notices=[notice])
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    recorder = threading.Thread(target=record_in_a_batch)
    with transaction.atomic():
        WebhookEndpoint.objects.filter(pk=endpoint.pk).delete()  # not committed yet
        recorder.start()
        deadline = time.monotonic() + 10
        while not _waiting_on_a_lock() and recorder.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
    recorder.join(10)

    assert outcome == {"recorded": 0}
    assert not WebhookDelivery.objects.exists()


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")  # else read once per transaction
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return cur.fetchone()[0] > 0


# --- where events come from ----------------------------------------------------------------------


def test_deliveries_that_die_are_announced_as_dead_lettered_in_one_statement(anz):
    webhook_endpoint_create(app_id=anz.pk, url="https://dlq.example.com", events=["message.dead_lettered"])
    sent = message_send(app_id=anz.pk, sender="ANZ-1", recipients=["ANZ-2", "ANZ-3", "ANZ-4"], content="doomed",
                        kind="group")
    ids = list(sent.delivery_ids)
    token = claim_token()
    deliveries_claim(delivery_ids=ids, token=token)
    assert deliveries_fail(claims=[(i, token) for i in ids], error="push failed").dead == []  # attempt 1 of 2
    assert _recorded() == []
    token = claim_token()
    deliveries_claim(delivery_ids=ids, token=token)
    with CaptureQueriesContext(connection) as queries:
        result = deliveries_fail(claims=[(i, token) for i in ids], error="push failed")
    assert result.dead == sorted(ids)
    assert sum("INSERT INTO messaging_webhookdelivery" in q["sql"] for q in queries.captured_queries) == 1
    payloads = sorted((r.payload["data"] for r in WebhookDelivery.objects.all()), key=lambda d: d["recipient"])
    assert payloads == [{"messageId": str(sent.message_id), "deliveryId": str(i), "recipient": r, "attempts": 2,
                         "lastError": "push failed"} for i, r in zip(sorted(ids), ["ANZ-2", "ANZ-3", "ANZ-4"],
                                                                      strict=True)]


def test_a_push_never_confirmed_dies_in_the_sweep_and_is_announced(anz):
    from datetime import timedelta

    from django.utils import timezone

    from messaging.models import Delivery

    webhook_endpoint_create(app_id=anz.pk, url="https://dlq.example.com", events=["message.dead_lettered"])
    sent = message_send(app_id=anz.pk, sender="ANZ-1", recipients=["ANZ-2"], content="unconfirmed")
    ids = list(sent.delivery_ids)
    for _ in range(2):
        deliveries_claim(delivery_ids=ids, token=claim_token())
        Delivery.objects.filter(pk__in=ids).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
        result = deliveries_sweep()
    assert result.dead == ids
    row = WebhookDelivery.objects.get()
    assert (row.event, row.payload["data"]["recipient"], row.payload["data"]["attempts"]) == (
        "message.dead_lettered", "ANZ-2", 2)
    assert row.payload["data"]["lastError"].startswith("not confirmed within")


def test_a_channels_first_reader_and_its_last_leaving_are_announced(anz):
    webhook_endpoint_create(app_id=anz.pk, url="https://ch.example.com", events=["channel.occupied",
                                                                                 "channel.vacated"])
    channel_occupancy_record(app_id=anz.pk, channel="news.sport", occupied=True)
    channel_occupancy_record(app_id=anz.pk, channel="news.sport", occupied=False)
    rows = WebhookDelivery.objects.order_by("created_at", "event")
    assert sorted((r.event, r.payload["data"]["channel"]) for r in rows) == [
        ("channel.occupied", "news.sport"), ("channel.vacated", "news.sport")]


def test_users_whose_last_connection_died_with_a_node_are_announced_as_disconnected(anz, bnz):
    webhook_endpoint_create(app_id=anz.pk, url="https://users.example.com", events=["user.disconnected"])
    reaped = ReapedNode(node_id="web-dead", sessions=3, users=[(anz.pk, "ANZ-5"), (anz.pk, "ANZ-6"), (bnz.pk, "BNZ-5")],
                        offline=[(anz.pk, "ANZ-5"), (bnz.pk, "BNZ-5")])
    lost_nodes_settle(reaped=[reaped])
    assert [(r.event, r.payload["data"]) for r in WebhookDelivery.objects.all()] == [
        ("user.disconnected", {"userId": "ANZ-5", "domain": "domain-01"})]
