"""Where a message is routed: from committed delivery rows to the sockets of the recipients.

Claim the deliveries still pending (or due for a retry) in one statement (-> sent, one attempt),
look the recipients' live connections up in the presence cache, and push each frame through the
channel layer to every node holding one of those connections. Offline recipients get the row
back as pending in their mailbox (no attempt counted); a failed push becomes a retry with
backoff. Users homed in another domain stay pending here until inter-domain forwarding (the
domain network) takes them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from messaging import sockets
from messaging.protocol import delivery_frame
from messaging.services import deliveries_claim, deliveries_park, deliveries_retry
from presence import cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouteOutcome:
    pushed: int
    offline: int
    failed: int


def deliveries_route(delivery_ids: list[int]) -> RouteOutcome:
    claimed = deliveries_claim(delivery_ids=delivery_ids)
    if not claimed:
        return RouteOutcome(0, 0, 0)
    connections = cache.connections_of_many(row.recipient for row in claimed)
    offline = [row.delivery_id for row in claimed if not connections[row.recipient]]
    deliveries_park(delivery_ids=offline)

    per_channel: dict[str, list[sockets.DeliverItem]] = defaultdict(list)
    channels_of: dict[int, list[str]] = defaultdict(list)
    for row in claimed:
        if not connections[row.recipient]:
            continue
        frame = delivery_frame(kind=row.kind, sender=row.sender, content=row.content, reference=row.reference,
                               message_id=row.message_id, seq=row.seq)
        for conn in connections[row.recipient]:
            per_channel[conn.channel_name].append({"delivery_id": row.delivery_id, "message_id": row.message_id,
                                                   "frame": frame, "stored_at": row.stored_at})
            channels_of[row.delivery_id].append(conn.channel_name)

    failures = dict(sockets.send_many_sync(
        (channel, sockets.message_deliver_event(items)) for channel, items in per_channel.items()))
    unreached = [d for d, chans in channels_of.items() if all(c in failures for c in chans)]
    # Nobody subscribed on any of the recipient's channels: its connections are gone (a node died
    # and the reaper has not caught up yet). That is an offline recipient, not a failed attempt.
    gone = [d for d in unreached if all(isinstance(failures[c], sockets.NoSubscriber) for c in channels_of[d])]
    failed = [d for d in unreached if d not in set(gone)]
    deliveries_park(delivery_ids=gone)
    if failed:
        first_error = next(e for e in failures.values() if not isinstance(e, sockets.NoSubscriber))
        deliveries_retry(delivery_ids=failed, error=f"push failed: {first_error!r}"[:500])
    return RouteOutcome(pushed=len(channels_of) - len(unreached), offline=len(offline) + len(gone),
                        failed=len(failed))
