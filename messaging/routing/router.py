"""Where a message is routed: from committed delivery rows to the sockets of the recipients.

Claim the deliveries still pending (or due for a retry) in one statement (-> sent under a fresh
claim token), look the recipients' live connections up in the presence cache, and push each frame
through the channel layer to every node holding one of those connections. Then, always naming the
claim (so nothing is done to a row another worker has re-claimed since):

- offline recipients: parked in their mailbox for a fetch, no attempt counted;
- pushes nobody received (the connection or its node is gone): parked the same way;
- pushes that could not be made at all (Redis away): released at once, no attempt counted, due for
  routing again, so the sweep routes them as soon as Redis answers;
- pushes that were made and failed: one attempt counted, retried with backoff or dead-lettered.

A push that was made is confirmed by the node that writes it (or by the client's ACK); until then
the row stays `sent`, and the sweep counts a failed attempt if no confirmation comes in time.

Where a claimed delivery goes is decided in one place, `destination`: this domain (pushed here) or
the recipient's home domain elsewhere. A user homed elsewhere is never connected here
(authentication sends it home), so its delivery is queued on the link to the next hop towards its
home (messaging.federation.senders.queue), or, where no enabled link leads there, counts a failed attempt
("no route to domain-05"). While a user's standby serves it (a takeover,
messaging.federation.takeover.take), its home keeps the rows it had stored before it learned so parked (the
standby copy carried them there) and forwards the later ones. Such a recipient's earlier rows that are still waiting to be routed (their
routing task was lost with a worker, or is behind this one) are claimed and routed with the task's
own, first: the next domain stores a recipient's messages in the order they arrive.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from redis import RedisError

from foundation.outbound import claim_token
from foundation.transport import sockets
from messaging.core.delivery.claims import (
    ClaimedRow,
    deliveries_claim,
    deliveries_park,
    deliveries_release,
    records_already_in_mailbox,
)
from messaging.core.delivery.retry import deliveries_fail
from messaging.core.next_hop import destination, frozen_here
from messaging.core.protocol import delivery_frame, request_meta_read
from messaging.federation.senders.queue import deliveries_queue_on_links, earlier_unrouted
from messaging.models import MessageKind
from presence import cache

log = logging.getLogger(__name__)
OUTCOME_KINDS = (MessageKind.RESOLVE.value, MessageKind.REJECT.value)


@dataclass(frozen=True)
class RouteOutcome:
    pushed: int
    offline: int
    released: int
    failed: int
    elsewhere: int = 0  # recipients homed in another domain: queued on a link (or no route: an attempt)


__all__ = ["RouteOutcome", "deliveries_route", "destination"]


def deliveries_route(delivery_ids: list[int]) -> RouteOutcome:
    token = claim_token()
    claimed = deliveries_claim(delivery_ids=delivery_ids, token=token)
    here: list[ClaimedRow] = []
    elsewhere: dict[int, str] = {}
    parked: list[tuple[int, int]] = []
    for row in claimed:
        home = destination(row.recipient)
        if home is None:
            here.append(row)
        elif frozen_here(row.recipient, home, row.stored_at):  # its mailbox at home, held elsewhere (a takeover)
            parked.append((row.delivery_id, token))
        else:
            elsewhere[row.delivery_id] = home
    deliveries_park(claims=parked)
    if elsewhere:  # their recipients' earlier rows whose routing was lost go first, with them
        for row in deliveries_claim(delivery_ids=earlier_unrouted(sorted(elsewhere)), token=token):
            if (home := destination(row.recipient)) is None:
                here.append(row)
            elif frozen_here(row.recipient, home, row.stored_at):
                deliveries_park(claims=[(row.delivery_id, token)])
            else:
                elsewhere[row.delivery_id] = home
    deliveries_queue_on_links(homes=elsewhere, token=token)
    if doubled := records_already_in_mailbox(rows=here, token=token):
        here = [row for row in here if row.delivery_id not in doubled]
    outcome = _push_here(here, token)
    return RouteOutcome(outcome.pushed, outcome.offline, outcome.released, outcome.failed, len(elsewhere))


def _push_here(claimed: list[ClaimedRow], token: int) -> RouteOutcome:
    if not claimed:
        return RouteOutcome(0, 0, 0, 0)
    try:
        connections = cache.connections_of_many(row.recipient for row in claimed)
    except RedisError as exc:
        log.warning("presence lookup failed, releasing %d claims: %r", len(claimed), exc)
        deliveries_release(claims=[(row.delivery_id, token) for row in claimed], park=False)
        return RouteOutcome(0, 0, len(claimed), 0)
    targets = {row.delivery_id: _targets(row, connections[row.recipient]) for row in claimed}
    offline = [(row.delivery_id, token) for row in claimed if not targets[row.delivery_id]]

    per_channel: dict[str, list[sockets.DeliverItem]] = defaultdict(list)
    channels_of: dict[int, list[str]] = defaultdict(list)
    for row in claimed:
        if not targets[row.delivery_id]:
            continue
        frame = delivery_frame(kind=row.kind, sender=row.sender, content=row.content, reference=row.reference,
                               message_id=row.message_id, seq=row.seq)
        for conn in targets[row.delivery_id]:
            per_channel[conn.channel_name].append({"delivery_id": row.delivery_id, "message_id": row.message_id,
                                                   "frame": frame, "stored_at": row.stored_at, "claim": token})
            channels_of[row.delivery_id].append(conn.channel_name)

    failures = dict(sockets.send_many_sync(
        (channel, sockets.message_deliver_event(items)) for channel, items in per_channel.items()))
    unreached = [d for d, chans in channels_of.items() if all(c in failures for c in chans)]
    gone, unpushed, failed = [], [], []
    for delivery_id in unreached:
        errors = [failures[c] for c in channels_of[delivery_id]]
        if all(isinstance(e, sockets.NoSubscriber) for e in errors):
            gone.append((delivery_id, token))  # its connections are gone: an offline recipient
        elif any(isinstance(e, (RedisError, OSError)) for e in errors):
            unpushed.append((delivery_id, token))
        else:
            failed.append((delivery_id, token))
    deliveries_park(claims=offline + gone)
    deliveries_release(claims=unpushed, park=False)
    if failed:
        first_error = next(e for e in failures.values() if not isinstance(e, sockets.NoSubscriber))
        deliveries_fail(claims=failed, error=f"push failed: {first_error!r}"[:500])
    return RouteOutcome(pushed=len(channels_of) - len(unreached), offline=len(offline) + len(gone),
                        released=len(unpushed), failed=len(failed))


def _targets(row: ClaimedRow, connections: list[cache.LiveConnection]) -> list[cache.LiveConnection]:
    """The connections a row is pushed to: all of its recipient's, but a request's outcome goes to
    the session that asked only (messaging.requests.sessions); none open: parked, for a fetch."""
    if row.kind in OUTCOME_KINDS and (session := request_meta_read(row.reference).get("s")):
        return [conn for conn in connections if conn.session == session]
    return connections
