"""Where a message is routed: from committed delivery rows to the sockets of the recipients.

For each delivery still pending (or due for a retry): look the recipient's live connections up in
the presence cache, claim the row (-> sent, one attempt), and push the frame through the channel
layer to every node holding one of those connections. Offline recipients keep the row pending in
their mailbox; a failed push becomes a retry with backoff. Users homed in another domain are
left pending here until inter-domain forwarding (domain network) takes them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from messaging import sockets
from messaging.protocol import delivery_frame
from messaging.services import deliveries_claim, deliveries_for_routing, deliveries_park, deliveries_retry
from presence import cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouteOutcome:
    pushed: int
    offline: int
    failed: int


def deliveries_route(delivery_ids: list[int]) -> RouteOutcome:
    rows = deliveries_for_routing(delivery_ids)
    if not rows:
        return RouteOutcome(0, 0, 0)
    connections = cache.connections_of_many(r.recipient for r in rows)
    online = [r for r in rows if connections[r.recipient]]
    offline = [r for r in rows if not connections[r.recipient]]
    deliveries_park(delivery_ids=[r.delivery_id for r in offline if r.state != "pending"])

    claimed = deliveries_claim(
        delivery_ids=[r.delivery_id for r in online],
        nodes=[connections[r.recipient][0].node_id for r in online],
    )
    per_channel: dict[str, list[sockets.DeliverItem]] = defaultdict(list)
    channels_of: dict[int, list[str]] = defaultdict(list)
    for row in online:
        if row.delivery_id not in claimed:
            continue  # someone else (a fetch, a duplicate task) already took it
        frame = delivery_frame(kind=row.kind, sender=row.sender, content=row.content, reference=row.reference,
                               message_id=row.message_id, seq=row.seq)
        for conn in connections[row.recipient]:
            per_channel[conn.channel_name].append(
                {"delivery_id": row.delivery_id, "message_id": row.message_id, "frame": frame})
            channels_of[row.delivery_id].append(conn.channel_name)

    failures = sockets.send_many_sync(
        (channel, sockets.message_deliver_event(items)) for channel, items in per_channel.items())
    failed_channels = {channel for channel, _ in failures}
    failed = [d for d, chans in channels_of.items() if all(c in failed_channels for c in chans)]
    if failed:
        deliveries_retry(delivery_ids=failed, error=f"push failed: {failures[0][1]!r}"[:500])
    return RouteOutcome(pushed=len(channels_of) - len(failed), offline=len(offline), failed=len(failed))
