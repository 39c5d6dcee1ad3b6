"""Sending webhook calls to a real local receiver: signed, retried with backoff, dead at the end."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from foundation.slots import slot_release, slot_take
from messaging.models import WebhookDelivery
from messaging.webhooks.delivery import (
    webhook_attempt,
    webhook_backoff,
    webhook_deliveries_purge,
    webhook_lease_seconds,
    webhook_slot_seconds,
    webhooks_sweep,
)
from messaging.webhooks.selectors import webhook_events_forget
from messaging.webhooks.services import (
    WebhookNotice,
    webhook_deliveries_requeue,
    webhook_endpoint_create,
    webhook_test_send,
    webhooks_record,
)
from tests.factories import make_app
from tests.processes import free_port
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db  # the calls are made by hand here: no task is queued on commit


@pytest.fixture(autouse=True)
def _fresh_cache():
    webhook_events_forget()
    yield
    webhook_events_forget()


@pytest.fixture
def anz():
    return make_app()


@pytest.fixture
def receiver():
    with WebhookReceiver() as server:
        yield server


@pytest.fixture
def failing():
    with WebhookReceiver(status=500) as server:
        yield server


@pytest.fixture
def shrunk(settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 3
    settings.WEBHOOK_RETRY_BASE_SECONDS = 1.0
    settings.WEBHOOK_RETRY_MAX_SECONDS = 1.5
    return settings


def _record_one(app, url: str) -> tuple[WebhookDelivery, str]:
    """A new endpoint of the app (the only enabled one) and one user.connected call recorded for it."""
    app.webhook_endpoints.update(enabled=False)
    webhook_events_forget(app.pk)
    _, secret = webhook_endpoint_create(app_id=app.pk, url=url)
    assert webhooks_record(notices=[WebhookNotice(app.pk, "user.connected", {"userId": "ANZ-7"})]) == 1
    return WebhookDelivery.objects.get(endpoint__url=url), secret


def _make_due(row: WebhookDelivery) -> None:
    WebhookDelivery.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def _fresh(row: WebhookDelivery) -> WebhookDelivery:
    return WebhookDelivery.objects.get(pk=row.pk)


def test_the_receiver_gets_the_signed_body_with_the_documented_headers(anz, receiver):
    row, secret = _record_one(anz, receiver.url)
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "delivered"

    [call] = receiver.calls
    assert call.signed_with(secret)
    assert call.headers["content-type"] == "application/json"
    assert call.headers["user-agent"] == "Switchboard-Webhooks/1"
    assert call.headers["switchboard-event"] == "user.connected"
    assert call.headers["switchboard-delivery"] == str(row.id)
    assert call.json == {"id": str(row.id), "event": "user.connected", "app": "app-id-343",
                         "created": int(row.created_at.timestamp()), "data": {"userId": "ANZ-7"}}
    done = _fresh(row)
    assert (done.state, done.attempts, done.last_status, done.claim, done.next_attempt_at) == (
        "delivered", 0, 200, None, None)
    assert done.delivered_at is not None


def test_a_delivered_call_is_not_made_again_and_a_duplicate_task_sends_nothing(anz, receiver):
    row, _ = _record_one(anz, receiver.url)
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "delivered"
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "skipped"
    _make_due(row)
    assert webhooks_sweep()[0] == []  # a delivered row is never handed out again
    assert len(receiver.calls) == 1


def _database_now():
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def test_a_failing_receiver_is_retried_with_growing_backoff_then_the_call_is_dead(anz, failing, shrunk):
    row, secret = _record_one(anz, failing.url)
    outcomes, waits = [], []
    claim = row.claim
    for _ in range(3):
        before = _database_now()  # what the backoff counts from (the test's transaction: its start)
        outcomes.append(webhook_attempt(delivery_id=str(row.id), claim=claim))
        current = _fresh(row)
        if current.state == "retrying":
            waits.append((current.next_attempt_at - before).total_seconds())
            assert webhooks_sweep()[0] == []  # not due yet
            _make_due(row)
            ids, claim = webhooks_sweep()
            assert ids == [str(row.id)]
    assert outcomes == ["retrying", "retrying", "dead"]
    # base 1 s doubling, capped at 1.5 s, times a random 0.5-1.0
    assert 0.45 <= waits[0] <= 1.1 and 0.7 <= waits[1] <= 1.6
    dead = _fresh(row)
    assert (dead.state, dead.attempts, dead.last_status, dead.next_attempt_at) == ("dead", 3, 500, None)
    assert dead.dead_at is not None and dead.last_error == "HTTP 500: receiver is failing on purpose"
    # every attempt carried the same body and delivery id, each freshly signed
    assert len(failing.calls) == 3 and len({c.body for c in failing.calls}) == 1
    assert {c.headers["switchboard-delivery"] for c in failing.calls} == {str(row.id)}
    assert all(c.signed_with(secret) for c in failing.calls)
    _make_due(row)
    assert webhooks_sweep()[0] == []  # dead rows are not the sweep's business


def test_no_answer_in_time_and_a_refused_connection_are_failed_attempts(anz, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.3
    with WebhookReceiver(delay=2) as slow:
        row, _ = _record_one(anz, slow.url)
        assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "retrying"
    late = _fresh(row)
    assert (late.attempts, late.last_status, late.last_error) == (1, None, "no answer within 0.3 s")

    closed = f"http://127.0.0.1:{free_port()}/hooks"
    row, _ = _record_one(anz, closed)
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "retrying"
    refused = _fresh(row)
    assert refused.attempts == 1 and refused.last_error.startswith("cannot connect to 127.0.0.1")


def test_a_lost_task_is_made_up_for_by_the_sweep_once_its_lease_has_passed(anz, receiver):
    row, _ = _record_one(anz, receiver.url)
    assert webhooks_sweep()[0] == []  # handed to a task that is still within its lease
    _make_due(row)  # ... which passed: the task was lost with its worker
    ids, new_claim = webhooks_sweep()
    assert ids == [str(row.id)]
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "skipped"  # the lost task, late
    assert webhook_attempt(delivery_id=str(row.id), claim=new_claim) == "delivered"
    assert len(receiver.calls) == 1


def test_backoff_doubles_from_the_base_up_to_the_cap_with_jitter(settings):
    settings.WEBHOOK_RETRY_BASE_SECONDS = 10.0
    settings.WEBHOOK_RETRY_MAX_SECONDS = 60.0
    for attempts, full in [(1, 10), (2, 20), (3, 40), (4, 60), (9, 60)]:
        samples = [webhook_backoff().seconds(attempts) for _ in range(200)]
        assert full * 0.5 <= min(samples) and max(samples) <= full
        assert max(samples) - min(samples) > full * 0.2  # spread out, not all at once


def test_plain_http_endpoints_are_not_called_once_the_platform_stops_allowing_them(anz, receiver, settings):
    row, _ = _record_one(anz, receiver.url)
    settings.WEBHOOKS_ALLOW_HTTP = False
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "retrying"
    assert receiver.calls == [] and "WEBHOOKS_ALLOW_HTTP" in _fresh(row).last_error


def test_an_operator_requeues_a_dead_call_with_fresh_attempts_and_it_goes_out(anz, receiver):
    other = make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    row, _ = _record_one(anz, receiver.url)
    WebhookDelivery.objects.filter(pk=row.pk).update(state="dead", attempts=8, dead_at=timezone.now(), claim=None,
                                                     next_attempt_at=None)
    assert webhook_deliveries_requeue(delivery_ids=[row.id], app_id=other.pk) == 0  # not BNZ's to touch
    assert webhook_deliveries_requeue(delivery_ids=[row.id], app_id=anz.pk) == 1
    again = _fresh(row)
    assert (again.state, again.attempts, again.dead_at) == ("pending", 0, None)
    assert webhook_attempt(delivery_id=str(row.id), claim=again.claim) == "delivered"
    assert len(receiver.calls) == 1


def test_a_test_event_goes_to_the_one_endpoint_whatever_events_it_wants(anz, receiver):
    endpoint, secret = webhook_endpoint_create(app_id=anz.pk, url=receiver.url, events=["channel.vacated"],
                                               enabled=False)
    row = webhook_test_send(endpoint=endpoint)
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "delivered"
    [call] = receiver.calls
    assert call.signed_with(secret) and call.event == "webhook.test"
    assert json.loads(call.body)["data"]["endpoint"] == endpoint.pk


def test_delivery_records_past_the_retention_are_purged(anz, receiver, settings):
    settings.WEBHOOK_RETENTION_DAYS = 7
    webhook_endpoint_create(app_id=anz.pk, url=receiver.url)
    for _ in range(3):
        webhooks_record(notices=[WebhookNotice(anz.pk, "user.connected", {"userId": "ANZ-7"})])
    old = list(WebhookDelivery.objects.order_by("created_at").values_list("id", flat=True)[:2])
    WebhookDelivery.objects.filter(pk__in=old).update(created_at=timezone.now() - timedelta(days=8))
    assert webhook_deliveries_purge(batch=1) == 2  # a batch per statement until none is left
    assert WebhookDelivery.objects.count() == 1 and not WebhookDelivery.objects.filter(pk__in=old).exists()


def test_a_receiver_that_drips_its_answer_is_cut_off_at_the_deadline_and_that_is_a_failed_attempt(anz, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 1.0
    with WebhookReceiver(drip=0.1) as dripping:  # each byte well within any per-read timeout
        row, _ = _record_one(anz, dripping.url)
        started = time.monotonic()
        assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "retrying"
        took = time.monotonic() - started
    assert 0.9 <= took < 5
    late = _fresh(row)
    assert (late.attempts, late.last_status, late.last_error) == (1, None, "no answer within 1 s")


def test_a_receiver_on_a_network_the_operator_did_not_allow_is_never_called(anz, receiver, settings):
    row, _ = _record_one(anz, receiver.url)
    settings.OUTGOING_ALLOWED_NETWORKS = []
    assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "retrying"
    refused = _fresh(row)
    assert receiver.calls == [] and refused.attempts == 1
    assert refused.last_error.startswith("refused: 127.0.0.1 resolves to 127.0.0.1 is a loopback address")


def test_a_call_over_its_apps_concurrency_cap_waits_without_using_an_attempt(anz, receiver, settings):
    settings.WEBHOOK_APP_CONCURRENCY = 1
    settings.WEBHOOK_BUSY_RETRY_SECONDS = 1.0
    other = make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    row, _ = _record_one(anz, receiver.url)
    with WebhookReceiver() as bnz_receiver:
        others, _ = _record_one(other, bnz_receiver.url)
        held = slot_take(f"webhooks:app:{anz.pk}", cap=1, ttl=30)  # a slow call of ANZ's in flight elsewhere
        try:
            assert webhook_attempt(delivery_id=str(row.id), claim=row.claim) == "busy"
            assert webhook_attempt(delivery_id=str(others.id), claim=others.claim) == "delivered"  # not held up
        finally:
            slot_release(f"webhooks:app:{anz.pk}", held)
        assert len(bnz_receiver.calls) == 1
    waiting = _fresh(row)
    assert (waiting.state, waiting.attempts, waiting.claim) == ("pending", 0, None)
    assert 0 < (waiting.next_attempt_at - timezone.now()).total_seconds() <= 1.0
    assert receiver.calls == []
    _make_due(row)
    ids, claim = webhooks_sweep()
    assert ids == [str(row.id)]
    assert webhook_attempt(delivery_id=str(row.id), claim=claim) == "delivered"


def test_the_lease_of_a_handed_out_call_outlasts_its_whole_call_deadline(settings):
    for deadline in (1.0, 10.0, 30.0, 120.0):
        settings.WEBHOOK_TIMEOUT_SECONDS = deadline
        assert webhook_lease_seconds() > webhook_slot_seconds() > deadline
