"""The delivery state machine: pending -> sent -> delivered, with retrying / dead / expired.

Every transition is one conditional statement whose WHERE clause names the states it may leave
(and, for a claimed row, the claim it acts for), so two actors racing (a worker claiming while a
fetch delivers, a duplicate task after a worker crash, a late park after a re-claim) cannot move a
row backwards: the loser's statement simply matches nothing. What the row's timer and `attempts`
mean is written in messaging.models.

Batch transitions lock their rows by primary key, in id order, before they update them: two
batches never deadlock on deliveries, and (for a recipient, seq order is id order) a fetch locking
a mailbox in seq order takes the same order. Confirmations are written in the statement that marks
their deliveries delivered, locking the senders' mailboxes in (app, user) order after the
deliveries: every statement that takes both kinds of lock takes them in that one global order.

A single UPDATE with both `id = ANY(ids)` and a state condition let Postgres drive the plan from a
state index whenever its statistics said "few undelivered rows", and under a backlog that meant
scanning every undelivered row to find a handful of ids. Locking by primary key first has one plan.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from foundation.db import hot_cursor
from messaging.models import (
    CLAIMABLE_STATES,
    DELIVERABLE_STATES,
    EXPIRABLE_STATES,
    UNDELIVERED_STATES,
    DeliveryState,
    MessageKind,
    WebhookEvent,
    states_sql,
)
from messaging.services.persist import mailbox_append_sql
from messaging.webhooks.services import WebhookNotice, webhooks_record

PENDING = states_sql(DeliveryState.PENDING)
SENT = states_sql(DeliveryState.SENT)
RETRYING = states_sql(DeliveryState.RETRYING)
DELIVERED = states_sql(DeliveryState.DELIVERED)
DEAD = states_sql(DeliveryState.DEAD)
EXPIRED = states_sql(DeliveryState.EXPIRED)
UNDELIVERED = states_sql(UNDELIVERED_STATES)
CLAIMABLE = states_sql(CLAIMABLE_STATES)
DELIVERABLE = states_sql(DELIVERABLE_STATES)
EXPIRABLE = states_sql(EXPIRABLE_STATES)

# Backoff of the next attempt after `attempts` failures: base x 2^(attempts-1), capped, with jitter.
_BACKOFF = ("make_interval(secs => least(%(max_backoff)s, %(base_backoff)s * power(2, greatest({attempts} - 1, 0)))"
            " * (0.5 + random() * 0.5))")


def claim_token() -> int:
    """A fresh claim token (63 random bits: fits a bigint, never collides in practice)."""
    return secrets.randbits(63)


def _lock_sql(where: str) -> str:
    return f"SELECT id FROM messaging_delivery WHERE {where} ORDER BY id FOR UPDATE"


@dataclass(frozen=True)
class ClaimedRow:
    delivery_id: int
    recipient: str
    seq: int
    message_id: int
    sender: str
    kind: str
    content: str
    reference: str
    stored_at: float  # epoch seconds


def deliveries_claim(*, delivery_ids: list[int], token: int) -> list[ClaimedRow]:
    """pending/retrying -> sent under `token` for the rows this caller wins; returns them with
    what is needed to build their frames. No attempt is counted: only a failure counts.

    One statement: rows are locked by primary key in id order (two overlapping batches cannot
    deadlock, and a duplicate task after a worker crash finds them already `sent`), then updated.
    """
    if not delivery_ids:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({_lock_sql("id = ANY(%(ids)s::bigint[])")}),
            claimed AS (
                UPDATE messaging_delivery d
                   SET state = {SENT}, claim = %(token)s, sent_at = now(),
                       next_attempt_at = now() + make_interval(secs => %(ack)s)
                  FROM locked l
                 WHERE d.id = l.id AND d.state IN {CLAIMABLE}
                RETURNING d.id, d.recipient, d.seq, d.message_id
            )
            SELECT c.id, c.recipient, c.seq, m.id, m.sender, m.kind, m.content, m.reference,
                   extract(epoch FROM m.created_at)::float8
              FROM claimed c JOIN messaging_message m ON m.id = c.message_id
            """,
            {"ids": sorted(set(delivery_ids)), "token": token, "ack": float(settings.DELIVERY_ACK_TIMEOUT)},
        )
        return [ClaimedRow(*row) for row in cur.fetchall()]


