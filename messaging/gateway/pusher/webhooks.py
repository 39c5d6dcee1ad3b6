"""Pusher's webhooks, through Switchboard's (messaging.webhooks: recorded rows, retried, dead-lettered,
shown in the console): an app's webhook endpoint that names `pusher.channel_occupied`,
`pusher.channel_vacated`, `pusher.member_added`, `pusher.member_removed`, `pusher.client_event` or
`pusher.cache_miss` gets them in Pusher's format (`{"time_ms", "events": [{"name", ...}]}` with
`X-Pusher-Key` and `X-Pusher-Signature`: messaging.webhooks.delivery.pusher_call). Nothing is
recorded, and no query made, for an app with no endpoint that wants the event (the webhooks' cache)."""

from __future__ import annotations

import logging
import time
from typing import Any

from messaging.gateway.pusher import protocol as p
from messaging.webhooks.models import PUSHER_EVENT_PREFIX
from messaging.webhooks.services import WebhookNotice, webhooks_record_async

log = logging.getLogger(__name__)


async def pusher_webhook(app_id: int, name: str, /, **data: Any) -> None:
    """Record Pusher webhook `name` (its fields in `data`; client_event has an `event` of its own)."""
    notice = WebhookNotice(app_id=app_id, event=PUSHER_EVENT_PREFIX + name,
                           data={"time_ms": int(time.time() * 1000), **{k: v for k, v in data.items() if v is not None}})
    try:
        await webhooks_record_async(notices=[notice])
    except Exception:  # noqa: BLE001  (the database away: the event is not announced; the connection goes on)
        log.exception("recording the Pusher webhook %s of app %s failed", name, app_id)


async def pusher_occupancy_changed(app_id: int, switchboard_channel: str, occupied: bool) -> None:
    """The channel registry's occupied / vacated (messaging.channels.hub), for a Pusher channel."""
    name = p.pusher_channel(switchboard_channel)
    if name is not None and not name.startswith(p.USER_CHANNEL):
        await pusher_webhook(app_id, "channel_occupied" if occupied else "channel_vacated", channel=name)
