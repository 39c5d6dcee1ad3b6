"""Where a webhook call is made, retried and dead-lettered.

A delivery is handed out (when recorded, re-queued, or found due by the sweep) under a claim token
with a lease, through the door of foundation.handoff, and the task
`messaging.tasks.webhook_deliver(id, claim)` then runs `WebhookSender` on the outbound skeleton
(foundation.outbound), one row, no lock (the claim owns the row):

1. takes the row over under a fresh claim, in one conditional statement: the row must still be
   pending or retrying under the claim it was handed out with. A duplicate of the task, or a late
   one after the sweep re-handed the row, finds nothing to do; a delivered row is never sent again;
2. takes one of its app's WEBHOOK_APP_CONCURRENCY slots (foundation.slots, across every webhook
   worker). None free: the row is put back, due again in WEBHOOK_BUSY_RETRY_SECONDS, and no attempt
   is counted (the skeleton's "not now"); so a slow receiver costs its own app's calls, never another app's;
3. POSTs the stored body, signed (messaging.webhooks.signing), through foundation.outgoing: refused
   for an address outside the public internet and OUTGOING_ALLOWED_NETWORKS, and cut off at
   WEBHOOK_TIMEOUT_SECONDS for the whole exchange however slowly the receiver answers; only the
   status and ERROR_BODY_BYTES of the answer are read;
4. records the outcome under its own claim: a 2xx answer is delivered; anything else (another
   status, a redirect, the deadline, a refused address or connection) is a failed attempt: retrying
   after `webhook_backoff()` (foundation.backoff's Backoff), or dead once WEBHOOK_MAX_ATTEMPTS have failed.

The hand-out's lease (webhook_lease_seconds) is well past one call's deadline, so the sweep never
hands a row to a second worker while the first still calls. The call's own deadline is what bounds
the task: Celery's time limits are not enforced by the threads pool the workers run.

The beat's sweep hands out again, under a new claim, every open row whose timer ran out: retries
that are due, and rows whose task was lost (their lease passed). SKIP LOCKED keeps two sweeps off
the same rows. A worker that dies after the receiver got the call but before the outcome was
written makes the call happen again: delivery is at least once, and the body's "id" (also the
Switchboard-Delivery header) lets a receiver drop a repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from django.db import connection, transaction

from foundation.backoff import Backoff
from foundation.outbound import (
    Batch,
    CallFailed,
    Failed,
    Limits,
    NotNow,
    Settled,
    claim_token,
    out_of_attempts,
    send_batches,
)
from foundation.outgoing import SYNC_GRACE_SECONDS, Answer, OutgoingError, outgoing_client, outgoing_post, run_outgoing
from foundation.slots import slot_release, slot_take
from messaging.webhooks import metrics
from messaging.webhooks.models import PUSHER_EVENT_PREFIX, WEBHOOK_OPEN_STATES, WebhookState, webhook_states_sql
from messaging.webhooks.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, signature_header

log = logging.getLogger(__name__)

OPEN = webhook_states_sql(WEBHOOK_OPEN_STATES)
DELIVERED = webhook_states_sql(WebhookState.DELIVERED)
RETRYING = webhook_states_sql(WebhookState.RETRYING)
DEAD = webhook_states_sql(WebhookState.DEAD)
USER_AGENT = "Switchboard-Webhooks/1"
ERROR_BODY_BYTES = 200  # of a refusing receiver's answer, kept in last_error; the rest is never read
CLIENT_MAX_CONNECTIONS = 100  # per worker process (its threads' calls share one pool)
CLIENT_MAX_KEEPALIVE = 20


def webhook_lease_seconds() -> float:
    """How long a hand-out is left alone before the sweep hands the row out again: well past one
    call's whole-exchange deadline, so a slow receiver is not called twice at once."""
    return max(60.0, 3 * settings.WEBHOOK_TIMEOUT_SECONDS)


def webhook_slot_seconds() -> float:
    """How long an app's concurrency slot is held at most: past the call's deadline, so it expires
    (frees itself) only when the worker that took it died."""
    return settings.WEBHOOK_TIMEOUT_SECONDS + SYNC_GRACE_SECONDS + 30


def webhook_backoff() -> Backoff:
    """The wait before a call's next attempt: WEBHOOK_RETRY_BASE_SECONDS doubling per failure, at most
    WEBHOOK_RETRY_MAX_SECONDS, less up to half (so a receiver that was down is not hit by every
    retry at once)."""
    return Backoff(settings.WEBHOOK_RETRY_BASE_SECONDS, settings.WEBHOOK_RETRY_MAX_SECONDS, jitter=0.5)


