"""The delivery state machine and mailbox guarantees, on the real Postgres."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from foundation.outbound import claim_token
from messaging.core.delivery.claims import (
    deliveries_claim,
    deliveries_park,
    deliveries_release,
    deliveries_unacked_for,
)
from messaging.core.delivery.dead_letters import dead_letters_discard, dead_letters_requeue
from messaging.core.delivery.delivered import deliveries_mark_delivered
from messaging.core.delivery.expiry import deliveries_expire
from messaging.core.delivery.fetch import missing_fetch
from messaging.core.delivery.retry import deliveries_fail, deliveries_sweep
from messaging.core.store import OutgoingMessage, message_send, messages_store
from messaging.models import UNDELIVERED_STATES, Delivery, DeliveryState, Mailbox, Message
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def anz():
    return make_app(max_delivery_attempts=3)


def _send(app, to="ANZ-2", sender="ANZ-1", **kw):
    return message_send(app_id=app.pk, sender=sender, recipients=[to], content="hi", **kw)


def _row(delivery_id: int) -> Delivery:
    return Delivery.objects.get(pk=delivery_id)


def _expire_timer(ids) -> None:
    Delivery.objects.filter(pk__in=ids).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


# --- storing -------------------------------------------------------------------------------------


def test_a_message_and_its_deliveries_are_stored_together_with_mailbox_sequences(anz):
    result = message_send(app_id=anz.pk, sender="ANZ-1", recipients=["ANZ-3", "ANZ-2", "ANZ-2"], content="x",
                          kind="group")
    assert len(result.delivery_ids) == 2
    assert sorted(Delivery.objects.values_list("recipient", "seq", "state")) == [
        ("ANZ-2", 1, "pending"), ("ANZ-3", 1, "pending")]


def test_a_batch_of_messages_takes_each_recipients_sequence_numbers_in_the_order_sent(anz):
    batch = [OutgoingMessage(app_id=anz.pk, sender=f"ANZ-{10 + i}", recipients=("ANZ-2", f"ANZ-{30 + i % 2}"),
                             content=f"m{i}") for i in range(6)]
    results = messages_store(messages=batch)
    assert [r.duplicate for r in results] == [False] * 6
    inbox = list(Delivery.objects.filter(recipient="ANZ-2").order_by("seq").values_list("seq", "message__content"))
    assert inbox == [(i + 1, f"m{i}") for i in range(6)]
    assert list(Delivery.objects.filter(recipient="ANZ-31").order_by("seq").values_list("seq", "message__content")) \
        == [(1, "m1"), (2, "m3"), (3, "m5")]
    assert Mailbox.objects.get(user_id="ANZ-2").last_seq == 6


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


def test_a_repeated_client_message_id_is_stored_once_even_within_one_batch(anz):
    first = _send(anz, client_message_id="abc")
    again = _send(anz, client_message_id="abc")
    other_sender = _send(anz, sender="ANZ-9", client_message_id="abc")
    assert again.duplicate and again.message_id == first.message_id and again.delivery_ids == ()
    assert not other_sender.duplicate
    twice = messages_store(messages=[OutgoingMessage(app_id=anz.pk, sender="ANZ-5", recipients=("ANZ-2",),
                                                     content="x", client_message_id="same")] * 2)
    assert [r.duplicate for r in twice] == [False, True] and twice[0].message_id == twice[1].message_id
    assert Message.objects.count() == 3
    assert Mailbox.objects.get(user_id="ANZ-2").last_seq == 3  # the repeats took no sequence number


def test_a_new_delivery_carries_a_routing_deadline_so_a_lost_routing_task_cannot_strand_it(anz):
    sent = _send(anz)
    row = _row(sent.delivery_ids[0])
    assert row.state == "pending" and row.next_attempt_at > timezone.now()


# --- claims, attempts and failures ---------------------------------------------------------------


def test_claim_then_delivered_with_one_confirmation_even_if_reported_twice(anz):
    sent = _send(anz, reference="r-1", confirmation_requested=True)
    token = claim_token()
    claimed = deliveries_claim(delivery_ids=list(sent.delivery_ids), token=token)
    assert [(c.delivery_id, c.recipient, c.reference) for c in claimed] == [(sent.delivery_ids[0], "ANZ-2", "r-1")]
    assert deliveries_claim(delivery_ids=list(sent.delivery_ids), token=claim_token()) == []  # already taken
    row = _row(sent.delivery_ids[0])
    assert (row.state, row.attempts, row.claim) == ("sent", 0, token)  # a claim is not an attempt
    assert deliveries_mark_delivered(delivery_ids=list(sent.delivery_ids)) == 1
    assert deliveries_mark_delivered(delivery_ids=list(sent.delivery_ids)) == 0
    confirmation = Delivery.objects.get(recipient="ANZ-1")
    assert (confirmation.message.kind, confirmation.message.reference) == ("confirmation", "r-1")
    assert confirmation.message.confirms_id == sent.message_id and confirmation.message.client_message_id is None


def test_only_failed_attempts_count_and_they_back_off_until_the_message_is_a_dead_letter(anz):
    sent = _send(anz)
    ids = list(sent.delivery_ids)
    waits = []
    for attempt in range(1, 4):
        token = claim_token()
        assert deliveries_claim(delivery_ids=ids, token=token)
        before = timezone.now()
        deliveries_fail(claims=[(ids[0], token)], error="push failed")
        row = _row(ids[0])
        if attempt < 3:
            assert row.state == "retrying" and row.attempts == attempt
            waits.append((row.next_attempt_at - before).total_seconds())
        else:
            assert row.state == "dead" and row.dead_at is not None and row.last_error == "push failed"
    # exponential with jitter: attempt n waits between base*2^(n-1)/2 and base*2^(n-1) (base 2 s)
    assert 0.9 <= waits[0] <= 2.1 and 1.9 <= waits[1] <= 4.1


def test_an_offline_recipient_a_closed_socket_or_redis_being_away_is_never_counted_as_an_attempt(anz):
    sent = _send(anz)
    ids = list(sent.delivery_ids)
    for _ in range(5):  # more rounds than max attempts: a flapping mobile link
        token = claim_token()
        deliveries_claim(delivery_ids=ids, token=token)
        deliveries_park(claims=[(ids[0], token)])  # recipient offline
        token = claim_token()
        deliveries_claim(delivery_ids=ids, token=token)
        deliveries_release(claims=[(ids[0], token)], park=False)  # Redis away after the claim
        token = claim_token()
        missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=10, skip_ids=[], claim=token)  # ACK-mode fetch
        deliveries_release(claims=[(ids[0], token)])  # socket closed before the ACK
    row = _row(ids[0])
    assert (row.state, row.attempts, row.next_attempt_at) == ("retrying", 0, None)  # waits for its reader


def test_a_released_push_is_due_at_once_and_a_parked_one_waits_for_a_fetch_or_its_reader(anz):
    a, b, c = _send(anz), _send(anz), _send(anz)
    token = claim_token()
    deliveries_claim(delivery_ids=[*a.delivery_ids, *b.delivery_ids, *c.delivery_ids], token=token)
    deliveries_release(claims=[(a.delivery_ids[0], token)], park=False)  # the push could not be made
    deliveries_park(claims=[(b.delivery_ids[0], token)])  # recipient offline
    deliveries_release(claims=[(c.delivery_ids[0], token)])  # its socket closed before the client had it
    assert (_row(a.delivery_ids[0]).state, _row(a.delivery_ids[0]).next_attempt_at <= timezone.now()) == (
        "pending", True)
    assert (_row(b.delivery_ids[0]).state, _row(b.delivery_ids[0]).next_attempt_at) == ("pending", None)
    assert (_row(c.delivery_ids[0]).state, _row(c.delivery_ids[0]).next_attempt_at) == ("retrying", None)
    # the recipient's next ACK-mode connection gets what it was sent before, not what waited offline
    assert deliveries_unacked_for(app_id=anz.pk, user_id="ANZ-2") == [c.delivery_ids[0]]


def test_park_fail_and_release_never_act_on_a_row_someone_re_claimed_since(anz):
    sent = _send(anz)
    ids = list(sent.delivery_ids)
    old = claim_token()
    deliveries_claim(delivery_ids=ids, token=old)
    deliveries_release(claims=[(ids[0], old)], park=False)
    new = claim_token()
    deliveries_claim(delivery_ids=ids, token=new)  # another worker's claim
    assert deliveries_park(claims=[(ids[0], old)]) == []
    assert deliveries_fail(claims=[(ids[0], old)], error="late").failed == []
    assert deliveries_release(claims=[(ids[0], old)]) == []
    row = _row(ids[0])
    assert (row.state, row.claim, row.attempts) == ("sent", new, 0)


def test_unacked_deliveries_of_a_crashed_connection_come_again_without_counting_an_attempt(anz):
    sent = _send(anz)
    deliveries_claim(delivery_ids=list(sent.delivery_ids), token=claim_token())
    assert deliveries_unacked_for(app_id=anz.pk, user_id="ANZ-2") == list(sent.delivery_ids)
    row = _row(sent.delivery_ids[0])
    assert (row.state, row.attempts, row.claim) == ("retrying", 0, None)


# --- the sweep -----------------------------------------------------------------------------------


def test_the_sweep_counts_an_unconfirmed_push_as_a_failed_attempt(anz):
    sent = _send(anz)
    ids = list(sent.delivery_ids)
    deliveries_claim(delivery_ids=ids, token=claim_token())
    _expire_timer(ids)
    result = deliveries_sweep()
    assert result.timed_out == ids and result.due == []
    row = _row(ids[0])
    assert (row.state, row.attempts, row.claim) == ("retrying", 1, None)
    assert row.last_error.startswith("not confirmed within")


def test_the_sweep_leases_what_it_hands_out_so_a_slow_routing_queue_is_not_fed_twice(anz):
    retry, lost = _send(anz), _send(anz)
    token = claim_token()
    deliveries_claim(delivery_ids=list(retry.delivery_ids), token=token)
    deliveries_fail(claims=[(retry.delivery_ids[0], token)], error="push failed")
    _expire_timer([*retry.delivery_ids, *lost.delivery_ids])  # a due retry, and a routing task that never ran
    first = deliveries_sweep()
    assert first.due == sorted([*retry.delivery_ids, *lost.delivery_ids])
    # The routing queue is behind: nothing was claimed yet. The next ticks hand nothing out again.
    assert deliveries_sweep().due == []
    assert deliveries_sweep().due == []
    leased = _row(lost.delivery_ids[0]).next_attempt_at - timezone.now()
    assert timedelta(seconds=50) < leased <= timedelta(seconds=60)


def test_parked_mailboxes_of_offline_users_are_not_the_sweeps_business(anz):
    sent = _send(anz)
    token = claim_token()
    deliveries_claim(delivery_ids=list(sent.delivery_ids), token=token)
    deliveries_park(claims=[(sent.delivery_ids[0], token)])
    assert deliveries_sweep().due == []


def test_undelivered_messages_expire_after_the_apps_retention(anz):
    old = _send(anz)
    fresh = _send(anz)
    Delivery.objects.filter(pk__in=old.delivery_ids).update(created_at=timezone.now() - timedelta(days=31))
    assert deliveries_expire() == 1
    assert _row(old.delivery_ids[0]).state == "expired"
    assert _row(fresh.delivery_ids[0]).state == "pending"


def test_operators_requeue_or_discard_dead_letters_of_their_app_only(anz):
    other = make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    a, b = _send(anz), _send(anz)
    c = message_send(app_id=other.pk, sender="BNZ-1", recipients=["BNZ-2"], content="x")
    Delivery.objects.update(state="dead", attempts=3)
    assert dead_letters_requeue(delivery_ids=[*a.delivery_ids, *c.delivery_ids], app_id=anz.pk) == 1
    row = _row(a.delivery_ids[0])
    assert (row.state, row.attempts) == ("pending", 0)
    assert _row(c.delivery_ids[0]).state == "dead"  # another app's dead letter is out of reach
    assert dead_letters_discard(delivery_ids=list(b.delivery_ids)) == 1
    assert _row(b.delivery_ids[0]).state == "expired"
    assert dead_letters_discard(delivery_ids=list(a.delivery_ids)) == 0  # only dead ones


# --- fetch ---------------------------------------------------------------------------------------


def test_fetch_returns_the_oldest_undelivered_in_mailbox_order_and_counts_the_rest(anz):
    for _ in range(7):
        _send(anz)
    Delivery.objects.filter(seq=2).update(state="delivered")
    batch = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=3, skip_ids=[])
    assert [_row(i.delivery_id).seq for i in batch.items] == [1, 3, 4]
    assert batch.left == 3
    skipping = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=3, skip_ids=[i.delivery_id for i in batch.items])
    assert [_row(i.delivery_id).seq for i in skipping.items] == [5, 6, 7]
    assert skipping.left == 0


@pytest.mark.parametrize("ack_mode", [False, True])
def test_fetch_has_no_holes_while_a_worker_holds_a_row_of_the_mailbox(anz, ack_mode):
    sends = [_send(anz) for _ in range(4)]
    locked = threading.Event()

    def worker_holding_seq_2() -> None:
        try:
            with transaction.atomic():
                Delivery.objects.select_for_update().get(pk=sends[1].delivery_ids[0])
                locked.set()
                time.sleep(0.7)
        finally:
            connection.close()

    holder = threading.Thread(target=worker_holding_seq_2)
    holder.start()
    locked.wait(5)
    batch = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=3, skip_ids=[],
                          claim=claim_token() if ack_mode else None)
    holder.join()
    assert [_row(i.delivery_id).seq for i in batch.items] == [1, 2, 3]
    assert batch.left == 1


def test_fetch_stops_at_its_byte_budget_but_always_answers_one_message(anz):
    for i in range(5):
        message_send(app_id=anz.pk, sender="ANZ-1", recipients=["ANZ-2"], content=str(i) * 1000)
    batch = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=10, skip_ids=[], max_bytes=2500)
    assert len(batch.items) == 3 and batch.left == 2
    tiny = missing_fetch(app_id=anz.pk, user_id="ANZ-2", count=10, skip_ids=[], max_bytes=10)
    assert len(tiny.items) == 1 and tiny.left == 4


# --- confirmations -------------------------------------------------------------------------------


def test_concurrent_delivered_batches_confirming_to_the_same_senders_in_opposite_orders_never_deadlock(anz):
    senders = ["ANZ-71", "ANZ-72", "ANZ-73", "ANZ-74"]
    ids_by_sender = {s: [] for s in senders}
    for i in range(40):
        for sender in senders:
            sent = message_send(app_id=anz.pk, sender=sender, recipients=[f"ANZ-{500 + i}"], content="x",
                                reference=f"{sender}-{i}", confirmation_requested=True)
            ids_by_sender[sender].extend(sent.delivery_ids)
    forward = [d for i in range(40) for s in senders for d in ids_by_sender[s][i:i + 1]]
    backward = [d for i in range(40) for s in reversed(senders) for d in ids_by_sender[s][i:i + 1]]
    batches = [forward[k:k + 8] for k in range(0, len(forward), 8)] + \
              [backward[k:k + 8] for k in range(0, len(backward), 8)]
    errors: list[Exception] = []

    def mark(batch: list[int]) -> None:
        try:
            deliveries_mark_delivered(delivery_ids=batch)
        except Exception as exc:  # a deadlock would surface here
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=mark, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Delivery.objects.filter(pk__in=forward, state="delivered").count() == 160
    for sender in senders:
        confirmations = Delivery.objects.filter(recipient=sender, message__kind="confirmation")
        assert confirmations.count() == 40
        assert sorted(confirmations.values_list("seq", flat=True)) == list(range(1, 41))


def test_a_client_cannot_suppress_someone_elses_confirmation_with_a_forged_client_message_id(anz):
    original = _send(anz, reference="pay-1", confirmation_requested=True)
    # Another client sends a message whose clientMessageId looks like the old internal key.
    message_send(app_id=anz.pk, sender="ANZ-2", recipients=["ANZ-1"], content="forged",
                 client_message_id=f"~confirm:{original.message_id}")
    deliveries_mark_delivered(delivery_ids=list(original.delivery_ids))
    confirmation = Delivery.objects.get(recipient="ANZ-1", message__kind="confirmation")
    assert confirmation.message.reference == "pay-1"


# --- one source of truth for states --------------------------------------------------------------


def test_state_names_appear_in_sql_only_through_the_models_constants():
    literal = re.compile(r"'(" + "|".join(DeliveryState.values) + r")'")
    offenders = []
    for path in Path(__file__).resolve().parents[3].joinpath("messaging").rglob("*.py"):
        if "migrations" in path.parts or path.name == "models.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if literal.search(line):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []


def test_the_partial_indexes_cover_exactly_the_undelivered_states():
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'messaging_delivery'")
        definitions = dict(cur.fetchall())
    for name in ("delivery_undelivered_mailbox", "delivery_timer_due"):
        states = set(re.findall(r"'(\w+)'::", definitions[name]))
        assert states == set(UNDELIVERED_STATES), name


def test_no_index_on_the_message_tables_repeats_the_leading_columns_of_another():
    """Every state change of a delivery writes each of its indexes again, and every stored message
    writes each of its own: an index whose columns lead another one (same predicate) is pure cost."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT t.relname, i.relname, x.indisunique, x.indkey::int2[], coalesce(pg_get_expr(x.indpred, x.indrelid), '')
              FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
             WHERE t.relname IN ('messaging_message', 'messaging_delivery', 'messaging_mailbox')
            """
        )
        indexes = cur.fetchall()
    repeated = [
        (name, other)
        for table, name, unique, columns, predicate in indexes
        for table2, other, _, columns2, predicate2 in indexes
        if table == table2 and name != other and not unique and predicate == predicate2
        and len(columns) <= len(columns2) and columns2[:len(columns)] == columns
    ]
    assert repeated == []


def test_a_message_is_confirmed_at_most_once():
    app = make_app()
    [original] = messages_store(messages=[OutgoingMessage(app_id=app.pk, sender="ANZ-1", recipients=("ANZ-2",),
                                                          content="hi", reference="r1", confirmation_requested=True)])
    first = Message.objects.create(app=app, sender="ANZ-2", kind="confirmation", content="", confirms_id=original.message_id,
                                   created_at=timezone.now())
    with pytest.raises(Exception, match="message_confirmed_once"), transaction.atomic():
        Message.objects.create(app=app, sender="ANZ-2", kind="confirmation", content="",
                               confirms_id=original.message_id, created_at=timezone.now())
    assert Message.objects.filter(confirms_id=original.message_id).get() == first
