"""Write-side services of messaging (see the modules for the guarantees each one keeps)."""

from __future__ import annotations

from .dead_letters import dead_letters_discard, dead_letters_requeue
from .deliveries import (
    ClaimedRow,
    FailResult,
    SweepResult,
    claim_token,
    deliveries_claim,
    deliveries_expire,
    deliveries_fail,
    deliveries_mark_delivered,
    deliveries_park,
    deliveries_release,
    deliveries_requeue_for_users,
    deliveries_sweep,
    deliveries_unacked_for,
)
from .fast import message_fast_send
from .fetch import FetchResult, missing_fetch
from .nodes import dead_nodes_settle
from .persist import OutgoingMessage, SendResult, message_send, messages_store
from .presence import user_presence_announce
from .server_sends import (
    SendRefused,
    ServerSendResult,
    app_channel_require,
    app_user_require,
    content_require,
    server_channel_publish,
    server_message_send,
)

__all__ = [
    "ClaimedRow", "FailResult", "FetchResult", "OutgoingMessage", "SendRefused", "SendResult", "ServerSendResult",
    "SweepResult", "app_channel_require", "app_user_require", "claim_token", "content_require", "message_fast_send",
    "server_channel_publish", "server_message_send",
    "dead_letters_discard", "dead_letters_requeue", "dead_nodes_settle", "deliveries_claim", "deliveries_expire",
    "deliveries_fail", "deliveries_mark_delivered", "deliveries_park", "deliveries_release",
    "deliveries_requeue_for_users", "deliveries_sweep", "deliveries_unacked_for", "message_send",
    "messages_store", "missing_fetch", "user_presence_announce",
]
