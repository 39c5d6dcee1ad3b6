"""Celery tasks of messaging. Each takes ids, calls one service and is safe to run twice.

Nothing in the product imports this module: work reaches these tasks by name, through the door of
foundation.handoff (and the beat schedule in the settings).
"""

from __future__ import annotations

import logging

from celery import shared_task as _celery_task
from celery.signals import worker_ready, worker_shutting_down
from django.db import DatabaseError, close_old_connections
from redis import RedisError

from foundation.backoff import Backoff
from foundation.handoff import (
    FLOOD_TASK,
    FORWARD_LINK_TASK,
    FORWARD_RECEIPTS_TASK,
    FORWARDING_QUEUE,
    ROUTING_QUEUE,
    STANDBY_TASK,
    flood_links_enqueue,
    link_sender_run,
    routing_enqueue,
    standby_senders_kick,
    webhook_calls_enqueue,
)
from foundation.transport.queue_names import queue_client
from messaging.channels.retention import channel_history_expire
from messaging.core.delivery.expiry import deliveries_expire
from messaging.core.delivery.lost_nodes import lost_nodes_settle
from messaging.core.delivery.retry import deliveries_sweep
from messaging.core.idempotency import idempotency_keys_expire
from messaging.federation.control_loop import control_loop_start, control_loop_stop
from messaging.federation.presence_gossip import presence_gossip
from messaging.federation.senders.fast_forward import fast_forward
from messaging.federation.senders.flood_sender import flood_link_send, flood_links_due
from messaging.federation.senders.outbox import link_forward
from messaging.federation.senders.queue import forward_sweep as network_forward_sweep
from messaging.federation.senders.receipts import receipts_link_send
from messaging.federation.standby.copy import standby_send, standbys_due, standbys_waiting
from messaging.federation.takeover import take as takeover
from messaging.federation.wire.probes import links_probe
from messaging.intake.stream.credentials import credential_app_names, queue_acl_sync
from messaging.intake.stream.gate import queue_gates_enforce
from messaging.intake.stream.runner import queue_consumer_start, queue_consumer_stop
from messaging.requests.retention import requests_purge as requests_purge_service
from messaging.requests.services import requests_time_out as requests_time_out_service
from messaging.requests.sessions import client_sessions_time_out
from messaging.requests.webhook import READERS as REQUEST_READERS
from messaging.routing.router import deliveries_route
from messaging.webhooks.delivery import webhook_attempt, webhook_deliveries_purge, webhooks_sweep
from presence.lost_nodes import nodes_reap

log = logging.getLogger(__name__)

# The tasks' names are what the broker carries and the settings (beat, routes) and foundation.handoff
# name: `messaging.tasks.<function>`, kept from before this module moved into messaging.routing, so
# a task queued by a node of the previous release still finds its function after an upgrade.
TASK_NAME_PREFIX = "messaging.tasks"


def shared_task(fn=None, **options):
    """Celery's shared_task, with the task's stable name (TASK_NAME_PREFIX) in place of this module's."""
    if fn is not None:
        return _celery_task(name=f"{TASK_NAME_PREFIX}.{fn.__name__}")(fn)
    return lambda f: _celery_task(name=f"{TASK_NAME_PREFIX}.{f.__name__}", **options)(f)


# A routing task that met an infrastructure error (Postgres or Redis away) runs again after this.
ROUTE_TASK_BACKOFF = Backoff(base=1.0, cap=60.0, jitter=0.5)


# Acked on receipt: a routing task lost with its worker is recovered by the sweep (rows not routed
# within ROUTING_DEADLINE_SECONDS are handed out again under a lease), not by the broker, whose
# redelivery of unacked tasks on Redis waits for the visibility timeout (300 s, config.celery).
@shared_task(bind=True, acks_late=False, max_retries=None)
def route_deliveries(self, delivery_ids: list[int]) -> dict:
    """Push committed deliveries to their recipients (infrastructure errors retry the task after
    ROUTE_TASK_BACKOFF; per-delivery outcomes are recorded on the rows)."""
    try:
        outcome = deliveries_route(delivery_ids)
    except (DatabaseError, RedisError, OSError) as exc:
        if isinstance(exc, DatabaseError):
            close_old_connections()  # a broken connection is replaced before the retry
        raise self.retry(exc=exc, countdown=ROUTE_TASK_BACKOFF.seconds(self.request.retries + 1)) from None
    return {"pushed": outcome.pushed, "offline": outcome.offline, "released": outcome.released,
            "failed": outcome.failed, "elsewhere": outcome.elsewhere}


@shared_task(acks_late=True)
def retry_sweep() -> dict:
    """Beat: count unconfirmed pushes as failed attempts, and hand retries that are due, and rows
    whose routing never came, to routing under a lease (a crashed worker or node never strands a
    message, and a routing queue that is behind is not fed the same rows again)."""
    result = deliveries_sweep()
    routing_enqueue(result.due)
    if result.timed_out or result.due:
        log.info("retry sweep: %d timed out (%d now dead), %d handed to routing", len(result.timed_out),
                 len(result.dead), len(result.due))
    return {"timed_out": len(result.timed_out), "dead": len(result.dead), "due": len(result.due)}


