"""The one door from "stored" to "routed": work handed to the Celery workers by task name.

Whatever commits deliveries (a send, a confirmation, a re-queue, a dead node's settlement) hands
their ids through here, once committed; webhook calls leave the same way, on a queue of their own. Tasks are named, not
imported: this module imports nothing of messaging, so nothing that stores a message depends on
the code that routes it (messaging.tasks, run by the workers), and no import cycle can run
through the hand-off.

A web node batches before it hands over: its routing batcher (messaging.runtime) gathers what its
connections commit within ROUTING_LINGER_SECONDS and calls `routing_enqueue` once for them. The
node passes that batcher to whatever it stores with, as the `route` argument (`Route`); everyone
else hands over one task per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery import current_app

from foundation.transport.redis_clients import sync_client

Route = Callable[[Sequence[int]], None]  # takes committed delivery ids on their way to routing

ROUTE_TASK = "messaging.tasks.route_deliveries"
ROUTING_QUEUE = "routing"
ROUTING_TASK_MAX_IDS = 500  # keeps one task's claim statement and its pushes short
WEBHOOK_TASK = "messaging.tasks.webhook_deliver"
# Webhook calls wait on tenants' receivers: a queue of their own, served by a worker of their own
# (`-Q webhooks`), so a slow receiver never holds a thread that routing needs.
WEBHOOK_QUEUE = "webhooks"
# The domain network (messaging.network): a link's sender, and receipts on their way to the origin.
# A queue of their own: a forwarding call waits on a neighbour (up to FORWARD_TIMEOUT_SECONDS), and a
# link that is down must never hold a thread that routing needs. Served by make run's worker
# (`-Q celery,routing,forwarding`).
FORWARD_LINK_TASK = "messaging.tasks.forward_link"
FORWARD_RECEIPTS_TASK = "messaging.tasks.forward_receipts"
FORWARDING_QUEUE = "forwarding"
FLOOD_TASK = "messaging.tasks.flood_link"  # a link's queue of channel publishes
# "A wake-up of this link's flood sender is on its way": publishes made before the sender starts need
# no wake-up of their own (it sends the whole queue). Expires, so a wake-up lost with a worker (or a
# "forwarding" queue nobody serves) costs one task per link per this many seconds, not one per publish.
FLOOD_WAKE_KEY = "sb:flood:wake:{peer}"
FLOOD_WAKE_SECONDS = 10


def routing_enqueue(delivery_ids: Sequence[int]) -> None:
    """One routing task per ROUTING_TASK_MAX_IDS committed deliveries."""
    ids = list(delivery_ids)
    for start in range(0, len(ids), ROUTING_TASK_MAX_IDS):
        current_app.send_task(ROUTE_TASK, args=[ids[start:start + ROUTING_TASK_MAX_IDS]], queue=ROUTING_QUEUE)


def webhook_calls_enqueue(delivery_ids: Sequence, claim: int) -> None:
    """One task per recorded webhook call (each waits on a different receiver), under `claim`."""
    for delivery_id in delivery_ids:
        current_app.send_task(WEBHOOK_TASK, args=[str(delivery_id), claim], queue=WEBHOOK_QUEUE)


def flood_links_enqueue(peers: Sequence[str]) -> None:
    """Wake the channel-publish sender of each link to `peers`, unless a wake-up is already on its
    way (one sender runs per link at a time; the flood sweep makes up for a wake-up that is lost)."""
    if not peers:
        return
    pipe = sync_client().pipeline(transaction=False)
    for peer in peers:
        pipe.set(FLOOD_WAKE_KEY.format(peer=peer), b"1", nx=True, ex=FLOOD_WAKE_SECONDS)
    for peer, first in zip(peers, pipe.execute(), strict=True):
        if first:
            current_app.send_task(FLOOD_TASK, args=[peer], queue=FORWARDING_QUEUE)


def flood_link_woken(peer: str) -> None:
    """The link's sender starts: a publish from now on needs a wake-up of its own again."""
    sync_client().delete(FLOOD_WAKE_KEY.format(peer=peer))


def link_recovered_enqueue(peer: str) -> None:
    """A link answers again after being down: its queues are sent now, not at their next retry."""
    current_app.send_task(FORWARD_LINK_TASK, args=[peer], queue=FORWARDING_QUEUE)
    current_app.send_task(FLOOD_TASK, args=[peer], queue=FORWARDING_QUEUE)


def forward_links_kick(peers: Sequence[str]) -> None:
    """Wake the sender of each link (one task per neighbour; a sender already running makes the
    extra task a no-op, messaging.network.outbox)."""
    for peer in sorted(set(peers)):
        current_app.send_task(FORWARD_LINK_TASK, args=[peer], queue=FORWARDING_QUEUE)


def receipts_enqueue(*, delivery_ids: Sequence[int] = (), receipts: Sequence[dict] = ()) -> None:
    """Receipts for the origin domains of these deliveries (delivered or dead here), or receipts
    passing through on their way (messaging.network.receipts)."""
    if delivery_ids or receipts:
        current_app.send_task(FORWARD_RECEIPTS_TASK, kwargs={"delivery_ids": list(delivery_ids),
                                                             "receipts": list(receipts)}, queue=FORWARDING_QUEUE)