def _claimed_update(set_sql: str, pairs: list[tuple[int, int]], extra: dict | None = None,
                    returning: str = "d.id") -> list:
    """Apply `set_sql` to rows still `sent` under the claim named for them; returns the ids moved
    (or the `returning` columns of each)."""
    if not pairs:
        return []
    ids = [p[0] for p in pairs]
    tokens = [p[1] for p in pairs]
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH wanted AS (SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS t(id, claim)),
            locked AS MATERIALIZED ({_lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d SET {set_sql}
              FROM locked l, wanted w, apps_registry_clientapp a
             WHERE d.id = l.id AND w.id = d.id AND a.id = d.app_id AND d.state = {SENT} AND d.claim = w.claim
            RETURNING {returning}
            """,
            {"ids": ids, "tokens": tokens, **(extra or {})},
        )
        rows = cur.fetchall()
    return [row[0] for row in rows] if returning == "d.id" else rows


def deliveries_park(*, claims: list[tuple[int, int]]) -> list[int]:
    """(delivery id, claim token) pairs whose recipient is offline: back to the mailbox, parked
    (no timer) until a fetch. Being offline is not a failed attempt."""
    return _claimed_update(f"state = {PENDING}, next_attempt_at = NULL, claim = NULL", claims)


def deliveries_release(*, claims: list[tuple[int, int]], park: bool = True) -> list[int]:
    """Claimed rows that were never handed to their reader: no attempt counted.

    `park`: the reader went away (a socket closed before the frame left the node, or before its
    ACK): retrying without a timer, waiting for the recipient's next ACK-mode connection (which
    gets it pushed again, with the same id) or a fetch. Otherwise (Redis away after the claim:
    the push could not be made at all) pending and due for routing at once.
    """
    if park:
        return _claimed_update(f"state = {RETRYING}, next_attempt_at = NULL, claim = NULL", claims)
    return _claimed_update(f"state = {PENDING}, next_attempt_at = now(), claim = NULL", claims)


# What a transition returns about each row it moved, enough to announce the dead ones.
_MOVED_COLUMNS = "d.id, d.state, d.app_id, d.message_id, d.recipient, d.attempts, d.last_error"


@dataclass(frozen=True)
class FailResult:
    failed: list[int]  # an attempt counted: retrying, or dead
    dead: list[int]  # ... of which used up their attempts


def deliveries_fail(*, claims: list[tuple[int, int]], error: str) -> FailResult:
    """A push that was made and failed: one attempt counted; retry with backoff, or dead letter
    once the app's max attempts are used (announced to the app's webhooks)."""
    rows = _claimed_update(_failure_set("d.attempts + 1", "%(error)s"), claims, {
        "error": error[:500], "base_backoff": float(settings.RETRY_BASE_SECONDS),
        "max_backoff": float(settings.RETRY_MAX_SECONDS)}, returning=_MOVED_COLUMNS)
    dead = [row for row in rows if row[1] == DeliveryState.DEAD.value]
    _dead_letters_announce(dead)
    return FailResult(failed=sorted(row[0] for row in rows), dead=sorted(row[0] for row in dead))


def _dead_letters_announce(rows: list[tuple]) -> None:
    """`message.dead_lettered` for the apps' webhooks, recorded once the transition is committed,
    in one statement for the batch. A failure there is logged, never undoes the transition."""
    if not rows:
        return
    notices = [WebhookNotice(app_id=app_id, event=WebhookEvent.MESSAGE_DEAD_LETTERED.value, data={
        "messageId": str(message_id), "deliveryId": str(delivery_id), "recipient": recipient,
        "attempts": attempts, "lastError": last_error,
    }) for delivery_id, _, app_id, message_id, recipient, attempts, last_error in rows]
    transaction.on_commit(lambda: webhooks_record(notices=notices), robust=True)


def _failure_set(attempts: str, error: str) -> str:
    backoff = _BACKOFF.format(attempts=attempts)
    return f"""
        attempts = {attempts}, claim = NULL, last_error = left({error}, 500),
        state = CASE WHEN {attempts} >= a.max_delivery_attempts THEN {DEAD} ELSE {RETRYING} END,
        dead_at = CASE WHEN {attempts} >= a.max_delivery_attempts THEN now() ELSE NULL END,
        next_attempt_at = CASE WHEN {attempts} >= a.max_delivery_attempts THEN NULL ELSE now() + {backoff} END"""


def deliveries_mark_delivered(*, delivery_ids: list[int] | None = None, message_ids: list[int] | None = None,
                              recipient: str | None = None) -> int:
    """-> delivered (by delivery id, or by message id for one recipient: an ACK), and store the
    MESSAGE_CONFIRMATIONs that were asked for, all in one statement. Returns how many rows changed.

    A delivery reported twice confirms once: only the statement that moves it writes a confirmation
    (and `confirms` is unique besides).
    """
    if delivery_ids:
        lock = _lock_sql("id = ANY(%(ids)s::bigint[])")
        params: dict = {"ids": sorted(set(delivery_ids))}
    elif message_ids and recipient:
        # Served by the message_id foreign-key index; only the recipient's own rows.
        lock = _lock_sql("message_id = ANY(%(mids)s::bigint[]) AND recipient = %(recipient)s")
        params = {"mids": sorted(set(message_ids)), "recipient": recipient}
    else:
        return 0
    direct, confirmation = MessageKind.DIRECT.value, MessageKind.CONFIRMATION.value
    # One statement in autocommit: it commits by itself, and on_commit runs right after it (or when
    # a caller's transaction commits).
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock}),
            done AS (
                UPDATE messaging_delivery d
                   SET state = {DELIVERED}, delivered_at = now(), next_attempt_at = NULL, claim = NULL
                  FROM locked l
                 WHERE d.id = l.id AND d.state IN {DELIVERABLE}
                RETURNING d.id, d.message_id, d.app_id, d.recipient
            ), conf AS MATERIALIZED (
                SELECT (row_number() OVER (ORDER BY m.app_id, m.sender, m.id))::int AS ord, m.app_id,
                       done.recipient AS sender, '{confirmation}'::text AS kind, ''::text AS content, m.reference,
                       false AS confirm, NULL::text AS cmid, ''::text AS origin, m.id AS confirms, m.sender AS to_user
                  FROM done JOIN messaging_message m ON m.id = done.message_id
                  JOIN apps_registry_clientapp a ON a.id = done.app_id
                 WHERE m.kind = '{direct}' AND m.confirmation_requested AND m.reference <> ''
                   AND a.confirmation_enabled
            ), conf_rcpt AS (
                SELECT ord, to_user AS recipient FROM conf
            ), {mailbox_append_sql("conf", "conf_rcpt")}
            SELECT (SELECT count(*) FROM done), ARRAY(SELECT id FROM new_deliveries ORDER BY id)
            """,
            params,
        )
        changed, confirmation_ids = cur.fetchone()
        if confirmation_ids:
            from messaging.dispatch import routing_enqueue

            ids = list(confirmation_ids)
            transaction.on_commit(lambda: routing_enqueue(ids))
    return int(changed)