@shared_task(acks_late=True)
def reap_dead_nodes() -> dict:
    """Beat: presence declares silent web nodes dead (presence.lost_nodes); messaging re-queues what
    was in flight to their users."""
    reaped = nodes_reap()
    requeued = lost_nodes_settle(reaped=reaped)
    return {"nodes": [r.node_id for r in reaped], "sessions": sum(r.sessions for r in reaped), "requeued": requeued}


@shared_task(acks_late=True)
def expire_deliveries() -> int:
    """Beat: undelivered messages past their app's retention become expired."""
    return deliveries_expire()


@shared_task(acks_late=True)
def webhook_deliver(delivery_id: str, claim: int) -> str:
    """One attempt of a webhook call handed out under `claim` (messaging.webhooks.delivery). Safe
    twice: a second run finds the claim gone and sends nothing. Its retry policy is the row's own
    (backoff, dead after WEBHOOK_MAX_ATTEMPTS), not Celery's: a task lost with its worker is made
    up for by the sweep once the hand-out's lease runs out. Routed to the webhooks queue
    (foundation.handoff); bounded by the call's own deadline, WEBHOOK_TIMEOUT_SECONDS (the threads
    pool does not enforce Celery's time limits)."""
    return webhook_attempt(delivery_id=delivery_id, claim=claim, readers=REQUEST_READERS)


@shared_task(acks_late=True)
def requests_time_out() -> int:
    """Beat: requests past their deadline are rejected (`reason: "timeout"`, messaging.requests). Safe
    twice: a closed request is never closed again."""
    return requests_time_out_service()


@shared_task(acks_late=True)
def sessions_time_out() -> int:
    """Beat: resumable sessions unused for SESSION_TIMEOUT_SECONDS end; what waited for them is
    discarded (messaging.requests.sessions). Safe twice: an ended session never ends again."""
    return client_sessions_time_out()


@shared_task(acks_late=True)
def requests_purge() -> int:
    """Beat: closed requests older than REQUEST_RETENTION_DAYS go."""
    return requests_purge_service()


@shared_task(acks_late=True)
def webhook_hand_out(delivery_ids: list[str], claim: int) -> int:
    """Recorded webhook calls handed over together (foundation.handoff.webhook_calls_hand_over): each
    gets its own webhook_deliver task, on the webhooks queue. Safe twice: a duplicate call task finds
    the claim taken and sends nothing."""
    webhook_calls_enqueue(delivery_ids, claim)
    return len(delivery_ids)


@shared_task(acks_late=True)
def webhook_sweep() -> int:
    """Beat: hand out webhook calls that are due again (retries, and those whose task was lost)."""
    ids, claim = webhooks_sweep()
    webhook_calls_enqueue(ids, claim)
    return len(ids)


@shared_task(acks_late=True)
def webhook_purge() -> int:
    """Beat: webhook delivery records past WEBHOOK_RETENTION_DAYS go."""
    return webhook_deliveries_purge()


@shared_task(acks_late=True)
def expire_idempotency_keys() -> int:
    """Beat: the server API's Idempotency-Keys older than API_IDEMPOTENCY_HOURS are dropped."""
    return idempotency_keys_expire()


@shared_task(acks_late=True)
def expire_channel_history() -> int:
    """Beat: channel history past its app's retention goes, oldest first, in bounded batches."""
    return channel_history_expire()


# --- the domain network (messaging.federation) ------------------------------------------------------


@shared_task(acks_late=True)
def probe_links() -> dict:
    """Beat: ping every neighbour over an enabled link and record each link's state."""
    results = links_probe()
    return {r.peer: "up" if r.ok else r.error for r in results}


@shared_task
def gossip_presence() -> dict:
    """(A gossip round asked for by a process that runs none itself, foundation.handoff.gossip_now;
    the rounds due run in messaging.federation.control_loop.) Tell every neighbour who is online here and what this domain heard of the others
    (messaging.federation.presence_gossip); best effort, the next round says it all again."""
    return presence_gossip()


@shared_task(acks_late=True)
def flood_link(peer: str) -> dict:
    """Send the channel publishes waiting on the link to `peer` (queue "forwarding"). Safe twice
    and at once: one sender per link (the second finds it busy); its retry policy is the rows'
    own (attempts, dead after the app's max_delivery_attempts), and flood_sweep makes up for a
    wake-up that is lost."""
    return link_sender_run(FLOOD_TASK, peer, lambda: flood_link_send(peer=peer).as_dict())


@shared_task(acks_late=True)
def flood_sweep() -> list[str]:
    """Beat: wake the senders of links with channel publishes waiting and their retry due."""
    peers = flood_links_due()
    flood_links_enqueue(peers)
    return peers


