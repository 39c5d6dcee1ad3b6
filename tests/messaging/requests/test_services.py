"""A request's life in the database (messaging.requests.services): stored once per clientMessageId,
capped per user, answered once, timed out, failed, and its outcome stored in the requester's
mailbox as the frame the client gets."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import ClientApp, Domain, RequestEndpoint, UserDistribution
from apps_registry.selectors import app_snapshot, app_snapshots_clear
from messaging.core.delivery.fetch import missing_fetch
from messaging.models import Delivery, WebhookDelivery
from messaging.requests.models import Request
from messaging.requests.services import (
    RequestClosed,
    RequestUnknown,
    request_answer,
    request_endpoint_failed,
    requests_time_out,
)
from messaging.requests.submit import RequestRefused, Submission, request_submit, requests_submit
from messaging.requests.webhook import answer_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def shop():
    here = Domain.objects.create(name="domain-01", urls=["https://sb.example"])
    app = ClientApp.objects.create(app_name="SHOP", app_id="app-id-shop", master_user_id="SHOP-1", auth_mode="none")
    UserDistribution.objects.create(app=app, domain=here, range_from=0, range_to=None)
    RequestEndpoint.objects.create(app=app, name="orders.place", webhook_url="https://shop.example/hook",
                                   max_in_flight_per_user=2)
    other = ClientApp.objects.create(app_name="OTHER", app_id="app-id-other", master_user_id="OTHER-1")
    app_snapshots_clear()
    snapshot = app_snapshot("SHOP")
    return snapshot, snapshot.endpoint("orders.place"), app_snapshot(other.app_name)


def _submit(shop, cmid: str, user: str = "SHOP-1001", **extra):
    app, endpoint, _ = shop
    return request_submit(app=app, user_id=user, endpoint=endpoint, content=f"order {cmid}", client_message_id=cmid,
                          **extra)


def _outcomes(app, user: str) -> list[dict]:
    fetched = missing_fetch(app_id=app.pk, user_id=user, count=10, skip_ids=[], claim=None)
    return [json.loads(item.frame) for item in fetched.items]


def test_a_request_is_stored_once_per_client_message_id_and_its_server_told_once(shop):
    first = _submit(shop, "r-1")
    again = _submit(shop, "r-1")
    assert (first.duplicate, again.duplicate, again.request_id) == (False, True, first.request_id)
    [call] = WebhookDelivery.objects.all()
    assert call.event == "request.received" and call.request_endpoint.name == "orders.place"
    assert call.payload["data"] == {
        "requestId": str(first.request_id), "endpoint": "orders.place", "from": "SHOP-1001", "content": "order r-1",
        "domain": "domain-01", "answerUrl": f"https://sb.example/api/v1/requests/{first.request_id}",
        "deadline": call.payload["data"]["deadline"]}


def test_a_user_over_the_endpoints_cap_is_refused_and_other_users_are_not(shop):
    _submit(shop, "a"), _submit(shop, "b")
    with pytest.raises(RequestRefused) as refused:
        _submit(shop, "c")
    assert (refused.value.code, refused.value.extra) == ("too_many_requests", {"limit": 2})
    assert not _submit(shop, "c", user="SHOP-1002").duplicate


def test_a_batch_stores_each_new_request_once_within_the_cap_and_answers_each_in_its_place(shop):
    app, endpoint, _ = shop
    _submit(shop, "old")

    def sub(cmid: str, user: str = "SHOP-1001") -> Submission:
        return Submission(app, user, endpoint, f"order {cmid}", cmid)
    answers = requests_submit(submissions=[sub("old"), sub("new"), sub("new"), sub("over"), sub("other", "SHOP-1002"),
                                           Submission(app, "SHOP-1002", endpoint, "x", "bad", timeout_ms=-1)])
    old, new, new_again, over, other, bad = answers
    assert old.duplicate and not new.duplicate and new_again == type(new)(new.request_id, True)
    assert isinstance(over, RequestRefused) and over.code == "too_many_requests"  # (2 in flight: old, new)
    assert not other.duplicate and isinstance(bad, RequestRefused) and bad.code == "invalid_timeout"
    assert WebhookDelivery.objects.count() == 3  # old (before), new, other: each told once


def test_a_timeout_past_the_endpoints_maximum_is_refused(shop):
    with pytest.raises(RequestRefused) as refused:
        _submit(shop, "slow", timeout_ms=10**9)
    assert refused.value.code == "timeout_too_long"


def test_the_first_answer_wins_its_repeat_is_a_replay_and_another_answer_conflicts(shop):
    app, _, other_app = shop
    request_id = _submit(shop, "r-2").request_id
    assert request_answer(app=app, request_id=request_id, outcome="resolve", content="done", via="api").replay is False
    assert request_answer(app=app, request_id=request_id, outcome="resolve", content="done", via="api").replay is True
    with pytest.raises(RequestClosed):
        request_answer(app=app, request_id=request_id, outcome="reject", content="no", via="api")
    with pytest.raises(RequestUnknown):
        request_answer(app=other_app, request_id=request_id, outcome="resolve", content="done", via="api")
    [outcome] = _outcomes(app, "SHOP-1001")
    assert outcome["type"] == "RESOLVE" and outcome["data"]["requestId"] == str(request_id)
    assert (outcome["data"]["clientMessageId"], outcome["data"]["content"]) == ("r-2", "done")
    assert Request.objects.get(pk=request_id).message_id == int(outcome["data"]["id"])


def test_a_request_past_its_deadline_takes_no_answer_and_the_sweep_rejects_it_with_timeout(shop):
    app, _, _ = shop
    request_id = _submit(shop, "late").request_id
    Request.objects.filter(pk=request_id).update(deadline=timezone.now() - timedelta(seconds=1))
    with pytest.raises(RequestClosed) as closed:
        request_answer(app=app, request_id=request_id, outcome="resolve", content="too late", via="api")
    assert closed.value.state == "timed_out"
    assert requests_time_out() == 1 and requests_time_out() == 0
    [outcome] = _outcomes(app, "SHOP-1001")
    assert (outcome["type"], outcome["data"]["reason"], outcome["data"]["content"]) == ("REJECT", "timeout", "")


def test_a_request_whose_call_died_is_rejected_with_endpoint_failed_once(shop):
    app, _, _ = shop
    request_id = _submit(shop, "doomed").request_id
    assert request_endpoint_failed(request_id=request_id, error="HTTP 500") is True
    assert request_endpoint_failed(request_id=request_id, error="HTTP 500") is False
    [outcome] = _outcomes(app, "SHOP-1001")
    assert (outcome["type"], outcome["data"]["reason"]) == ("REJECT", "endpoint_failed")
    assert Delivery.objects.filter(message_id=int(outcome["data"]["id"])).count() == 1


@pytest.mark.parametrize(("body", "answer"), [
    (b'{"resolve": "ok"}', ("resolve", "ok")),
    (b'{"reject": {"why": "stock"}}', ("reject", {"why": "stock"})),
    (b'{"received": true}', None),
    (b"", None),
    (b"not json", None),
    (b'{"resolve": 1, "reject": 2}', None),
])
def test_a_webhooks_answer_body_resolves_rejects_or_means_later(body, answer):
    assert answer_of(body) == answer
