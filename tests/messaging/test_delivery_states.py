"""The delivery state machine and mailbox guarantees, on the real Postgres."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from messaging.models import Delivery, Mailbox, Message
from messaging.services import (
    dead_letters_discard,
    dead_letters_requeue,
    deliveries_claim,
    deliveries_expire,
    deliveries_mark_delivered,
    deliveries_retry,
    deliveries_sweep,
    message_send,
    missing_fetch,
)
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def anz():
    return make_app(max_delivery_attempts=3)


def _send(app, to="ANZ-2", sender="ANZ-1", **kw):
    return message_send(app_id=app.pk, sender=sender, recipients=[to], content="hi", **kw)


def test_a_message_and_its_deliveries_are_stored_together_with_mailbox_sequences(anz):
    result = message_send(app_id=anz.pk, sender="ANZ-1", recipients=["ANZ-3", "ANZ-2", "ANZ-2"], content="x",
                          kind="group")
    assert len(result.delivery_ids) == 2
    assert sorted(Delivery.objects.values_list("recipient", "seq", "state")) == [
        ("ANZ-2", 1, "pending"), ("ANZ-3", 1, "pending")]


def test_concurrent_senders_get_gap_free_increasing_sequences(anz):
    errors = []

    def burst(sender: str) -> None:
        try:
            for _ in range(25):
                _send(anz, sender=sender)
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=burst, args=(f"ANZ-{10 + i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(Delivery.objects.filter(recipient="ANZ-2").values_list("seq", flat=True)) == list(range(1, 201))
    assert Mailbox.objects.get(user_id="ANZ-2").last_seq == 200


def test_a_rolled_back_message_leaves_no_hole_in_the_mailbox(anz):
    _send(anz)
    with pytest.raises(RuntimeError), transaction.atomic():
        _send(anz)
        raise RuntimeError("the caller's transaction failed")
    _send(anz)
    assert list(Delivery.objects.order_by("seq").values_list("seq", flat=True)) == [1, 2]


def test_a_repeated_client_message_id_is_stored_once(anz):
    first = _send(anz, client_message_id="abc")
    again = _send(anz, client_message_id="abc")
    other_sender = _send(anz, sender="ANZ-9", client_message_id="abc")
    assert again.duplicate and again.message_id == first.message_id and again.delivery_ids == ()
    assert not other_sender.duplicate
    assert Message.objects.count() == 2


def test_claim_then_delivered_with_one_confirmation_even_if_reported_twice(anz):
    sent = _send(anz, reference="r-1", confirmation_requested=True)
    claimed = deliveries_claim(delivery_ids=list(sent.delivery_ids))
    assert [(c.delivery_id, c.recipient, c.reference) for c in claimed] == [(sent.delivery_ids[0], "ANZ-2", "r-1")]
    assert deliveries_claim(delivery_ids=list(sent.delivery_ids)) == []  # already taken
    row = Delivery.objects.get(pk=sent.delivery_ids[0])
    assert (row.state, row.attempts) == ("sent", 1)
    assert deliveries_mark_delivered(delivery_ids=list(sent.delivery_ids)) == 1
    assert deliveries_mark_delivered(delivery_ids=list(sent.delivery_ids)) == 0
    confirmation = Delivery.objects.get(recipient="ANZ-1")
    assert (confirmation.message.kind, confirmation.message.reference) == ("confirmation", "r-1")


def test_failed_pushes_back_off_and_become_dead_letters_after_max_attempts(anz):
    sent = _send(anz)
    ids = list(sent.delivery_ids)
    waits = []
    for attempt in range(1, 4):
        Delivery.objects.filter(pk__in=ids).update(state="retrying")
        deliveries_claim(delivery_ids=ids)
        before = timezone.now()
        deliveries_retry(delivery_ids=ids, error="push failed")
        row = Delivery.objects.get(pk=ids[0])
        if attempt < 3:
            assert row.state == "retrying" and row.attempts == attempt
            waits.append((row.next_attempt_at - before).total_seconds())
        else:
            assert row.state == "dead" and row.dead_at is not None and row.last_error == "push failed"
    # exponential with jitter: attempt n waits between base*2^(n-1)/2 and base*2^(n-1) (base 2 s)
    assert 0.9 <= waits[0] <= 2.1 and 1.9 <= waits[1] <= 4.1


def test_the_sweep_times_out_unconfirmed_pushes_and_hands_out_due_retries(anz):
    sent = _send(anz)
    ids = list(sent.delivery_ids)
    deliveries_claim(delivery_ids=ids)
    Delivery.objects.filter(pk__in=ids).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    first = deliveries_sweep()
    assert first.timed_out == 1 and first.due == []
    Delivery.objects.filter(pk__in=ids).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert deliveries_sweep().due == ids


def test_undelivered_messages_expire_after_the_apps_retention(anz):
    old = _send(anz)
    fresh = _send(anz)
    Delivery.objects.filter(pk__in=old.delivery_ids).update(created_at=timezone.now() - timedelta(days=31))
    assert deliveries_expire() == 1
    assert Delivery.objects.get(pk=old.delivery_ids[0]).state == "expired"
    assert Delivery.objects.get(pk=fresh.delivery_ids[0]).state == "pending"


def test_operators_requeue_or_discard_dead_letters(anz):
    a, b = _send(anz), _send(anz)
    Delivery.objects.update(state="dead", attempts=3)
    assert dead_letters_requeue(delivery_ids=list(a.delivery_ids)) == 1
    row = Delivery.objects.get(pk=a.delivery_ids[0])
    assert (row.state, row.attempts) == ("pending", 0)
    assert dead_letters_discard(delivery_ids=list(b.delivery_ids)) == 1
    assert Delivery.objects.get(pk=b.delivery_ids[0]).state == "expired"
    assert dead_letters_discard(delivery_ids=list(a.delivery_ids)) == 0  # only dead ones


def test_fetch_returns_the_oldest_undelivered_in_mailbox_order_and_counts_the_rest(anz):
    for _ in range(7):
        _send(anz)
    Delivery.objects.filter(seq=2).update(state="delivered")
    batch = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=3, skip_ids=[], acks=False)
    assert [Delivery.objects.get(pk=i.delivery_id).seq for i in batch.items] == [1, 3, 4]
    assert batch.left == 3
    skipping = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=3, skip_ids=[i.delivery_id for i in batch.items],
                             acks=False)
    assert [Delivery.objects.get(pk=i.delivery_id).seq for i in skipping.items] == [5, 6, 7]
    assert skipping.left == 0
