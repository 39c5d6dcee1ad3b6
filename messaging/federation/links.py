"""Each link's health as this domain sees it (messaging.core.next_hop reads it to decide where an
item goes next), and what a link's senders share.

Probes and calls record health: a call answered marks the link up, a call that failed marks it down
and holds its queues back until its retry time (link_backoff); a neighbour that said it has no way
on to some domains is marked blocked towards them (route_blocked) for ROUTE_BLOCK_SECONDS.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from foundation.backoff import Backoff
from foundation.db import hot_cursor
from foundation.outbound import Batch, Limits
from messaging.core.next_hop import link_state_forget, link_state_known, marks_live, routes_cache_clear
from messaging.federation.models import LinkHealth
from messaging.federation.wire.transport import link_cache_clear


def graph_cache_clear() -> None:
    """Forget the cached graph and link state (tests that change links; the admin after a change is
    at most GRAPH_CACHE_SECONDS behind anyway), and the links' clients."""
    routes_cache_clear()
    link_cache_clear()


# --- health ------------------------------------------------------------------------------------


def link_succeeded(*, peer: str, forwarded: int = 0) -> None:
    """A call to `peer` was answered: the link is up, its backoff cleared; `forwarded` items went out."""
    now = timezone.now()
    updated = LinkHealth.objects.filter(peer=peer).update(
        up=True, down_since=None, failures=0, retry_at=None, last_failure_kind="", last_ok_at=now,
        forwarded_out=F("forwarded_out") + forwarded)
    if (known := link_state_known()) is not None and peer in known.down:
        link_state_forget()  # up again: used again at once
    if not updated:
        LinkHealth.objects.get_or_create(peer=peer, defaults={"last_ok_at": now, "forwarded_out": forwarded})


def link_ping_answered(peer: str) -> bool:
    """A probe of `peer` was answered. The link is up again unless its last failure was a call the
    neighbour answered with an error: a neighbour that answers pings but fails the link's calls
    keeps the backoff its calls earned, so its queue is not retried, and its rows' attempts not used
    up, at every probe. Returns whether the link is (now) clear to send."""
    now = timezone.now()
    cleared = (LinkHealth.objects.filter(peer=peer).exclude(last_failure_kind="call", failures__gt=0)
               .update(up=True, down_since=None, failures=0, retry_at=None, last_failure_kind="", last_ok_at=now))
    if cleared:
        return True
    if LinkHealth.objects.filter(peer=peer).update(last_ok_at=now):
        return False
    LinkHealth.objects.get_or_create(peer=peer, defaults={"last_ok_at": now})
    return True


def link_backoff() -> Backoff:
    """When a link that failed is tried again: FORWARD_RETRY_BASE_SECONDS, doubling per failure in
    a row, at most FORWARD_RETRY_MAX_SECONDS, less up to a fifth (jitter)."""
    return Backoff(settings.FORWARD_RETRY_BASE_SECONDS, settings.FORWARD_RETRY_MAX_SECONDS, jitter=0.2)


def link_failed(*, peer: str, error: str, answered: bool = False) -> LinkHealth:
    """A call to `peer` failed (`answered`: the neighbour answered it with an error; else it was out
    of reach): down (since the first failure in a row), the error kept, and the link's queues held
    back until `retry_at` (link_backoff)."""
    now = timezone.now()
    health, _ = LinkHealth.objects.get_or_create(peer=peer)
    failures = health.failures + 1
    delay = link_backoff().seconds(failures)
    LinkHealth.objects.filter(pk=health.pk).update(
        up=False, down_since=health.down_since if not health.up and health.down_since else now,
        failures=failures, last_error=error[:500], last_failure_at=now, retry_at=now + timedelta(seconds=delay),
        last_failure_kind="call" if answered else "reach")
    link_state_forget()
    health.refresh_from_db()
    return health