# --- one attempt ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claimed:
    app_id: int
    url: str
    secret: str
    event: str
    payload: dict
    attempts: int
    pusher_key: str = ""  # the app's Pusher credentials: Pusher-format events are signed with them
    pusher_secret: str = ""


def _take_over(delivery_id: str, claim: int, new_claim: int) -> Claimed | None:
    with connection.cursor() as cur:
        cur.execute(
            f"""
            WITH target AS (
                SELECT w.id, coalesce(e.app_id, r.app_id) AS app_id, coalesce(e.url, r.webhook_url) AS url,
                       coalesce(e.secret, r.webhook_secret) AS secret, coalesce(pc.key, '') AS pusher_key,
                       coalesce(pc.secret, '') AS pusher_secret
                  FROM messaging_webhookdelivery w
                  LEFT JOIN messaging_webhookendpoint e ON e.id = w.endpoint_id
                  LEFT JOIN apps_registry_requestendpoint r ON r.id = w.request_endpoint_id
                  LEFT JOIN apps_registry_pushercredentials pc ON pc.app_id = e.app_id
                 WHERE w.id = %s
            )
            UPDATE messaging_webhookdelivery w SET claim = %s, next_attempt_at = now() + make_interval(secs => %s)
              FROM target t
             WHERE w.id = t.id AND w.claim = %s AND w.state IN {OPEN}
            RETURNING t.app_id, t.url, t.secret, w.event, w.payload, w.attempts, t.pusher_key, t.pusher_secret
            """,
            [delivery_id, new_claim, webhook_lease_seconds(), claim],
        )
        row = cur.fetchone()
    if row is None:
        return None
    payload = row[4] if isinstance(row[4], dict) else json.loads(row[4])
    return Claimed(app_id=row[0], url=row[1], secret=row[2], event=row[3], payload=payload, attempts=row[5],
                   pusher_key=row[6], pusher_secret=row[7])


def _put_back(delivery_id: str, claim: int) -> bool:
    """Its app has every slot taken: due again shortly, no attempt counted, for the sweep."""
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery SET claim = NULL, next_attempt_at = now() + make_interval(secs => %s)
             WHERE id = %s AND claim = %s AND state IN {OPEN}
            """,
            [settings.WEBHOOK_BUSY_RETRY_SECONDS, delivery_id, claim],
        )
        return cur.rowcount == 1


async def post(url: str, body: bytes, headers: dict[str, str], deadline: float, max_bytes: int, *,
               keepalive: int = CLIENT_MAX_KEEPALIVE) -> Answer:
    """POST on this loop's webhook client; `keepalive`: connections it keeps open (a web node making
    its requests' calls keeps as many as it makes at once, so a busy receiver is not reconnected to)."""
    client = outgoing_client(f"webhooks-{keepalive}", max_connections=max(CLIENT_MAX_CONNECTIONS, keepalive),
                             max_keepalive=keepalive)
    return await outgoing_post(client, url, content=body, headers=headers, deadline=deadline, max_bytes=max_bytes)


class AnswerReader(Protocol):
    """What an event's calls do with the receiver's answer, in the transaction that records it (a
    request's webhook answers in its response: messaging.requests.webhook). Given to the sender by
    the task that runs it, from the room above."""

    answer_bytes: int  # how much of a 2xx answer is read (the rest cuts the answer off)

    def answered_many(self, answers: list[tuple[dict, bytes, bool]]) -> None: ...  # (payload, body, complete)

    def dead(self, *, payload: dict, error: str) -> None: ...


def call_prepared(claimed: Claimed, delivery_id: str) -> tuple[bytes, dict[str, str]] | str:
    """The call's body and signed headers, or why it may not be made at all."""
    if claimed.url.lower().startswith("http://") and not settings.WEBHOOKS_ALLOW_HTTP:
        return "plain http:// endpoints are not allowed here (WEBHOOKS_ALLOW_HTTP is off)"
    if claimed.event.startswith(PUSHER_EVENT_PREFIX):
        return pusher_call(claimed)
    body = json.dumps(claimed.payload, separators=(",", ":"), ensure_ascii=False).encode()
    return body, {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        EVENT_HEADER: claimed.event,
        DELIVERY_HEADER: delivery_id,
        SIGNATURE_HEADER: signature_header(secret=claimed.secret, body=body),
    }


