"""Each link's sender of channel publishes (the flood, messaging.network.flood).

`flood_link_send(peer=)` passes the link's queue (ChannelForward rows, in id order) to the
neighbour in calls of FORWARD_BATCH_SIZE publishes. One sender per link at a time (a Postgres
advisory lock, released with its connection if the worker dies): a link's publishes leave in the
order they were queued, so a channel's publishes of one origin arrive everywhere in order.

- Answered: the rows go, the link is recorded as up with the publishes it took. A publish the
  neighbour refused alone (its app unknown there, a content its app refuses) is dead at once with
  the neighbour's reason: asking again would get the same answer.
- Failed (unreachable, refused whole): the call's rows count an attempt and keep the error; the link
  is recorded as down and its queue held back until its retry time (backoff, messaging.network.links).
  A row whose attempts reach its app's max_delivery_attempts is dead (`dead_at`, the reason kept).
  That is usually harmless: the flood reaches a domain by every path, so a neighbour cut off from
  this domain gets the publish from its other neighbours; a domain cut off from all of them misses
  it (its readers' histories lack it) and the dead rows say what it missed.

`flood_sweep()` (beat, every FORWARD_SWEEP_SECONDS) wakes the senders of links with waiting rows
whose retry is due: a wake-up lost with a worker, a link held back by its backoff, a row queued
while its sender was busy.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps_registry.models import ClientApp
from messaging.network.flood import path_parse
from messaging.network.links import link_failed, link_succeeded, neighbours
from messaging.network.models import ChannelForward, LinkHealth
from messaging.network.transport import PUBLISH_PATH, PeerError, peer_call

FLOOD_LOCK_NAMESPACE = 0x5BF100D  # pg_try_advisory_lock(namespace, crc32(peer)): one sender per link


@dataclass(frozen=True)
class FloodOutcome:
    peer: str
    sent: int = 0  # publishes the neighbour took (stored or already had)
    refused: int = 0  # refused by the neighbour alone: dead
    failed: int = 0  # in a call that failed: an attempt counted
    dead: int = 0  # of those, out of attempts
    skipped: str = ""  # why nothing was tried: "busy" (another sender), "held back" (backoff)
    error: str = ""


def _lock_key(peer: str) -> int:
    return zlib.crc32(peer.encode()) & 0x7FFFFFFF


def _held_back(peer: str) -> bool:
    """The link failed and its retry time has not come (a probe that succeeds clears it)."""
    return LinkHealth.objects.filter(peer=peer, up=False, retry_at__gt=timezone.now()).exists()


def _batch(peer: str) -> list[tuple]:
    here = settings.DOMAIN_NAME
    rows = (ChannelForward.objects.filter(peer=peer, dead_at__isnull=True).order_by("id")
            .values_list("id", "path", "publish__channel__app__app_name", "publish__channel__name",
                         "publish__content", "publish__publisher", "publish__origin_domain",
                         "publish__origin_offset", "publish__offset")[:settings.FORWARD_BATCH_SIZE])
    batch = []
    for row_id, path, app, channel, content, publisher, origin, origin_offset, offset in rows:
        batch.append((row_id, {
            "app": app, "channel": channel, "content": content, "publisher": publisher,
            # Blank origin: published here, under this domain's offset.
            "origin_domain": origin or here, "origin_offset": origin_offset if origin else offset,
            "path": list(path_parse(path) or (here,)),
        }))
    return batch


def _failed(ids: list[int], error: str) -> int:
    """Count an attempt on `ids`; those out of their app's attempts are dead. Returns how many died."""
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_channelforward f
               SET attempts = f.attempts + 1, last_error = %s,
                   dead_at = CASE WHEN f.attempts + 1 >= a.max_delivery_attempts THEN now() END
              FROM messaging_channelmessage m
              JOIN messaging_channel c ON c.id = m.channel_id
              JOIN {ClientApp._meta.db_table} a ON a.id = c.app_id
             WHERE f.id = ANY(%s) AND m.id = f.publish_id AND f.dead_at IS NULL
            RETURNING f.dead_at IS NOT NULL
            """,
            [error[:500], ids],
        )
        return sum(1 for (dead,) in cur.fetchall() if dead)


def _answered(batch: list[tuple], answer: dict) -> int:
    """Settle a call the neighbour answered; returns the publishes it refused (now dead)."""
    refused = {}
    for item in answer.get("refused") or []:
        if isinstance(item, dict) and isinstance(item.get("index"), int) and 0 <= item["index"] < len(batch):
            refused[batch[item["index"]][0]] = str(item.get("reason", "refused"))[:500]
    now = timezone.now()
    with transaction.atomic():
        for row_id, reason in refused.items():
            ChannelForward.objects.filter(pk=row_id).update(dead_at=now, last_error=f"refused: {reason}"[:500],
                                                            attempts=1)
        ChannelForward.objects.filter(pk__in=[r for r, _ in batch if r not in refused]).delete()
    return len(refused)


def _send(peer: str) -> FloodOutcome:
    sent = refused = 0
    while True:
        if _held_back(peer):
            return FloodOutcome(peer, sent=sent, refused=refused, skipped="held back" if not sent else "")
        batch = _batch(peer)
        if not batch:
            return FloodOutcome(peer, sent=sent, refused=refused)
        try:
            answer = peer_call(peer=peer, path=PUBLISH_PATH, payload={"publishes": [p for _, p in batch]})
        except PeerError as exc:
            dead = _failed([r for r, _ in batch], exc.reason)
            link_failed(peer=peer, error=exc.reason)
            return FloodOutcome(peer, sent=sent, refused=refused, failed=len(batch), dead=dead, error=exc.reason)
        n_refused = _answered(batch, answer if isinstance(answer, dict) else {})
        link_succeeded(peer=peer, forwarded=len(batch) - n_refused)
        sent += len(batch) - n_refused
        refused += n_refused
        if len(batch) < settings.FORWARD_BATCH_SIZE:
            return FloodOutcome(peer, sent=sent, refused=refused)


def flood_link_send(*, peer: str) -> FloodOutcome:
    """Send the link's waiting publishes to `peer` until none is left, the link fails, or its
    backoff holds it back. Nothing when another sender has the link."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [FLOOD_LOCK_NAMESPACE, _lock_key(peer)])
        if not cur.fetchone()[0]:
            return FloodOutcome(peer, skipped="busy")
    try:
        return _send(peer)
    finally:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s, %s)", [FLOOD_LOCK_NAMESPACE, _lock_key(peer)])


def flood_links_due() -> list[str]:
    """Neighbours over enabled links with publishes waiting whose retry is due. (A link disabled or
    removed keeps its rows, unsent, until it is enabled again or retention drops the publishes: the
    flood reaches its peer by the other paths meanwhile.)"""
    peers = neighbours()
    if not peers:
        return []
    with connection.cursor() as cur:
        # One probe of the partial index channel_forward_queue per neighbour.
        cur.execute(
            """
            SELECT p.peer FROM unnest(%s::varchar[]) AS p(peer)
             WHERE EXISTS (SELECT 1 FROM messaging_channelforward f WHERE f.peer = p.peer AND f.dead_at IS NULL)
            """,
            [peers],
        )
        waiting = [peer for (peer,) in cur.fetchall()]
    held = set(LinkHealth.objects.filter(peer__in=waiting, up=False, retry_at__gt=timezone.now())
               .values_list("peer", flat=True))
    return sorted(p for p in waiting if p not in held)
