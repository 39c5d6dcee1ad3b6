"""Write-side services of messaging (see the modules for the guarantees each one keeps)."""

from __future__ import annotations

from .dead_letters import dead_letters_discard, dead_letters_requeue
from .deliveries import (
    deliveries_claim,
    deliveries_expire,
    deliveries_mark_delivered,
    deliveries_park,
    deliveries_pending_for_online,
    deliveries_requeue_for_users,
    deliveries_retry,
    deliveries_sweep,
    deliveries_unacked_for,
)
from .fetch import FetchResult, missing_fetch
from .persist import SendResult, confirmations_create, message_send

__all__ = [
    "FetchResult", "SendResult", "confirmations_create", "dead_letters_discard", "dead_letters_requeue",
    "deliveries_claim", "deliveries_expire", "deliveries_mark_delivered",
    "deliveries_park", "deliveries_pending_for_online", "deliveries_requeue_for_users", "deliveries_retry",
    "deliveries_sweep", "deliveries_unacked_for", "message_send", "missing_fetch",
]
