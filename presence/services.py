"""Write-side services of presence: nodes, sessions, and who-is-online announcements."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps_registry.selectors import user_id_parse
from foundation.transport import sockets
from foundation.transport.frames import CLOSE_NORMAL, encode

from . import cache, online, remote
from .events import presence_event_record
from .models import Node, PresenceEventKind, Session


def node_register(*, node_id: str, domain: str) -> None:
    """A node (re)joins: a fresh life under its id (the reaper's stop mark is cleared)."""
    now = timezone.now()
    Node.objects.update_or_create(
        node_id=node_id, defaults={"domain": domain, "started_at": now, "heartbeat_at": now, "stopped_at": None})


def node_heartbeat_record(*, node_id: str) -> bool:
    """Stamp the node's heartbeat; an open session is alive exactly as long as its node is.

    (Sessions are not stamped one by one: that was an UPDATE of every open session per heartbeat,
    measurable per message under load, and it told nothing the node's heartbeat does not.)
    Returns False when the reaper declared the node dead (its row is stopped): the node must then
    close its sockets instead of living on as a ghost whose session rows are already closed.
    """
    now = timezone.now()
    with transaction.atomic():
        updated = Node.objects.filter(node_id=node_id, stopped_at__isnull=True).update(heartbeat_at=now)
        if not updated:
            if Node.objects.filter(node_id=node_id).exists():
                return False
            node_register(node_id=node_id, domain=settings.DOMAIN_NAME)
    return True


def session_open(*, app_id: int, user_id: str, node_id: str, channel_name: str, acks: bool,
                 remote_addr: str, user_agent: str) -> uuid.UUID:
    now = timezone.now()
    with transaction.atomic():
        session = Session.objects.create(
            app_id=app_id, user_id=user_id, node_id=node_id, channel_name=channel_name, acks=acks,
            connected_at=now, last_seen_at=now, remote_addr=remote_addr[:64], user_agent=user_agent[:300])
        presence_event_record(kind=PresenceEventKind.CONNECT, connection_ids=[session.connection_id])
    return session.connection_id


def session_close(*, connection_id: uuid.UUID, close_reason: str = "") -> None:
    now = timezone.now()
    with transaction.atomic():
        Session.objects.filter(pk=connection_id, disconnected_at__isnull=True).update(
            disconnected_at=now, last_seen_at=now)
        presence_event_record(kind=PresenceEventKind.DISCONNECT, connection_ids=[connection_id], close_reason=close_reason)


@dataclass(frozen=True)
class SessionOpening:
    """A session a node opens; its id is made by the node, so the node knows it before the row exists."""

    connection_id: uuid.UUID
    app_id: int
    user_id: str
    node_id: str
    channel_name: str
    acks: bool
    remote_addr: str
    user_agent: str
    connected_at: datetime
    client_session: str = ""  # the resumable session it belongs to (docs/protocol.md, "Sessions")


@dataclass(frozen=True)
class SessionClosing:
    connection_id: uuid.UUID
    close_reason: str


def sessions_open(*, openings: Sequence[SessionOpening]) -> None:
    """Open many sessions in one transaction (a node's group commit of a reconnect storm): one
    multi-row INSERT of the rows and one of their connect events, so each session commits with its
    event, all or none."""
    if not openings:
        return
    columns = list(zip(*((o.connection_id, o.app_id, o.user_id, o.node_id, o.channel_name, o.acks, o.connected_at,
                          o.remote_addr[:64], o.user_agent[:300], o.client_session) for o in openings), strict=True))
    # Within a caller's transaction (a web node's batch records its webhook events with it), no
    # savepoint: the batch is all or none anyway, and a savepoint is two more round trips.
    with transaction.atomic(savepoint=False), connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO presence_session (connection_id, app_id, user_id, node_id, channel_name, acks, connected_at,
                                          last_seen_at, remote_addr, user_agent, client_session)
            SELECT c, a, u, n, ch, k, t, t, r, ua, cs
              FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::bool[],
                          %s::timestamptz[], %s::text[], %s::text[], %s::text[]) AS x(c, a, u, n, ch, k, t, r, ua, cs)
            """,
            [list(column) for column in columns],
        )
        presence_event_record(kind=PresenceEventKind.CONNECT, connection_ids=[o.connection_id for o in openings])


def sessions_close(*, closings: Sequence[SessionClosing]) -> None:
    """Close many sessions in one transaction: one UPDATE, and one disconnect-event INSERT per distinct
    reason (a storm has few: "client closed (1006)" mostly). A session already closed is left as
    it is and records nothing new."""
    if not closings:
        return
    now = timezone.now()
    by_reason: dict[str, list[uuid.UUID]] = {}
    for closing in closings:
        by_reason.setdefault(closing.close_reason, []).append(closing.connection_id)
    with transaction.atomic(savepoint=False):  # no savepoint within a caller's transaction (as above)
        Session.objects.filter(pk__in=[c.connection_id for c in closings], disconnected_at__isnull=True).update(
            disconnected_at=now, last_seen_at=now)
        for reason, ids in by_reason.items():
            presence_event_record(kind=PresenceEventKind.DISCONNECT, connection_ids=ids, close_reason=reason)


def presence_frame(event_type: str, user_id: str) -> str:
    return encode(event_type, {"userId": user_id})


def online_users_frames(users: list[str], *, page_size: int) -> list[str]:
    """ONLINE_USERS frames listing `users`, `page_size` to a frame; one (empty) frame for none."""
    pages = max(1, -(-len(users) // page_size))
    return [encode("ONLINE_USERS", {"users": users[i * page_size:(i + 1) * page_size], "page": i + 1, "pages": pages,
                                    "count": len(users)}) for i in range(pages)]


async def master_online(*, app_name: str, master_user_id: str) -> list[str]:
    """Who is online in the app now, as its master user is told (itself left out, as master_notify
    leaves it out of announcements): one read of this domain's index, so one point in time, and what
    this domain heard of the others (presence.remote), in user id order."""
    here = await online.app_online_users(app_name)
    elsewhere = await remote.remote_online_async(app_name)
    users = sorted(set(here) | set(elsewhere)) if elsewhere else here
    return [u for u in users if u != master_user_id]


async def master_snapshot(*, app_name: str, master_user_id: str) -> tuple[list[str], list[str]]:
    """Who is online in the app now (master_online), and that as ONLINE_USERS frames for its master.

    The caller registers the master's connection in presence first, so every announcement made
    after this read is sent to it as well.
    """
    users = await master_online(app_name=app_name, master_user_id=master_user_id)
    return users, online_users_frames(users, page_size=settings.PRESENCE_SNAPSHOT_PAGE)


ConnectionsLookup = Callable[[str], Awaitable[list[cache.LiveConnection]]]


async def master_notify(*, master_user_id: str, event_type: str, user_id: str,
                        lookup: ConnectionsLookup | None = None) -> None:
    """USER_CONNECTED / USER_DISCONNECTED to the app's master user, wherever it is connected.
    `lookup` finds the master's connections (a node passes its batched lookup: one Redis read for
    every announcement of a storm's tick, messaging.gateway.runtime)."""
    if user_id == master_user_id:
        return
    conns = await (lookup or cache.connections_of)(master_user_id)
    if not conns:
        return
    event = sockets.presence_event(presence_frame(event_type, user_id), user_id=user_id,
                                   online=event_type == "USER_CONNECTED")
    await sockets.send_many((c.channel_name, event) for c in conns)


