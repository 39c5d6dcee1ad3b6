"""Celery tasks of the configuration registry (found by config.celery's autodiscover_tasks: this
app is in INSTALLED_APPS). Each takes ids (here: none), calls one service and is safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task

from apps_registry.meta import MetaPullError
from apps_registry.meta import meta_pull as meta_pull_service

log = logging.getLogger(__name__)


@shared_task(acks_late=False, ignore_result=True)
def meta_pull() -> str:
    """The beat's pull of the meta domain's configuration (settings.NETWORK_BEAT_SCHEDULE, only when
    META_URL is set). A failure is recorded on the meta state and logged; the next beat tries again."""
    try:
        return str(meta_pull_service())
    except MetaPullError as exc:
        return f"failed: {exc}"