@shared_task(acks_late=True)
def forward_link(peer: str) -> dict:
    """Send what waits on the link to `peer` (messaging.federation.senders.outbox). Safe twice: one sender per
    link at a time (an advisory lock); a second run returns at once. Its retry policy is the
    link's own backoff (LinkHealth.retry_at) and the rows' attempts, not Celery's: the beat's
    forward_sweep wakes the link again when its retry is due, and makes up for a lost task."""
    return link_sender_run(FORWARD_LINK_TASK, peer, lambda: link_forward(peer=peer))


@shared_task(acks_late=True)
def forward_sweep() -> dict:
    """Beat: move the queues of links that are down to other paths, and wake every link whose
    retry is due (messaging.federation.senders.queue)."""
    return network_forward_sweep()


@shared_task
def forward_fast(item: dict) -> dict:
    """Carry a FAST item one hop towards its recipients' homes (messaging.federation.senders.fast_forward):
    once, within FORWARD_TIMEOUT_SECONDS per hop; never retried (FAST)."""
    return fast_forward(item)


@shared_task(acks_late=True)
def standby_copy(standby: str) -> dict:
    """Send the live copy waiting for `standby` (messaging.federation.standby.copy). Safe twice: one sender
    per standby at a time; its retry policy is the link's backoff (the feed waits in its table)."""
    return link_sender_run(STANDBY_TASK, standby, lambda: standby_send(standby=standby))


@worker_shutting_down.connect
def standby_flush_on_stop(sig=None, how=None, exitcode=None, **_) -> None:
    """A domain stopped on purpose (a warm shutdown: its web nodes drained first, so no ACK comes
    any more) sends its standbys what their copy still lacks before its worker goes, within one
    sender's budget each: its standby then takes its users over with every ACK read before the stop."""
    if how != "Warm":
        return
    for standby in standbys_waiting():
        try:
            standby_send(standby=standby)
        except Exception:  # the stop goes on; the feed waits for the next start
            log.exception("sending the live copy to %s before stopping failed", standby)


@shared_task(acks_late=True)
def standby_sweep() -> list[str]:
    """Beat: wake the live-copy sender of every standby with changes waiting and its link's retry due."""
    due = standbys_due()
    standby_senders_kick(due)
    return due


@shared_task
def takeover_watch() -> dict[str, str]:
    """(By hand; the looks due run in messaging.federation.control_loop.) Take over a lost home this domain stands by for, or hand one back that answers again
    (messaging.federation.takeover.take). Each look decides afresh: a lost run is made up by the next."""
    return takeover.takeover_watch()


@shared_task(acks_late=True)
def takeover_given_back(holder: str) -> dict:
    """This domain got its users back from `holder`: what it was forwarding them there into their
    mailboxes, and their mailboxes to the standby again (messaging.federation.takeover.take). Safe twice:
    the second finds nothing forwarding, and the standby takes a copy sent twice the same."""
    return takeover.given_back(holder)


@shared_task(acks_late=True)
def forward_receipts(peer: str) -> dict:
    """Send the receipts waiting on the link to `peer` (messaging.federation.senders.receipts). Safe twice:
    one sender per link at a time. Its retry policy is the link's backoff: the receipts wait in
    their table, and the beat's forward_sweep wakes the link again when its retry is due."""
    return link_sender_run(FORWARD_RECEIPTS_TASK, peer, lambda: receipts_link_send(peer=peer).as_dict())


@worker_ready.connect
def queue_intake_start(sender=None, **_) -> None:
    """A worker serving the routing queue runs a queue intake consumer (messaging.intake.stream.runner)
    for as long as it runs: `make run`, compose and the Procfile start it with no step of their own."""
    if sender is not None and ROUTING_QUEUE in sender.app.amqp.queues.consume_from:
        queue_consumer_start()


@worker_shutting_down.connect
def queue_intake_stop(**_) -> None:
    """Its batch in hand finished first; what it has pending waits for the next consumer."""
    queue_consumer_stop()


@worker_ready.connect
def network_rounds_start(sender=None, **_) -> None:
    """A worker serving the forwarding queue runs the network's gossip round and takeover watch on
    threads of its own, on time whatever that queue holds (messaging.federation.control_loop)."""
    if sender is not None and FORWARDING_QUEUE in sender.app.amqp.queues.consume_from:
        control_loop_start()


@worker_shutting_down.connect
def network_rounds_stop(**_) -> None:
    control_loop_stop()


@shared_task
def queue_intake_sync() -> dict:
    """Beat (on the outbound worker, so it runs when no routing worker does): the apps' queue ACL
    users applied from Postgres (a restarted Redis has none) and every gate set; with no consumer
    alive, the smaller cap (messaging.intake.stream.gate). Each run decides afresh: a lost one is made up."""
    synced = queue_acl_sync()
    gates = queue_gates_enforce(client=queue_client(), app_names=credential_app_names())
    return {"applied": list(synced.applied), "removed": list(synced.removed),
            "closed": [g.app_name for g in gates if not g.writable]}
