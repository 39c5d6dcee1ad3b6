"""Where a webhook call is made, retried and dead-lettered.

A delivery is handed out (when recorded, re-queued, or found due by the sweep) under a claim token
with a lease, through the door of messaging.handoff, and the task
`messaging.tasks.webhook_deliver(id, claim)` then:

1. takes the row over under a fresh claim, in one conditional statement: the row must still be
   pending or retrying under the claim it was handed out with. A duplicate of the task, or a late
   one after the sweep re-handed the row, finds nothing to do; a delivered row is never sent again;
2. POSTs the stored body, signed (messaging.webhooks.signing), with a timeout;
3. records the outcome under its own claim: a 2xx answer is delivered; anything else (another
   status, a redirect, a timeout, a refused connection) is a failed attempt: retrying after
   base x 2^(n-1) seconds (capped, with jitter), or dead once WEBHOOK_MAX_ATTEMPTS have failed.

The beat's sweep hands out again, under a new claim, every open row whose timer ran out: retries
that are due, and rows whose task was lost (their lease passed). SKIP LOCKED keeps two sweeps off
the same rows. A worker that dies after the receiver got the call but before the outcome was
written makes the call happen again: delivery is at least once, and the body's "id" (also the
Switchboard-Delivery header) lets a receiver drop a repeat.
"""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import connection

from messaging import metrics
from messaging.webhooks.models import WEBHOOK_OPEN_STATES, WebhookState, webhook_states_sql
from messaging.webhooks.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, signature_header

log = logging.getLogger(__name__)

OPEN = webhook_states_sql(WEBHOOK_OPEN_STATES)
DELIVERED = webhook_states_sql(WebhookState.DELIVERED)
RETRYING = webhook_states_sql(WebhookState.RETRYING)
DEAD = webhook_states_sql(WebhookState.DEAD)
USER_AGENT = "Switchboard-Webhooks/1"
ERROR_BODY_BYTES = 200  # of a refusing receiver's answer, kept in last_error


def webhook_claim_token() -> int:
    return secrets.randbits(63)


def webhook_lease_seconds() -> float:
    """How long a hand-out is left alone before the sweep hands the row out again: well past one
    call's timeout, so a slow receiver is not called twice at once."""
    return max(60.0, 3 * settings.WEBHOOK_TIMEOUT_SECONDS)


def webhook_backoff(attempts: int) -> float:
    """Seconds until the next attempt after `attempts` failures: base x 2^(attempts-1), capped at
    the maximum, times a random 0.5-1.0 so a receiver that was down is not hit by every retry at once."""
    base = settings.WEBHOOK_RETRY_BASE_SECONDS * 2 ** max(attempts - 1, 0)
    return min(settings.WEBHOOK_RETRY_MAX_SECONDS, base) * random.uniform(0.5, 1.0)


# --- one attempt ---------------------------------------------------------------------------------

_client: httpx.Client | None = None
_client_pid = 0


def _http_client() -> httpx.Client:
    """One client (and its connection pool) per worker process: keep-alive to a receiver across
    calls. A forked pool child makes its own rather than share its parent's sockets."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        _client = httpx.Client(follow_redirects=False, headers={"User-Agent": USER_AGENT},
                               limits=httpx.Limits(max_connections=20, max_keepalive_connections=10))
        _client_pid = os.getpid()
    return _client


@dataclass(frozen=True)
class _Claimed:
    url: str
    secret: str
    event: str
    payload: dict
    attempts: int


def _take_over(delivery_id: str, claim: int, new_claim: int) -> _Claimed | None:
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery w SET claim = %s, next_attempt_at = now() + make_interval(secs => %s)
              FROM messaging_webhookendpoint e
             WHERE w.id = %s AND w.claim = %s AND w.state IN {OPEN} AND e.id = w.endpoint_id
            RETURNING e.url, e.secret, w.event, w.payload, w.attempts
            """,
            [new_claim, webhook_lease_seconds(), delivery_id, claim],
        )
        row = cur.fetchone()
    if row is None:
        return None
    payload = row[3] if isinstance(row[3], dict) else json.loads(row[3])
    return _Claimed(url=row[0], secret=row[1], event=row[2], payload=payload, attempts=row[4])


