"""Channel publishes, history and server-managed subscriptions.

A publish is two steps. First `channel_publish` appends to the channel's history in one
statement: the channel row's upsert hands out the next offset and holds the row's lock until
commit, so offsets are gap-free and increase in commit order. Then, once committed, the fan-out
publishes `{offset, content}` on the channel's Redis pub/sub channel, which every web node with a
reader of the channel listens on (messaging.channels.hub); the answer is how many readers the
cluster has. Readers deliver in offset order and repair any gap (a publish overtaken by a later
one, a Redis hiccup) from the history, so a reader misses nothing and sees nothing twice.

Across domains (messaging.federation.flood) every domain keeps the whole history of every channel,
each under its own offsets: a publish is queued to this domain's neighbours in the statement that
stores it, and one flooded here from elsewhere takes this domain's next offset (stored once, however
many neighbours bring it). A reader reads, and resumes from, the history of the domain it is on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from foundation import handoff
from foundation.transport import sockets
from foundation.transport.redis_clients import sync_client
from messaging.channels import registry
from messaging.channels.models import Subscription
from messaging.core import metrics
from messaging.core.next_hop import neighbours
from messaging.webhooks.models import WebhookEvent
from messaging.webhooks.services import WebhookNotice, webhooks_record
from presence import cache


@dataclass(frozen=True)
class Published:
    channel: str
    offset: int
    subscribers: int  # live readers the publish went out to (cluster-wide, at that moment)


# The tail both publishes share: the history row, and (the flood, messaging.federation.flood) one queue
# row per neighbour the publish goes on to, in the same statement and so the same transaction.
_STORE_AND_QUEUE = """
    m AS (
        INSERT INTO messaging_channelmessage (channel_id, "offset", content, publisher, origin_domain, origin_offset,
                                              created_at)
        SELECT id, last_offset, %(content)s, %(publisher)s, %(origin_domain)s, %(origin_offset)s, now() FROM ch
        RETURNING id, "offset"
    ),
    f AS (
        INSERT INTO messaging_channelforward (publish_id, peer, attempts, last_error, path, created_at)
        SELECT m.id, p.peer, 0, '', %(path)s, now() FROM m CROSS JOIN unnest(%(peers)s::varchar[]) AS p(peer)
    )
    SELECT "offset" FROM m
"""


def channel_publish(*, app_id: int, channel: str, content: str, publisher: str = "") -> int:
    """Append `content` to the channel's history; returns its offset. Fan-out is the caller's
    next step, after commit (channel_fanout). Where this domain has neighbours, the publish is
    queued to each of them in the same statement and their senders are woken once committed."""
    peers = neighbours()
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH ch AS (
                INSERT INTO messaging_channel (app_id, name, last_offset, created_at)
                VALUES (%(app_id)s, %(channel)s, 1, now())
                ON CONFLICT (app_id, name) DO UPDATE SET last_offset = messaging_channel.last_offset + 1
                RETURNING id, last_offset
            ),
            """ + _STORE_AND_QUEUE,
            {"app_id": app_id, "channel": channel, "content": content, "publisher": publisher[:128],
             "origin_domain": "", "origin_offset": None, "path": settings.DOMAIN_NAME, "peers": peers},
        )
        offset = cur.fetchone()[0]
    if peers:
        transaction.on_commit(lambda: handoff.flood_links_enqueue(peers))
    return offset


def channels_lock(*, keys: Sequence[tuple[int, str]]) -> None:
    """Take the row locks of channels (app id, name), creating those that do not exist yet, in one
    fixed order (until the transaction ends): a transaction that publishes on several channels
    takes them all first, so two such transactions never wait for each other in a cycle."""
    keys = sorted(set(keys))
    if not keys:
        return
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO messaging_channel (app_id, name, last_offset, created_at)
            SELECT k.app_id, k.name, 0, now() FROM unnest(%s::bigint[], %s::varchar[]) AS k(app_id, name)
             ORDER BY k.app_id, k.name
            ON CONFLICT (app_id, name) DO UPDATE SET last_offset = messaging_channel.last_offset
            """,
            [[k[0] for k in keys], [k[1] for k in keys]],
        )


def channel_publish_forwarded(*, app_id: int, channel: str, content: str, publisher: str, origin_domain: str,
                              origin_offset: int, path: str, forward_to: Sequence[str]) -> int | None:
    """Store a publish another domain flooded here under this domain's next offset, queued on to
    `forward_to` with `path` (the domains it passed, ending here); None if this domain has it
    already (channel_publish_forwarded_once). The caller wakes the senders after commit.

    Two statements, because a duplicate must not take an offset (offsets are gap-free): the
    first takes the channel row's lock (creating the channel if need be), so the second, whose
    snapshot is taken after the lock, sees a copy another call committed meanwhile."""
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO messaging_channel (app_id, name, last_offset, created_at) VALUES (%s, %s, 0, now())
            ON CONFLICT (app_id, name) DO UPDATE SET last_offset = messaging_channel.last_offset
            RETURNING id
            """,
            [app_id, channel],
        )
        channel_id = cur.fetchone()[0]
        cur.execute(
            """
            WITH ch AS (
                UPDATE messaging_channel SET last_offset = last_offset + 1
                 WHERE id = %(channel_id)s AND NOT EXISTS (
                       SELECT 1 FROM messaging_channelmessage
                        WHERE channel_id = %(channel_id)s AND origin_domain = %(origin_domain)s
                          AND origin_offset = %(origin_offset)s)
                RETURNING id, last_offset
            ),
            """ + _STORE_AND_QUEUE,
            {"channel_id": channel_id, "content": content, "publisher": publisher[:128],
             "origin_domain": origin_domain, "origin_offset": origin_offset, "path": path, "peers": list(forward_to)},
        )
        row = cur.fetchone()
    return None if row is None else row[0]


