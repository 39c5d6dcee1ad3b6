"""Celery tasks of messaging. Each takes ids, calls one service and is safe to run twice."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db import DatabaseError
from redis import RedisError

log = logging.getLogger(__name__)


@shared_task(
    bind=True, acks_late=True, autoretry_for=(DatabaseError, RedisError, OSError), retry_backoff=1,
    retry_backoff_max=60, retry_jitter=True, max_retries=None,
)
def route_deliveries(self, delivery_ids: list[int]) -> dict:
    """Push committed deliveries to their recipients (infrastructure errors retry the task;
    per-delivery failures become delivery retries)."""
    from django.db import close_old_connections

    from messaging.router import deliveries_route

    try:
        outcome = deliveries_route(delivery_ids)
    except DatabaseError:
        close_old_connections()  # a broken connection is replaced before the retry
        raise
    return {"pushed": outcome.pushed, "offline": outcome.offline, "failed": outcome.failed}


@shared_task(acks_late=True)
def retry_sweep() -> dict:
    """Beat: time out unconfirmed pushes, route retries that are due, and re-route pending rows of
    connected users whose routing task was lost (a crashed worker or node never strands a message)."""
    from django.conf import settings

    from messaging.dispatch import routing_task_send
    from messaging.services import deliveries_pending_for_online, deliveries_sweep
    from presence.selectors import online_users

    result = deliveries_sweep()
    routing_task_send(result.due)
    stranded = deliveries_pending_for_online(users=online_users(), older_than=timedelta(seconds=settings.STRANDED_AFTER_SECONDS))
    routing_task_send(stranded)
    if result.timed_out or result.due or stranded:
        log.info("retry sweep: %d timed out, %d due, %d stranded", result.timed_out, len(result.due), len(stranded))
    return {"timed_out": result.timed_out, "due": len(result.due), "stranded": len(stranded)}


@shared_task(acks_late=True)
def expire_deliveries() -> int:
    """Beat: undelivered messages past their app's retention become expired."""
    from messaging.services import deliveries_expire

    return deliveries_expire()