@dataclass(frozen=True)
class SweepResult:
    timed_out: list[int]  # pushes not confirmed in time: an attempt counted
    dead: list[int]  # ... of which used up their attempts
    due: list[int]  # handed to routing under a lease: retries due, and rows whose routing never came


def deliveries_sweep(*, limit: int = 5000) -> SweepResult:
    """Act on every undelivered row whose timer ran out, in one statement that also leases what it
    hands out (served by the partial index delivery_timer_due):

    - sent: the push was not confirmed (written or ACKed) in time: a failed attempt; retrying with
      backoff, or dead;
    - retrying (due) and pending (routing deadline passed: the routing task was lost or is late):
      handed to routing, and their timer moved ROUTING_LEASE_SECONDS ahead, so while the routing
      queue is behind, the next sweeps do not hand the same rows out again.

    SKIP LOCKED: two sweeps (overlapping beat ticks, a manual run) never take the same row, and a
    row a worker holds right now is left to it.
    """
    backoff = _BACKOFF.format(attempts="d.attempts + 1")
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH due AS MATERIALIZED (
                SELECT id, state FROM messaging_delivery
                 WHERE state IN {UNDELIVERED} AND next_attempt_at IS NOT NULL AND next_attempt_at <= now()
                 ORDER BY next_attempt_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
            )
            UPDATE messaging_delivery d SET
                   attempts = CASE WHEN due.state = {SENT} THEN d.attempts + 1 ELSE d.attempts END,
                   state = CASE WHEN due.state <> {SENT} THEN d.state
                                WHEN d.attempts + 1 >= a.max_delivery_attempts THEN {DEAD} ELSE {RETRYING} END,
                   dead_at = CASE WHEN due.state = {SENT} AND d.attempts + 1 >= a.max_delivery_attempts
                                  THEN now() ELSE d.dead_at END,
                   next_attempt_at = CASE
                       WHEN due.state <> {SENT} THEN now() + make_interval(secs => %(lease)s)
                       WHEN d.attempts + 1 >= a.max_delivery_attempts THEN NULL
                       ELSE now() + {backoff} END,
                   claim = CASE WHEN due.state = {SENT} THEN NULL ELSE d.claim END,
                   last_error = CASE WHEN due.state = {SENT} THEN %(timeout_error)s ELSE d.last_error END
              FROM due, apps_registry_clientapp a
             WHERE d.id = due.id AND a.id = d.app_id
            RETURNING due.state, {_MOVED_COLUMNS}
            """,
            {"limit": limit, "lease": float(settings.ROUTING_LEASE_SECONDS),
             "base_backoff": float(settings.RETRY_BASE_SECONDS), "max_backoff": float(settings.RETRY_MAX_SECONDS),
             "timeout_error": f"not confirmed within {settings.DELIVERY_ACK_TIMEOUT} s"},
        )
        rows = cur.fetchall()
    sent = DeliveryState.SENT.value
    died = [r[1:] for r in rows if r[0] == sent and r[2] == DeliveryState.DEAD.value]
    _dead_letters_announce(died)
    return SweepResult(
        timed_out=sorted(r[1] for r in rows if r[0] == sent),
        dead=sorted(r[0] for r in died),
        due=sorted(r[1] for r in rows if r[0] != sent),
    )


def deliveries_requeue_for_users(*, users: list[tuple[int, str]]) -> list[int]:
    """In-flight pushes to users whose connections died with a node: retrying, due now, no attempt
    counted (the node died, not the delivery). The users' mailbox index serves the lookup."""
    if not users:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH u AS (SELECT * FROM unnest(%s::bigint[], %s::text[]) AS t(app_id, user_id)),
            locked AS MATERIALIZED (
                SELECT d.id FROM messaging_delivery d JOIN u ON d.app_id = u.app_id AND d.recipient = u.user_id
                 WHERE d.state = {SENT} ORDER BY d.id FOR UPDATE
            )
            UPDATE messaging_delivery d SET state = {RETRYING}, next_attempt_at = now(), claim = NULL,
                   last_error = 'the node holding the connection died before confirming'
              FROM locked l WHERE d.id = l.id AND d.state = {SENT}
            RETURNING d.id
            """,
            [[u[0] for u in users], [u[1] for u in users]],
        )
        return sorted(row[0] for row in cur.fetchall())


def deliveries_unacked_for(*, app_id: int, user_id: str) -> list[int]:
    """What an ACK-mode user was sent but never acknowledged (given back by its closed connection, or
    left `sent` by a crashed node) and retries waiting for it: redelivered on reconnect, with the
    same ids, no attempt counted."""
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED (
                {_lock_sql(f"app_id = %s AND recipient = %s AND state IN ({SENT}, {RETRYING})")}
            )
            UPDATE messaging_delivery d SET state = {RETRYING}, next_attempt_at = now(), claim = NULL
              FROM locked l WHERE d.id = l.id AND d.state IN ({SENT}, {RETRYING})
            RETURNING d.id
            """,
            [app_id, user_id],
        )
        return sorted(row[0] for row in cur.fetchall())


def deliveries_expire() -> int:
    """Undelivered rows older than their app's retention become expired."""
    with connection.cursor() as cur:  # hourly: nothing to gain from preparing it
        cur.execute(
            f"""
            UPDATE messaging_delivery d SET state = {EXPIRED}, expired_at = now(), next_attempt_at = NULL, claim = NULL
              FROM apps_registry_clientapp a
             WHERE a.id = d.app_id AND d.state IN {EXPIRABLE}
               AND d.created_at < now() - make_interval(days => a.retention_days)
            """
        )
        return cur.rowcount