def _payload(offset: int, content: str) -> str:
    return json.dumps({"o": offset, "c": content}, separators=(",", ":"), ensure_ascii=False)


def channel_fanout(*, app_id: int, channel: str, offset: int, content: str) -> int:
    """Send a committed publish to every node reading the channel; returns the readers there are."""
    pipe = sync_client().pipeline(transaction=False)
    pipe.publish(registry.fanout_key(app_id, channel), _payload(offset, content))
    pipe.hvals(registry.registry_key(app_id, channel))
    _, counts = pipe.execute()
    return sum(int(c) for c in counts)


def channel_publish_and_fanout(*, app_id: int, channel: str, content: str, publisher: str = "") -> Published:
    """Publish from sync code (the REST API, `manage.py send`): stored, then fanned out."""
    with transaction.atomic():
        offset = channel_publish(app_id=app_id, channel=channel, content=content, publisher=publisher)
    try:
        subscribers = channel_fanout(app_id=app_id, channel=channel, offset=offset, content=content)
    except Exception:
        # Stored but not pushed (Redis away): readers find it in the history at their next
        # message or reconnect; nobody is known to have been reached.
        subscribers = 0
    return Published(channel=channel, offset=offset, subscribers=subscribers)


@dataclass(frozen=True)
class HistoryItem:
    offset: int
    content: str


def channel_history(*, app_id: int, channel: str, after: int, upto: int | None = None,
                    limit: int = 1000) -> list[HistoryItem]:
    """Messages after offset `after` (and up to `upto`), oldest first (the (channel, offset) index)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT m."offset", m.content FROM messaging_channelmessage m
              JOIN messaging_channel c ON c.id = m.channel_id
             WHERE c.app_id = %s AND c.name = %s AND m."offset" > %s AND (%s::bigint IS NULL OR m."offset" <= %s)
             ORDER BY m."offset" LIMIT %s
            """,
            [app_id, channel, after, upto, upto, limit],
        )
        return [HistoryItem(*row) for row in cur.fetchall()]


def channel_heads(*, app_id: int, channels: list[str]) -> dict[str, int]:
    """The latest offset of each channel (0 for one never published to)."""
    if not channels:
        return {}
    with connection.cursor() as cur:
        cur.execute("SELECT name, last_offset FROM messaging_channel WHERE app_id = %s AND name = ANY(%s)",
                    [app_id, list(channels)])
        heads = dict(cur.fetchall())
    return {name: heads.get(name, 0) for name in channels}


def channel_occupancy_record(*, app_id: int, channel: str, occupied: bool) -> None:
    """A channel got its first reader in the cluster (occupied) or lost its last one (vacated):
    counted, and announced to the app's webhooks that want it (no query when none does)."""
    metrics.CHANNEL_OCCUPANCY.labels("occupied" if occupied else "vacated").inc()
    event = WebhookEvent.CHANNEL_OCCUPIED if occupied else WebhookEvent.CHANNEL_VACATED
    webhooks_record(notices=[WebhookNotice(app_id=app_id, event=event.value, data={"channel": channel})])


# --- server-managed subscriptions ----------------------------------------------------------------


def _tell_connections(user_id: str, event: sockets.Event) -> None:
    conns = cache.connections_of_many([user_id])[user_id]
    sockets.send_many_sync((c.channel_name, event) for c in conns)


def subscription_add(*, app_id: int, subscriber: str, channel: str) -> bool:
    """Subscribe a user to a channel (durably); its live connections join at once. True if new."""
    created = Subscription.objects.get_or_create(app_id=app_id, subscriber=subscriber, channel=channel)[1]
    transaction.on_commit(lambda: _tell_connections(subscriber, sockets.channel_join_event(channel)))
    return created


def subscription_remove(*, app_id: int, subscriber: str, channel: str) -> bool:
    """End a durable subscription; the user's live connections leave the channel. True if it existed."""
    deleted, _ = Subscription.objects.filter(app_id=app_id, subscriber=subscriber, channel=channel).delete()
    transaction.on_commit(lambda: _tell_connections(subscriber, sockets.channel_leave_event(channel)))
    return bool(deleted)