def link_held_back(peer: str) -> bool:
    """The link failed and its retry time has not come: its senders wait (a probe that is answered
    clears it, unless a call answered with an error failed last: link_ping_answered)."""
    return LinkHealth.objects.filter(peer=peer, retry_at__gt=timezone.now()).exists()


def links_held_back(peers: Iterable[str]) -> set[str]:
    return set(LinkHealth.objects.filter(peer__in=list(peers), retry_at__gt=timezone.now())
               .values_list("peer", flat=True))


def link_received(*, peer: str, count: int) -> None:
    """`count` items came in from `peer` (its calls also prove the link works)."""
    if count and not LinkHealth.objects.filter(peer=peer).update(forwarded_in=F("forwarded_in") + count):
        LinkHealth.objects.get_or_create(peer=peer, defaults={"forwarded_in": count})


def _mark(*, peer: str, field: str, targets: Iterable[str]) -> None:
    targets = sorted(set(targets))
    if not targets:
        return
    until = time.time() + settings.ROUTE_BLOCK_SECONDS
    with transaction.atomic():
        health, _ = LinkHealth.objects.select_for_update().get_or_create(peer=peer)
        marks = marks_live(getattr(health, field), time.time())
        marks.update(dict.fromkeys(targets, until))
        LinkHealth.objects.filter(pk=health.pk).update(**{field: marks})
    link_state_forget()


def route_blocked(*, peer: str, targets: Iterable[str]) -> None:
    """`peer` said it has no way on to `targets` now: items for them go another way where one
    exists, for ROUTE_BLOCK_SECONDS (then `peer` is tried again; if it still has no way on, it says
    so again)."""
    _mark(peer=peer, field="blocked", targets=targets)


def route_holding(*, peer: str, targets: Iterable[str]) -> None:
    """`peer` has no other way to `targets` than through here (it sent items for them with `hold`):
    for ROUTE_BLOCK_SECONDS what waits here for them is not handed back to it."""
    _mark(peer=peer, field="holding", targets=targets)


def link_health_rows_ensure(peers: Iterable[str]) -> None:
    """A health record for each of `peers` (the admin lists every neighbour, called yet or not)."""
    LinkHealth.objects.bulk_create([LinkHealth(peer=p) for p in peers], ignore_conflicts=True)


# --- what a link's senders share ------------------------------------------------------------------


class LinkQueueSender:
    """What the link's three senders (its deliveries, channel publishes and receipts: outbox,
    flood_sender, receipts) share on the outbound skeleton (foundation.outbound): one sender of each
    kind per link (lock key `<name>:<peer>`), calls bounded by FORWARD_BATCH_SIZE and
    FORWARD_BATCH_BYTES, held back while the link's retry time has not come. A subclass brings its
    queue's SQL, its payload and what becomes of its rows."""

    name = ""

    def __init__(self, peer: str):
        self.peer = peer
        self.lock_key = f"{self.name}:{peer}"

    def limits(self) -> Limits:
        return Limits(rows=max(1, int(settings.FORWARD_BATCH_SIZE)), bytes=int(settings.FORWARD_BATCH_BYTES))

    def held_back(self) -> bool:
        return link_held_back(self.peer)

    def head(self, sql: str, limits: Limits) -> tuple[list[tuple], bool]:
        """The rows of the queue's `head_sql` (foundation.outbound) for this link within `limits`, and
        whether they are the whole queue (Limits.drained; the rows end with head_sql's count)."""
        with hot_cursor() as cur:
            cur.execute(sql, {"peer": self.peer, "rows": max(1, limits.rows), "bytes": limits.bytes})
            rows = cur.fetchall()
        return rows, limits.drained(fetched=rows[-1][-1] if rows else 0, kept=len(rows))

    def give_up(self, refused: list) -> int:
        return 0  # nothing is refused before a call, unless a sender says otherwise

    def put_back(self, batch: Batch) -> None:
        """Nothing to do: the rows never left the link's queue."""
