"""What the Pusher HTTP API does: publish events on Pusher channels (Switchboard channels pusher.X,
messaging.gateway.pusher.protocol) and tell who is on them (the cluster's channel registry and the
presence members in Redis)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection, transaction

from foundation.transport.redis_clients import sync_client
from messaging.channels import registry
from messaging.channels.services import HistoryItem, channel_fanout, channel_publish, channels_lock
from messaging.gateway.pusher import presence
from messaging.gateway.pusher import protocol as p

PUBLISHER = "pusher-api"


@dataclass(frozen=True)
class EventToPublish:
    channels: Sequence[str]  # Pusher channel names
    name: str
    data: str
    socket_id: str | None = None


def pusher_events_publish(*, app_id: int, events: Sequence[EventToPublish]) -> None:
    """Store every event on every channel it names in one transaction (the channels' rows locked in
    one order first, so two batches never wait on each other in a cycle), then fan them out."""
    published: list[tuple[str, int, str]] = []
    with transaction.atomic():
        channels_lock(keys=[(app_id, p.switchboard_channel(c)) for e in events for c in e.channels])
        for event in events:
            content = p.envelope(event.name, event.data, socket_id=event.socket_id)
            for channel in event.channels:
                sb = p.switchboard_channel(channel)
                published.append((sb, channel_publish(app_id=app_id, channel=sb, content=content,
                                                      publisher=PUBLISHER), content))
    for sb, offset, content in published:
        try:
            channel_fanout(app_id=app_id, channel=sb, offset=offset, content=content)
        except Exception:  # noqa: BLE001  (stored: readers repair from the history at their next event)
            pass


def cached_event(*, app_id: int, channel: str, offset: int, ttl_seconds: int) -> HistoryItem | None:
    """A cache channel's last event (the message at `offset`, its head) when it was stored within
    `ttl_seconds`; None when older, gone or never there (pusher:cache_miss)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT m."offset", m.content FROM messaging_channelmessage m
              JOIN messaging_channel c ON c.id = m.channel_id
             WHERE c.app_id = %s AND c.name = %s AND m."offset" = %s
               AND m.created_at > now() - make_interval(secs => %s)
            """,
            [app_id, channel, offset, ttl_seconds],
        )
        row = cur.fetchone()
    return HistoryItem(*row) if row else None


def subscription_count(app_id: int, channel: str) -> int:
    return registry.readers_count(app_id, p.switchboard_channel(channel))


def user_count(app_id: int, channel: str) -> int:
    return len(presence.members_read_sync(app_id, p.switchboard_channel(channel)))


def users_of(app_id: int, channel: str) -> list[str]:
    return sorted(presence.members_read_sync(app_id, p.switchboard_channel(channel)))


def channels_occupied(app_id: int, prefix: str = "") -> dict[str, int]:
    """The app's Pusher channels with at least one subscriber in the cluster (any reader of pusher.X:
    Pusher connections and native ones), each with its subscription count; names starting with `prefix`."""
    client = sync_client()
    match = registry.registry_key(app_id, _glob_escape(p.switchboard_channel(prefix))) + "*"
    keys = list(client.scan_iter(match=match, count=1000))
    if not keys:
        return {}
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hvals(key)
    head = len(registry.registry_key(app_id, ""))
    out = {}
    for key, values in zip(keys, pipe.execute(), strict=True):
        count = sum(int(v) for v in values)
        name = p.pusher_channel((key.decode() if isinstance(key, bytes) else key)[head:])
        if count > 0 and name is not None:
            out[name] = count
    return out


def users_terminate(app_id: int, user_id: str) -> None:
    """Close the user's signed-in connections wherever they are: a signal on its user channel
    (messaging.gateway.pusher.presence.channel_signal), which every such connection reads."""
    client = sync_client()
    client.publish(registry.fanout_key(app_id, p.user_channel(user_id)), '{"s":{"e":"terminate"}}')


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
