"""Group commit for what every connection does once: its session row (open, close) with, where it
was the user's first or last connection in the cluster, the app's user.connected / user.disconnected
webhook event, its entry in the cluster's presence (add, remove), the master's connections looked
up for USER_CONNECTED, and its first reads (the user's server-managed subscriptions; in ACK mode,
what it was sent but never acknowledged).

A reconnect storm brings hundreds of these per tick to a node. Done one by one, each was a thread
hop and a transaction (or a Redis round trip) per connection, most of a node's CPU per
AUTH_CLIENT. The node's batchers (messaging.gateway.runtime) gather them: one transaction (sessions), one
statement pair (first reads) and one Redis pipeline (presence, lookups) per batch. Nothing of the
guarantees changes, because every caller still waits for its own item (`submit`): AUTH_CLIENT_REPLY
is sent only once its session row and connect event are committed, and a batch that fails refuses
every auth waiting on it, each giving back what it took (messaging.gateway.connection.life); each presence
entry runs the same Lua script as alone, so first/last answers stay atomic per connection.

The webhook events ride in the session batch: one recording statement in the sessions' transaction
and one hand-off of the batch's calls after its commit (messaging.webhooks.services), where they
were a thread hop, a transaction and a Celery publish per connection: one tenant's endpoint made
every login on the node dearer. A user.connected event commits with its session, before its
AUTH_CLIENT_REPLY is sent, and a user.disconnected one with its session's close: all or none. (The
recording statement fails only when the transaction would anyway; an endpoint deleted meanwhile is
left out, not an error: messaging.webhooks.services.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from messaging.channels.selectors import subscriptions_of_many
from messaging.core.delivery.claims import deliveries_unacked_for_many
from messaging.webhooks.services import WebhookNotice, webhooks_record
from presence import cache
from presence.services import SessionClosing, SessionOpening, sessions_close, sessions_open


@dataclass(frozen=True)
class SessionOpen:
    session: SessionOpening
    notice: WebhookNotice | None = None  # user.connected: the user's first connection in the cluster


@dataclass(frozen=True)
class SessionEnd:
    session: SessionClosing
    notice: WebhookNotice | None = None  # user.disconnected: the user's last connection in the cluster


@dataclass(frozen=True)
class FirstReadsFor:
    app_id: int
    user_id: str
    acks: bool


@dataclass(frozen=True)
class FirstReads:
    unacked: list[int]  # ACK mode: deliveries to push again, with their ids
    channels: list[str]  # the user's server-managed subscriptions


def first_reads(items: list[FirstReadsFor]) -> list[FirstReads]:
    """One query for the subscriptions of every user in the batch, one for the unacked deliveries
    of its ACK-mode users. A user connecting twice in one batch gets its unacked deliveries once
    (the first of its connections in the batch), as two reads one after the other would."""
    subscriptions = subscriptions_of_many(users=[(i.app_id, i.user_id) for i in items])
    unacked = deliveries_unacked_for_many(users=[(i.app_id, i.user_id) for i in items if i.acks])
    out = []
    for item in items:
        key = (item.app_id, item.user_id)
        out.append(FirstReads(unacked=unacked.pop(key, []) if item.acks else [],
                              channels=subscriptions.get(key, [])))
    return out


def sessions_open_batch(items: list[SessionOpen]) -> None:
    """The batch's sessions and, in the same transaction, their user.connected events."""
    notices = [item.notice for item in items if item.notice is not None]
    with transaction.atomic():
        sessions_open(openings=[item.session for item in items])
        if notices:
            webhooks_record(notices=notices)


def sessions_close_batch(items: list[SessionEnd]) -> None:
    """The batch's sessions closed and, in the same transaction, their user.disconnected events."""
    notices = [item.notice for item in items if item.notice is not None]
    with transaction.atomic():
        sessions_close(closings=[item.session for item in items])
        if notices:
            webhooks_record(notices=notices)


async def presence_add_batch(entries: list[cache.ConnectionEntry]) -> list[bool | Exception]:
    return await cache.connections_add(entries=entries)


async def presence_remove_batch(entries: list[cache.ConnectionEntry]) -> list[bool | Exception]:
    return await cache.connections_remove(entries=entries)


async def connections_lookup_batch(user_ids: list[str]) -> list[list[cache.LiveConnection]]:
    """Every user's connections, each user read once however often it is asked for in the batch
    (a storm's USER_CONNECTED notices all look up the same master)."""
    found = await cache.connections_of_many_async(user_ids)
    return [found[user_id] for user_id in user_ids]


async def fast_lookups_batch(items: list[Sequence[str]]) -> list[dict[str, list[cache.LiveConnection]]]:
    """The connections of the recipients of every FAST send in the batch, in one Redis round trip
    (each user read once): at a few thousand sends a second, a round trip of each send's own was the
    largest part of a web node's CPU per FAST message (issue 47)."""
    found = await cache.connections_of_many_async(user_id for users in items for user_id in users)
    return [{user_id: found[user_id] for user_id in users} for users in items]