def pusher_call(claimed: Claimed) -> tuple[bytes, dict[str, str]] | str:
    """A Pusher-format call (pusher.com's webhooks): `{"time_ms", "events": [{"name", ...}]}`, with
    `X-Pusher-Key` and `X-Pusher-Signature`, the hex HMAC-SHA256 of the body with the app's Pusher
    secret. The same body on every attempt (its time is when the event was recorded)."""
    if not claimed.pusher_secret:
        return "the app has no Pusher credentials to sign this Pusher webhook with"
    data = dict(claimed.payload.get("data") or {})
    time_ms = data.pop("time_ms", int(claimed.payload.get("created", 0)) * 1000)
    event = {"name": claimed.event[len(PUSHER_EVENT_PREFIX):], **data}
    body = json.dumps({"time_ms": time_ms, "events": [event]}, separators=(",", ":"), ensure_ascii=False).encode()
    return body, {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Pusher-Key": claimed.pusher_key,
        "X-Pusher-Signature": hmac.new(claimed.pusher_secret.encode(), body, hashlib.sha256).hexdigest(),
    }


def call_outcome(answer: Answer) -> tuple[int | None, str, Answer | None]:
    """(HTTP status, error text or "" on a 2xx, the answer)."""
    if 200 <= answer.status < 300:
        return answer.status, "", answer
    detail = answer.body[:ERROR_BODY_BYTES].decode(errors="replace").strip()
    return answer.status, f"HTTP {answer.status}" + (f": {detail}" if detail else ""), answer


def _call(claimed: Claimed, delivery_id: str, answer_bytes: int = ERROR_BODY_BYTES) -> tuple[int | None, str, Answer | None]:
    """POST the body; (HTTP status or None, error text or "" on a 2xx, the answer read up to `answer_bytes`)."""
    prepared = call_prepared(claimed, delivery_id)
    if isinstance(prepared, str):
        return None, prepared, None
    body, headers = prepared
    deadline = settings.WEBHOOK_TIMEOUT_SECONDS
    try:
        answer = run_outgoing(post(claimed.url, body, headers, deadline, answer_bytes), deadline)
    except OutgoingError as exc:
        return None, str(exc)[:500], None
    return call_outcome(answer)


def record_delivered(delivery_id: str, claim: int, status: int) -> bool:
    return str(delivery_id) in records_delivered([(delivery_id, claim, status)])


def records_delivered(calls: list[tuple[str, int, int]]) -> set[str]:
    """`record_delivered` for many (delivery id, claim, status) at once: the ids recorded."""
    if not calls:
        return set()
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery w
               SET state = {DELIVERED}, delivered_at = now(), next_attempt_at = NULL, claim = NULL,
                   last_status = k.status, last_error = ''
              FROM unnest(%s::uuid[], %s::bigint[], %s::int[]) AS k(id, claim, status)
             WHERE w.id = k.id AND w.claim = k.claim AND w.state IN {OPEN}
            RETURNING w.id
            """,
            [list(column) for column in zip(*calls, strict=True)],
        )
        return {str(row[0]) for row in cur.fetchall()}


def record_failed(delivery_id: str, claim: int, status: int | None, error: str) -> str | None:
    dies = out_of_attempts("attempts + 1", "%(max)s")
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery
               SET attempts = attempts + 1, claim = NULL, last_status = %(status)s, last_error = left(%(error)s, 500),
                   state = CASE WHEN {dies} THEN {DEAD} ELSE {RETRYING} END,
                   dead_at = CASE WHEN {dies} THEN now() ELSE NULL END,
                   next_attempt_at = CASE WHEN {dies} THEN NULL ELSE now() + {webhook_backoff().sql("attempts + 1")} END
             WHERE id = %(id)s AND claim = %(claim)s AND state IN {OPEN}
            RETURNING state
            """,
            {"status": status, "error": error, "max": settings.WEBHOOK_MAX_ATTEMPTS, "id": delivery_id,
             "claim": claim},
        )
        row = cur.fetchone()
    return row[0] if row else None