def master_notify_sync(*, master_user_id: str, event_type: str, user_id: str) -> None:
    master_notify_many_sync(master_user_id=master_user_id, notices=[(event_type, user_id)])


def master_notify_many_sync(*, master_user_id: str, notices: list[tuple[str, str]], domain: str | None = None) -> None:
    """USER_CONNECTED / USER_DISCONNECTED notices [(event type, user)] to the master user's
    connections (one lookup); `domain`: about users of that other domain (presence.remote)."""
    notices = [(kind, user) for kind, user in notices if user != master_user_id]
    if not notices:
        return
    conns = cache.connections_of_many([master_user_id])[master_user_id]
    events = [sockets.presence_event(presence_frame(kind, user), user_id=user, online=kind == "USER_CONNECTED",
                                     domain=domain) for kind, user in notices]
    sockets.send_many_sync((c.channel_name, event) for event in events for c in conns)


async def user_disconnect_everywhere(*, user_id: str, reason: str) -> int:
    """Close every connection of `user_id` in the cluster (CLOSE_CONNECTION)."""
    conns = await cache.connections_of(user_id)
    event = sockets.connection_close_event(CLOSE_NORMAL, reason, final=True)
    await sockets.send_many((c.channel_name, event) for c in conns)
    return len(conns)


def user_disconnect_everywhere_sync(*, user_id: str, reason: str) -> int:
    """The same from sync code (the REST API): close every connection of `user_id` with 1000;
    returns how many connections the cluster's presence listed."""
    conns = cache.connections_of_many([user_id])[user_id]
    event = sockets.connection_close_event(CLOSE_NORMAL, reason, final=True)
    sockets.send_many_sync((c.channel_name, event) for c in conns)
    return len(conns)


def users_close_sync(*, ranges: dict[str, list[tuple[int, int | None]]], code: int, reason: str) -> int:
    """Close, with `code`, every connection in the cluster of the users of `ranges` (app name -> user
    ranges): their users are served elsewhere now (a takeover, a hand-back). Returns how many."""
    users = [u for app, app_ranges in ranges.items() for u in online.app_online_users_sync(app)
             if (n := _number(u)) is not None and any(low <= n and (high is None or n <= high) for low, high in app_ranges)]
    conns = [c for user_conns in cache.connections_of_many(users).values() for c in user_conns] if users else []
    event = sockets.connection_close_event(code, reason)
    sockets.send_many_sync((c.channel_name, event) for c in conns)
    return len(conns)


def _number(user_id: str) -> int | None:
    parsed = user_id_parse(user_id)
    return parsed.number if parsed else None


def session_disconnect(*, session: Session, reason: str) -> None:
    """The admin's disconnect action: ask the node holding the socket to close it."""
    sockets.send_many_sync([(session.channel_name, sockets.connection_close_event(CLOSE_NORMAL, reason, final=True))])
