"""Where a delivery is retried: a failed attempt is counted, and the next one waits a backoff.

An attempt fails when a push was made and failed (`deliveries_fail`, from the router) or when a
push was never confirmed, written or ACKed, within DELIVERY_ACK_TIMEOUT (`deliveries_sweep`). The
delivery is then `retrying`, due after `retry_backoff()` (foundation.backoff's Backoff: base x
2^(attempts-1) seconds from RETRY_BASE_SECONDS, capped at RETRY_MAX_SECONDS, less up to half, so a
recipient's backlog does not come back all at once); or, once the app's max attempts are used,
dead (messaging.core.delivery.dead_letters). The beat's sweep hands every retry that is due back to routing.

`attempts` counts failed attempts only: a recipient being offline, a connection closing before it
read or acknowledged, a node dying or Redis being away are not the recipient's failures (they
park or release, messaging.core.delivery.claims).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from foundation.backoff import Backoff
from foundation.db import hot_cursor
from messaging.core.delivery.claims import claimed_update
from messaging.core.delivery.dead_letters import DIES_AT, dead_letters_announce
from messaging.core.delivery.sql import DEAD, MOVED_COLUMNS, RETRYING, SENT, UNDELIVERED
from messaging.models import DeliveryState


def retry_backoff() -> Backoff:
    return Backoff(settings.RETRY_BASE_SECONDS, settings.RETRY_MAX_SECONDS, jitter=0.5)


def _failure_set(attempts: str, error: str) -> str:
    dies, backoff = DIES_AT.format(attempts=attempts), retry_backoff().sql(attempts)
    return f"""
        attempts = {attempts}, claim = NULL, last_error = left({error}, 500),
        state = CASE WHEN {dies} THEN {DEAD} ELSE {RETRYING} END,
        dead_at = CASE WHEN {dies} THEN now() ELSE NULL END,
        next_attempt_at = CASE WHEN {dies} THEN NULL ELSE now() + {backoff} END"""


@dataclass(frozen=True)
class FailResult:
    failed: list[int]  # an attempt counted: retrying, or dead
    dead: list[int]  # ... of which used up their attempts


def deliveries_fail(*, claims: list[tuple[int, int]], error: str) -> FailResult:
    """A push that was made and failed: one attempt counted; retry with backoff, or dead letter
    once the app's max attempts are used (announced to the app's webhooks)."""
    rows = claimed_update(_failure_set("d.attempts + 1", "%(error)s"), claims, {"error": error[:500]},
                          returning=MOVED_COLUMNS)
    dead = [row for row in rows if row[1] == DeliveryState.DEAD.value]
    dead_letters_announce(dead)
    return FailResult(failed=sorted(row[0] for row in rows), dead=sorted(row[0] for row in dead))


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
    dies, backoff = DIES_AT.format(attempts="d.attempts + 1"), retry_backoff().sql("d.attempts + 1")
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
                                WHEN {dies} THEN {DEAD} ELSE {RETRYING} END,
                   dead_at = CASE WHEN due.state = {SENT} AND {dies} THEN now() ELSE d.dead_at END,
                   next_attempt_at = CASE
                       WHEN due.state <> {SENT} THEN now() + make_interval(secs => %(lease)s)
                       WHEN {dies} THEN NULL
                       ELSE now() + {backoff} END,
                   claim = CASE WHEN due.state = {SENT} THEN NULL ELSE d.claim END,
                   last_error = CASE WHEN due.state = {SENT} THEN %(timeout_error)s ELSE d.last_error END
              FROM due, apps_registry_clientapp a
             WHERE d.id = due.id AND a.id = d.app_id
            RETURNING due.state, {MOVED_COLUMNS}
            """,
            {"limit": limit, "lease": float(settings.ROUTING_LEASE_SECONDS),
             "timeout_error": f"not confirmed within {settings.DELIVERY_ACK_TIMEOUT} s"},
        )
        rows = cur.fetchall()
    sent = DeliveryState.SENT.value
    died = [r[1:] for r in rows if r[0] == sent and r[2] == DeliveryState.DEAD.value]
    dead_letters_announce(died)
    return SweepResult(
        timed_out=sorted(r[1] for r in rows if r[0] == sent),
        dead=sorted(r[0] for r in died),
        due=sorted(r[1] for r in rows if r[0] != sent),
    )
