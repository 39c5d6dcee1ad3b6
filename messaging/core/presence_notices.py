"""Announcing that a user came online or went offline in the cluster, to everyone who listens:
the app's master user over its sockets (USER_CONNECTED / USER_DISCONNECTED) and the app's
webhooks (user.connected / user.disconnected).

A /ws connection's own comings and goings (messaging.gateway.connection.life) are told in two parts: the
webhook notice travels with the session row, recorded in the transaction that opens or closes the
session (messaging.gateway.connection.admission: one statement and one hand-off per batch of connections,
not a transaction and a hand-off per connection), and the master is told by `master_announce`. The
node heartbeat (users a stale entry kept online) tells both at once (`user_presence_announce`). A
dead node's users are announced by presence's reaper to the master and by `lost_nodes_settle` to
the webhooks (presence may not call up into messaging).
"""

from __future__ import annotations

import logging

from django.conf import settings

from apps_registry.selectors import AppSnapshot
from messaging.models import WebhookEvent
from messaging.webhooks.services import WebhookNotice, webhook_notice_maybe_wanted, webhooks_record_async
from presence.services import ConnectionsLookup, master_notify

log = logging.getLogger(__name__)


def user_presence_notice(*, app_id: int, user_id: str, connected: bool) -> WebhookNotice:
    event = WebhookEvent.USER_CONNECTED if connected else WebhookEvent.USER_DISCONNECTED
    return WebhookNotice(app_id=app_id, event=event.value, data={"userId": user_id, "domain": settings.DOMAIN_NAME})


def user_presence_notice_wanted(*, app_id: int, user_id: str, connected: bool) -> WebhookNotice | None:
    """The webhook notice to carry with a session row, or None when the process's cache knows that
    no endpoint of the app wants it (then the session batch costs nothing more)."""
    notice = user_presence_notice(app_id=app_id, user_id=user_id, connected=connected)
    return notice if webhook_notice_maybe_wanted(notice) else None


async def master_announce(*, app: AppSnapshot, user_id: str, connected: bool,
                          lookup: ConnectionsLookup | None = None) -> None:
    """The master's notice (errors propagate). The master user itself is never told about itself.
    `lookup` finds the master's connections (a web node's batched lookup; else one Redis read)."""
    await master_notify(master_user_id=app.master_user_id,
                        event_type="USER_CONNECTED" if connected else "USER_DISCONNECTED", user_id=user_id,
                        lookup=lookup)


async def user_presence_announce(*, app: AppSnapshot, user_id: str, connected: bool,
                                 lookup: ConnectionsLookup | None = None) -> None:
    """The master's notice (errors propagate, as before), then the webhooks (best effort: a
    failure to record them is logged, never raised). The master user's own connection is announced
    to the webhooks too; only the master itself is never told about itself."""
    await master_announce(app=app, user_id=user_id, connected=connected, lookup=lookup)
    try:
        await webhooks_record_async(notices=[user_presence_notice(app_id=app.pk, user_id=user_id,
                                                                  connected=connected)])
    except Exception:
        log.exception("recording the %s webhook of %s failed", "connect" if connected else "disconnect", user_id)
