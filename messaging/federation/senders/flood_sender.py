"""Each link's sender of channel publishes (the flood, messaging.federation.flood).

`flood_link_send(peer=)` passes the link's queue (ChannelForward rows, in id order) to the
neighbour in calls of at most FORWARD_BATCH_SIZE publishes and FORWARD_BATCH_BYTES, on the outbound
skeleton (foundation.outbound): one sender per link at a time, so a link's publishes leave in the
order they were queued, and a channel's publishes of one origin arrive everywhere in order.

- Answered: the rows go, the link is recorded as up with the publishes it took. A publish the
  neighbour refused alone (its app unknown there, a content its app refuses) is dead at once with
  the neighbour's reason: asking again would get the same answer.
- Failed (unreachable, refused whole): the call's rows count an attempt and keep the error; the link
  is recorded as down and its queue held back until its retry time (backoff, messaging.federation.links).
  A row whose attempts reach its app's max_delivery_attempts is dead (`dead_at`, the reason kept).
  That is usually harmless: the flood reaches a domain by every path, so a neighbour cut off from
  this domain gets the publish from its other neighbours; a domain cut off from all of them misses
  it (its readers' histories lack it) and the dead rows say what it missed.

`flood_sweep()` (beat, every FORWARD_SWEEP_SECONDS) wakes the senders of links with waiting rows
whose retry is due: a wake-up lost with a worker, a link held back by its backoff, a row queued
while its sender was busy.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from foundation.outbound import (
    Batch,
    CallFailed,
    Failed,
    Limits,
    Outcome,
    Settled,
    head_sql,
    out_of_attempts,
    send_batches,
)
from messaging.core.next_hop import neighbours
from messaging.federation.flood import path_parse
from messaging.federation.links import LinkQueueSender, link_failed, link_succeeded, links_held_back
from messaging.federation.models import ChannelForward
from messaging.federation.wire.transport import PUBLISH_PATH, peer_call

ROW_OVERHEAD_BYTES = 300  # what a publish counts towards FORWARD_BATCH_BYTES beyond its content

FloodOutcome = Outcome  # sent, refused (dead), failed (an attempt counted), dead (out of attempts), skipped


def flood_lock_key(peer: str) -> str:
    return FloodSender(peer).lock_key


@dataclass(frozen=True)
class Queued:
    row_id: int
    publish: dict
    size: int


# The head of the link's flood queue, as long as the running size stays within the byte limit.
_QUEUE_SQL = head_sql(f"""
    SELECT f.id, f.path, a.app_name, c.name, p.content, p.publisher, p.origin_domain, p.origin_offset, p."offset",
           octet_length(p.content) + {ROW_OVERHEAD_BYTES} AS size,
           sum(octet_length(p.content) + {ROW_OVERHEAD_BYTES}) OVER w AS running, row_number() OVER w AS n
      FROM messaging_channelforward f
      JOIN messaging_channelmessage p ON p.id = f.publish_id
      JOIN messaging_channel c ON c.id = p.channel_id
      JOIN apps_registry_clientapp a ON a.id = c.app_id
     WHERE f.peer = %(peer)s AND f.dead_at IS NULL
    WINDOW w AS (ORDER BY f.id)
     ORDER BY f.id
     LIMIT %(rows)s
""")

DIES = out_of_attempts("f.attempts + 1", "a.max_delivery_attempts")


class FloodSender(LinkQueueSender):
    """The link's queue of channel publishes on the outbound skeleton: its SQL, its payload, and
    what becomes of its rows (sent: gone; refused alone: dead; failed: an attempt counted)."""

    name = "flood"

    def take(self, limits: Limits) -> Batch[Queued]:
        here = settings.DOMAIN_NAME
        rows, drained = self.head(_QUEUE_SQL, limits)
        batch = []
        for row_id, path, app, channel, content, publisher, origin, origin_offset, offset, size, _, _, _ in rows:
            batch.append(Queued(row_id, {
                "app": app, "channel": channel, "content": content, "publisher": publisher,
                # Blank origin: published here, under this domain's offset.
                "origin_domain": origin or here, "origin_offset": origin_offset if origin else offset,
                "path": list(path_parse(path) or (here,)),
            }, size))
        return Batch(items=batch, drained=drained)

    def send(self, batch: Batch[Queued]) -> dict:
        answer = peer_call(peer=self.peer, path=PUBLISH_PATH, payload={"publishes": [q.publish for q in batch.items]})
        return answer if isinstance(answer, dict) else {}

    def settle(self, batch: Batch[Queued], answer: dict) -> Settled:
        """The neighbour took the publishes but those it refused alone (its app unknown there, a
        content its app refuses): dead at once with its reason, as asking again would get the same."""
        items = batch.items
        refused = {}
        for item in answer.get("refused") or []:
            if isinstance(item, dict) and isinstance(item.get("index"), int) and 0 <= item["index"] < len(items):
                refused[items[item["index"]].row_id] = str(item.get("reason", "refused"))[:500]
        now = timezone.now()
        with transaction.atomic():
            for row_id, reason in refused.items():
                ChannelForward.objects.filter(pk=row_id).update(dead_at=now, last_error=f"refused: {reason}"[:500],
                                                                attempts=1)
            ChannelForward.objects.filter(pk__in=[q.row_id for q in items if q.row_id not in refused]).delete()
        link_succeeded(peer=self.peer, forwarded=len(items) - len(refused))
        return Settled(sent=len(items) - len(refused), refused=len(refused))

    def fail(self, batch: Batch[Queued], error: CallFailed) -> Failed:
        """An attempt counted on every publish of the call; those out of their app's attempts are dead."""
        with connection.cursor() as cur:
            cur.execute(
                f"""
                UPDATE messaging_channelforward f
                   SET attempts = f.attempts + 1, last_error = %s,
                       dead_at = CASE WHEN {DIES} THEN now() END
                  FROM messaging_channelmessage m
                  JOIN messaging_channel c ON c.id = m.channel_id
                  JOIN apps_registry_clientapp a ON a.id = c.app_id
                 WHERE f.id = ANY(%s) AND m.id = f.publish_id AND f.dead_at IS NULL
                RETURNING f.dead_at IS NOT NULL
                """,
                [error.reason, [q.row_id for q in batch.items]],
            )
            outcomes = [dead for (dead,) in cur.fetchall()]
        health = link_failed(peer=self.peer, error=error.reason, answered=error.status is not None)
        return Failed(failed=len(outcomes), dead=sum(outcomes), retry_at=health.retry_at)


def flood_link_send(*, peer: str) -> Outcome:
    """Send the link's waiting publishes to `peer` until none is left, the link fails, or its
    backoff holds it back. Nothing when another sender has the link (`busy`)."""
    return send_batches(FloodSender(peer), budget_seconds=settings.FORWARD_TASK_BUDGET_SECONDS)


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
    held = links_held_back(waiting)
    return sorted(p for p in waiting if p not in held)