def _call(claimed: _Claimed, delivery_id: str) -> tuple[int | None, str]:
    """POST the body; (HTTP status or None, error text or "" on a 2xx)."""
    if claimed.url.lower().startswith("http://") and not settings.WEBHOOKS_ALLOW_HTTP:
        return None, "plain http:// endpoints are not allowed here (WEBHOOKS_ALLOW_HTTP is off)"
    body = json.dumps(claimed.payload, separators=(",", ":"), ensure_ascii=False).encode()
    headers = {
        "Content-Type": "application/json",
        EVENT_HEADER: claimed.event,
        DELIVERY_HEADER: delivery_id,
        SIGNATURE_HEADER: signature_header(secret=claimed.secret, body=body),
    }
    timeout = settings.WEBHOOK_TIMEOUT_SECONDS
    try:
        with _http_client().stream("POST", claimed.url, content=body, headers=headers, timeout=timeout) as answer:
            if 200 <= answer.status_code < 300:
                return answer.status_code, ""
            text = b""
            for chunk in answer.iter_bytes():  # a little of the answer, never all of a huge one
                text += chunk
                if len(text) >= ERROR_BODY_BYTES:
                    break
            detail = text[:ERROR_BODY_BYTES].decode(errors="replace").strip()
            return answer.status_code, f"HTTP {answer.status_code}" + (f": {detail}" if detail else "")
    except httpx.TimeoutException:
        return None, f"no answer within {timeout:g} s"
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]


def _record_delivered(delivery_id: str, claim: int, status: int) -> bool:
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery
               SET state = {DELIVERED}, delivered_at = now(), next_attempt_at = NULL, claim = NULL,
                   last_status = %s, last_error = ''
             WHERE id = %s AND claim = %s AND state IN {OPEN}
            """,
            [status, delivery_id, claim],
        )
        return cur.rowcount == 1


def _record_failed(delivery_id: str, claim: int, status: int | None, error: str, backoff: float) -> str | None:
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_webhookdelivery
               SET attempts = attempts + 1, claim = NULL, last_status = %(status)s, last_error = left(%(error)s, 500),
                   state = CASE WHEN attempts + 1 >= %(max)s THEN {DEAD} ELSE {RETRYING} END,
                   dead_at = CASE WHEN attempts + 1 >= %(max)s THEN now() ELSE NULL END,
                   next_attempt_at = CASE WHEN attempts + 1 >= %(max)s THEN NULL
                                          ELSE now() + make_interval(secs => %(backoff)s) END
             WHERE id = %(id)s AND claim = %(claim)s AND state IN {OPEN}
            RETURNING state
            """,
            {"status": status, "error": error, "max": settings.WEBHOOK_MAX_ATTEMPTS, "backoff": backoff,
             "id": delivery_id, "claim": claim},
        )
        row = cur.fetchone()
    return row[0] if row else None


def webhook_attempt(*, delivery_id: str, claim: int) -> str:
    """Make one attempt of a handed-out delivery. Returns what became of it: "delivered",
    "retrying", "dead", or "skipped" (not pending or retrying under this claim any more: done,
    dead, or handed to someone else)."""
    own_claim = webhook_claim_token()
    claimed = _take_over(delivery_id, claim, own_claim)
    if claimed is None:
        return "skipped"
    status, error = _call(claimed, delivery_id)
    if not error:
        outcome = "delivered" if _record_delivered(delivery_id, own_claim, status) else "skipped"
    else:
        outcome = _record_failed(delivery_id, own_claim, status, error, webhook_backoff(claimed.attempts + 1)) \
            or "skipped"
        if outcome == WebhookState.DEAD:
            log.warning("webhook %s (%s) to %s is dead after %d attempts: %s", delivery_id, claimed.event,
                        claimed.url, claimed.attempts + 1, error)
    if outcome != "skipped":
        metrics.WEBHOOKS.labels(claimed.event, "failed" if outcome == WebhookState.RETRYING else outcome).inc()
    return outcome


# --- the sweep and retention ---------------------------------------------------------------------


def webhooks_sweep(*, limit: int = 1000) -> tuple[list[str], int]:
    """Hand out again every open delivery whose timer ran out (due retries, lost tasks), under one
    new claim; returns (ids, claim) for the caller to send. Served by the partial index
    webhook_delivery_due."""
    claim = webhook_claim_token()
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