class WebhookSender:
    """One handed-out webhook call on the outbound skeleton. No lock: the claim it was handed out
    under owns the row, and its app's slots (foundation.slots) bound the calls in flight."""

    name = "webhook"
    lock_key = None

    def __init__(self, delivery_id: str, claim: int, readers: Mapping[str, AnswerReader] | None = None):
        self.delivery_id = delivery_id
        self.claim = claim
        self.own_claim = claim_token()
        self.outcome = "skipped"
        self.claimed: Claimed | None = None
        self.readers = readers or {}
        self.answer: Answer | None = None

    def limits(self) -> Limits:
        return Limits(rows=1, bytes=0)

    def held_back(self) -> bool:
        return False  # a row's own timer held it back until the sweep handed it out

    def take(self, limits: Limits) -> Batch[Claimed]:
        self.claimed = _take_over(self.delivery_id, self.claim, self.own_claim)
        return Batch(items=[self.claimed] if self.claimed else [])

    def send(self, batch: Batch[Claimed]) -> int:
        claimed = batch.items[0]
        slot_name = f"webhooks:app:{claimed.app_id}"
        slot = slot_take(slot_name, cap=settings.WEBHOOK_APP_CONCURRENCY, ttl=webhook_slot_seconds())
        if slot is None:
            raise NotNow(f"app {claimed.app_id} has {settings.WEBHOOK_APP_CONCURRENCY} calls in flight")
        reader = self.readers.get(claimed.event)
        try:
            status, error, self.answer = _call(claimed, self.delivery_id,
                                               reader.answer_bytes if reader else ERROR_BODY_BYTES)
        finally:
            slot_release(slot_name, slot)
        if error:
            raise CallFailed(error, status)
        return status

    def settle(self, batch: Batch[Claimed], status: int) -> Settled:
        claimed = batch.items[0]
        reader = self.readers.get(claimed.event)
        with transaction.atomic():  # the answer is read once: with the record of the call, or not at all
            if not record_delivered(self.delivery_id, self.own_claim, status):
                return Settled()
            if reader is not None and self.answer is not None:
                reader.answered_many([(claimed.payload, self.answer.body, self.answer.complete)])
        self.outcome = WebhookState.DELIVERED.value
        return Settled(sent=1)

    def fail(self, batch: Batch[Claimed], error: CallFailed) -> Failed:
        claimed = batch.items[0]
        reader = self.readers.get(claimed.event)
        with transaction.atomic():  # a dead call's consequence commits with it
            state = record_failed(self.delivery_id, self.own_claim, error.status, error.reason)
            if state == WebhookState.DEAD and reader is not None:
                reader.dead(payload=claimed.payload, error=error.reason)
        self.outcome = state or "skipped"
        if state == WebhookState.DEAD:
            log.warning("webhook %s (%s) to %s is dead after %d attempts: %s", self.delivery_id, claimed.event,
                        claimed.url, claimed.attempts + 1, error.reason)
        return Failed(failed=1 if state else 0, dead=1 if state == WebhookState.DEAD else 0)

    def give_up(self, refused: list) -> int:
        return 0

    def put_back(self, batch: Batch[Claimed]) -> None:
        self.outcome = "busy" if _put_back(self.delivery_id, self.own_claim) else "skipped"


def webhook_attempt(*, delivery_id: str, claim: int, readers: Mapping[str, AnswerReader] | None = None) -> str:
    """Make one attempt of a handed-out delivery. Returns what became of it: "delivered",
    "retrying", "dead", or "skipped" (not pending or retrying under this claim any more: done,
    dead, or handed to someone else), or "busy" (put back: its app's calls in flight are at the cap).
    `readers`: what an event's answers mean (AnswerReader), by event."""
    sender = WebhookSender(delivery_id, claim, readers)
    send_batches(sender, max_batches=1)
    if sender.outcome not in ("skipped", "busy"):
        outcome = "failed" if sender.outcome == WebhookState.RETRYING else sender.outcome
        metrics.WEBHOOKS.labels(sender.claimed.event, outcome).inc()
    return sender.outcome


# --- the sweep and retention ---------------------------------------------------------------------


def webhooks_sweep(*, limit: int = 1000) -> tuple[list[str], int]:
    """Hand out again every open delivery whose timer ran out (due retries, lost tasks), under one
    new claim; returns (ids, claim) for the caller to send. Served by the partial index
    webhook_delivery_due."""
    claim = claim_token()
    with connection.cursor() as cur:
        cur.execute(
            f"""
            WITH due AS MATERIALIZED (
                SELECT id FROM messaging_webhookdelivery
                 WHERE state IN {OPEN} AND next_attempt_at <= now()
                 ORDER BY next_attempt_at LIMIT %s FOR UPDATE SKIP LOCKED
            )
            UPDATE messaging_webhookdelivery w SET claim = %s, next_attempt_at = now() + make_interval(secs => %s)
              FROM due WHERE w.id = due.id
            RETURNING w.id
            """,
            [limit, claim, webhook_lease_seconds()],
        )
        return [str(row[0]) for row in cur.fetchall()], claim


def webhook_deliveries_purge(*, batch: int = 10_000) -> int:
    """Delivery records older than WEBHOOK_RETENTION_DAYS go, oldest first, a batch per statement
    (served by webhook_delivery_recent), so a large purge never holds one long lock."""
    total = 0
    while True:
        with connection.cursor() as cur:
            cur.execute(
                """
                DELETE FROM messaging_webhookdelivery WHERE id IN (
                    SELECT id FROM messaging_webhookdelivery
                     WHERE created_at < now() - make_interval(days => %s) ORDER BY created_at LIMIT %s)
                """,
                [settings.WEBHOOK_RETENTION_DAYS, batch],
            )
            total += cur.rowcount
            if cur.rowcount < batch:
                return total
