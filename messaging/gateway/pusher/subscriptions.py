"""One Pusher connection's channels: subscribing (signatures checked in constant time), presence
membership, client events, and the channel events it is written, in offset order, through a
ChannelCursor like every channel reader's (messaging.channels.cursor)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps_registry.selectors import AppSnapshot
from foundation.asyncdb import run_db
from messaging.channels.cursor import ChannelCursor
from messaging.channels.services import channel_publish_and_fanout
from messaging.gateway.limits import TokenBucket
from messaging.gateway.pusher import figures, metrics, presence
from messaging.gateway.pusher import protocol as p
from messaging.gateway.pusher.node import pusher_node
from messaging.gateway.pusher.services import cached_event
from messaging.gateway.pusher.webhooks import pusher_webhook
from messaging.gateway.runtime import runtime

Send = Callable[[str], Awaitable[bool]]
# Channel messages read as Pusher events, shared by the node's connections: a publish fanned out to a
# thousand subscribers here is parsed once.
_EVENTS: OrderedDict[tuple[int, str, int], p.Event] = OrderedDict()
_EVENTS_SIZE = 4096


def _event_of(app_id: int, channel: str, offset: int, content: str) -> p.Event:
    key = (app_id, channel, offset)
    event = _EVENTS.get(key)
    if event is None:
        event = _EVENTS[key] = p.envelope_read(content)
        if len(_EVENTS) > _EVENTS_SIZE:
            _EVENTS.popitem(last=False)
    return event


@dataclass
class Membership:
    user_id: str
    known: dict[str, Any] = field(default_factory=dict)  # the members this connection was told of


class Subscriptions:
    def __init__(self, *, app: AppSnapshot, socket_id: str, reader: object, send: Send,
                 gone: Callable[[], bool], offsets: bool = False) -> None:
        self.app, self.socket_id, self.send, self.gone, self.offsets = app, socket_id, send, gone, offsets
        self.reader = reader
        self.cursor = ChannelCursor(app_id=app.pk, hub=runtime().hub, reader=reader, write=self._write,
                                    transport="pusher", missed=self._missed)
        self.names: dict[str, p.ChannelKind] = {}  # Pusher channel -> its kind
        self.memberships: dict[str, Membership] = {}  # presence channel -> this connection's user
        self.client_events = TokenBucket(settings.PUSHER_CLIENT_EVENTS_PER_SECOND, settings.PUSHER_CLIENT_EVENTS_BURST)
        self.flooding = 0
        self.user_id: str | None = None  # signed in (pusher:signin)

    async def handle(self, message: dict) -> None:
        event, data = message["event"], message.get("data")
        if isinstance(data, str) and event.startswith("pusher:"):
            try:
                data = json.loads(data)
            except ValueError:
                pass
        if event == "pusher:ping":
            await self.send(p.frame("pusher:pong", {}))
        elif event == "pusher:pong":
            pass  # (the consumer noted the activity)
        elif event == "pusher:subscribe":
            await self.subscribe(data if isinstance(data, dict) else {})
        elif event == "pusher:unsubscribe":
            name = data.get("channel") if isinstance(data, dict) else None
            if isinstance(name, str) and name in self.names:
                await self.leave(name)
        elif event == "pusher:resume":
            await self.resume(data if isinstance(data, dict) else {})
        elif event == "pusher:signin":
            await self.signin(data if isinstance(data, dict) else {})
        elif event.startswith("client-"):
            await self.client_event(event, message.get("channel"), message.get("data"))
        elif event.startswith("pusher:"):
            await self.send(p.error_frame(p.ERROR_BAD_INPUT, f"Unknown event {event[:64]}"))
        else:
            await self.send(p.error_frame(p.ERROR_BAD_INPUT, "Events from clients must be client-* events"))

    # --- subscribing --------------------------------------------------------------------------------

    async def _refuse(self, channel: Any, kind: str, error: str, status: int) -> None:
        metrics.REFUSED.labels(self.app.app_name, kind).inc()
        # The name as the client sent it, too long or not (its frame's size is capped): pusher-js finds
        # the channel the refusal is for by it.
        name = channel if isinstance(channel, str) else ""
        await self.send(p.subscription_error_frame(name, kind, error, status))

    async def subscribe(self, data: dict) -> None:
        name = data.get("channel")
        if isinstance(name, str) and name.startswith(p.USER_CHANNEL):
            # pusher-js subscribes to its user's channel once signed in: read since the signin.
            if self.user_id is not None and name == p.USER_CHANNEL + self.user_id:
                await self.send(p.frame("pusher_internal:subscription_succeeded", {}, channel=name))
            else:
                await self._refuse(name, "AuthError", "a user's channel is read by its signed-in connections only",
                                   p.CLOSE_UNAUTHORIZED)
            return
        if (problem := p.channel_name_problem(name)) is not None:
            await self._refuse(name, "InvalidChannel", problem, p.ERROR_BAD_INPUT)
            return
        kind = p.channel_kind(name)
        if name in self.names:  # already: told again, nothing else changes
            await self._succeeded(name, kind, self.memberships.get(name))
            return
        if len(self.names) >= settings.PUSHER_MAX_CHANNELS:
            await self._refuse(name, "LimitReached", f"at most {settings.PUSHER_MAX_CHANNELS} channels per "
                                                     "connection", p.ERROR_BAD_INPUT)
            return
        channel_data = data.get("channel_data")
        if kind.private:
            signed = channel_data if kind.presence else None
            if kind.presence and not isinstance(channel_data, str):
                await self._refuse(name, "AuthError", "presence channels need channel_data (a JSON string)", 4009)
                return
            if not p.channel_auth_valid(key=self.app.pusher_key, secret=self.app.pusher_secret,
                                        socket_id=self.socket_id, channel=name, auth=data.get("auth"),
                                        channel_data=signed):
                await self._refuse(name, "AuthError", "Invalid signature: the auth does not sign this "
                                                      "socket and channel with the app's secret", 4009)
                return
        membership = None
        if kind.presence:
            membership, info = self._member_of(channel_data)
            if membership is None:
                await self._refuse(name, "AuthError", info, 4009)
                return
            members = await presence.members_read(self.app.pk, p.switchboard_channel(name))
            if membership.user_id not in members and len(members) >= settings.PUSHER_MAX_PRESENCE_MEMBERS:
                await self._refuse(name, "LimitReached", f"the channel has {len(members)} members, the most it "
                                                         "may have", p.ERROR_BAD_INPUT)
                return
        await self.join(name, kind, membership, None if membership is None else info)

    def _member_of(self, channel_data: str) -> tuple[Membership | None, Any]:
        try:
            parsed = json.loads(channel_data)
        except ValueError:
            return None, "channel_data is not JSON"
        user_id = parsed.get("user_id") if isinstance(parsed, dict) else None
        if isinstance(user_id, bool) or not isinstance(user_id, (str, int)) or str(user_id) == "":
            return None, "channel_data must name a user_id"
        return Membership(user_id=str(user_id)), parsed.get("user_info")

    async def join(self, name: str, kind: p.ChannelKind, membership: Membership | None, info: Any) -> None:
        sb = p.switchboard_channel(name)
        self.names[name] = kind
        metrics.SUBSCRIPTIONS.labels(self.app.app_name).inc()
        head = await self.cursor.join(sb)
        if membership is not None:
            self.memberships[name] = membership
            node = pusher_node()
            if await node.member_join((self.app.pk, sb), membership.user_id, info):
                metrics.MEMBERS.labels(self.app.app_name, "added").inc()
                await pusher_webhook(self.app.pk, "member_added", channel=name, user_id=membership.user_id)
                await presence.channel_signal(app_id=self.app.pk, channel=sb,
                                              data={"e": "added", "u": membership.user_id, "i": info})
            membership.known = await presence.members_read(self.app.pk, sb)
            node.watch((self.app.pk, sb), self.reader, lambda members: self.reader.members_told(sb, members))
        await self._succeeded(name, kind, membership)
        if kind.cache:
            await self._cached(name, sb, head)

    async def _succeeded(self, name: str, kind: p.ChannelKind, membership: Membership | None) -> None:
        data: dict[str, Any] = {}
        if membership is not None:
            ids = sorted(membership.known)
            data = {"presence": {"ids": ids, "hash": membership.known, "count": len(ids)}}
        await self.send(p.frame("pusher_internal:subscription_succeeded", data, channel=name))

    async def _cached(self, name: str, sb: str, head: int) -> None:
        """A cache channel's last event, or `pusher:cache_miss` when it has none published within
        PUSHER_CACHE_TTL_SECONDS (Pusher's 30 minutes)."""
        item = await run_db(cached_event, app_id=self.app.pk, channel=sb, offset=head,
                            ttl_seconds=settings.PUSHER_CACHE_TTL_SECONDS) if head > 0 else None
        if item is not None:
            event = _event_of(self.app.pk, sb, item.offset, item.content)
            await self.send(p.event_frame(name, event, item.offset if self.offsets else None))
        else:
            await self.send(p.dumps({"event": "pusher:cache_miss", "channel": name}))
            await pusher_webhook(self.app.pk, "cache_miss", channel=name)

    async def leave(self, name: str) -> None:
        if self.names.pop(name, None) is not None:
            metrics.SUBSCRIPTIONS.labels(self.app.app_name).dec()
        sb = p.switchboard_channel(name)
        await self.cursor.leave(sb)
        membership = self.memberships.pop(name, None)
        if membership is not None:
            node = pusher_node()
            node.unwatch((self.app.pk, sb), self.reader)
            if await node.member_leave((self.app.pk, sb), membership.user_id):
                metrics.MEMBERS.labels(self.app.app_name, "removed").inc()
                await pusher_webhook(self.app.pk, "member_removed", channel=name, user_id=membership.user_id)
                await presence.channel_signal(app_id=self.app.pk, channel=sb,
                                              data={"e": "removed", "u": membership.user_id})

    async def leave_all(self) -> None:
        for name in list(self.names):
            await self.leave(name)
        await self.cursor.leave_all()  # (a signed-in user's channel)

    # --- what the channels bring ------------------------------------------------------------------

    async def _write(self, sb: str, offset: int, content: str) -> bool:
        if self.gone():
            return False
        name = p.pusher_channel(sb)
        event = _event_of(self.app.pk, sb, offset, content)
        if name is None or event.socket_id == self.socket_id:
            return True  # (the publisher's own connection: never echoed)
        metrics.WRITTEN.labels(self.app.app_name).inc()
        return await self.send(p.event_frame(name, event, offset if self.offsets else None))

    async def _missed(self, notice: dict) -> None:
        name = p.pusher_channel(notice["channel"])
        await self.send(p.frame("pusher:missed", {"missed": notice["missed"], "offset": notice["offset"]},
                                channel=name))

    async def signal(self, sb: str, data: dict) -> None:
        """A member came or went somewhere in the cluster (presence.channel_signal), or the app's
        server ended the signed-in user's connections (terminate_connections)."""
        if isinstance(data, dict) and data.get("e") == "terminate" and sb.startswith(p.USER_PREFIX):
            await self.send(p.error_frame(p.CLOSE_UNAUTHORIZED, "You got disconnected by the app."))
            await self.reader.close(code=p.CLOSE_UNAUTHORIZED, reason="disconnected by the app")
            return
        name = p.pusher_channel(sb)
        membership = self.memberships.get(name or "")
        if membership is None or not isinstance(data, dict):
            return
        user = data.get("u")
        if data.get("e") == "added" and user not in membership.known:
            membership.known[user] = data.get("i")
            await self._member_added(name, user, data.get("i"))
        elif data.get("e") == "removed" and user in membership.known and user != membership.user_id:
            del membership.known[user]
            await self.send(p.frame("pusher_internal:member_removed", {"user_id": user}, channel=name))

    async def members_told(self, sb: str, members: dict[str, Any]) -> None:
        """The members as Redis has them now (the node's heartbeat): what this connection was not told."""
        name = p.pusher_channel(sb)
        membership = self.memberships.get(name or "")
        if membership is None:
            return
        for user in [u for u in membership.known if u not in members and u != membership.user_id]:
            del membership.known[user]
            await self.send(p.frame("pusher_internal:member_removed", {"user_id": user}, channel=name))
        for user, info in members.items():
            if user not in membership.known:
                membership.known[user] = info
                await self._member_added(name, user, info)

    async def _member_added(self, name: str, user: str, info: Any) -> None:
        data: dict[str, Any] = {"user_id": user}
        if info is not None:
            data["user_info"] = info
        await self.send(p.frame("pusher_internal:member_added", data, channel=name))

    # --- client events and the resume extension ---------------------------------------------------

    async def client_event(self, event: str, name: Any, data: Any) -> None:
        kind = self.names.get(name) if isinstance(name, str) else None
        refusal, code = None, p.CLOSE_UNAUTHORIZED  # not allowed: 4009; too large: 4300
        if not self.app.pusher_client_events:
            refusal = "Client events are not enabled for this app"
        elif kind is None:
            refusal = "Client events need a subscription to their channel"
        elif not kind.client_events:
            refusal = "Client events are allowed on private and presence channels only (not encrypted ones)"
        elif len(event) > p.PUSHER_NAME_MAX:
            refusal, code = f"Event names are at most {p.PUSHER_NAME_MAX} characters", p.ERROR_BAD_INPUT
        elif len(p.dumps(data).encode()) > settings.PUSHER_MAX_EVENT_BYTES:
            refusal, code = f"Event data is larger than {settings.PUSHER_MAX_EVENT_BYTES} bytes", p.ERROR_BAD_INPUT
        if refusal is not None:
            metrics.REFUSED.labels(self.app.app_name, "client_event").inc()
            await self.send(p.error_frame(code, refusal, name if isinstance(name, str) else None))
            return
        if self.client_events.take(1):
            metrics.REFUSED.labels(self.app.app_name, "client_event_rate").inc()
            self.flooding += 1
            await self.send(p.error_frame(p.CLOSE_CLIENT_EVENT_RATE, "Client event rejected due to rate limit", name))
            if self.flooding >= settings.PUSHER_FLOOD_CLOSE_AFTER:
                await self.reader.close(code=p.CLOSE_CLIENT_EVENT_RATE, reason="client events over the rate limit")
            return
        self.flooding = 0
        membership = self.memberships.get(name)
        content = p.envelope(event, data, socket_id=self.socket_id,
                             user_id=membership.user_id if membership is not None else None)
        await run_db(channel_publish_and_fanout, app_id=self.app.pk, channel=p.switchboard_channel(name),
                     content=content, publisher=f"pusher:{self.socket_id}")
        metrics.PUBLISHED.labels(self.app.app_name, "client").inc()
        await figures.published_count_async(app_id=self.app.pk)
        await pusher_webhook(self.app.pk, "client_event", channel=name, event=event, socket_id=self.socket_id,
                             data=data if isinstance(data, str) else p.dumps(data),
                             user_id=membership.user_id if membership is not None else None)

    async def signin(self, data: dict) -> None:
        """`pusher:signin {user_data, auth}`: the app's server signed `<socket_id>::user::<user_data>`; the
        connection then reads its user's `#server-to-user-<id>` and terminate_connections reaches it.
        A bad signature or user data without an `id` closes the connection (4009), as Pusher does."""
        user_data, user = data.get("user_data"), None
        if p.signin_valid(key=self.app.pusher_key, secret=self.app.pusher_secret, socket_id=self.socket_id,
                          user_data=user_data, auth=data.get("auth")):
            try:
                parsed = json.loads(user_data)
            except ValueError:
                parsed = None
            user = parsed.get("id") if isinstance(parsed, dict) else None
        sb = p.user_channel(str(user)) if isinstance(user, (str, int)) and not isinstance(user, bool) else None
        if sb is None or self.user_id is not None:
            reason = "Connection not authorized" if self.user_id is None else "Already signed in"
            await self.send(p.error_frame(p.CLOSE_UNAUTHORIZED, reason))
            await self.reader.close(code=p.CLOSE_UNAUTHORIZED, reason=reason)
            return
        self.user_id = str(user)
        await self.cursor.join(sb)
        await self.send(p.frame("pusher:signin_success", {"user_data": user_data}))

    async def resume(self, data: dict) -> None:
        """`pusher:resume {channel, since}` (extension): the channel's events after offset `since`, in order,
        then `pusher:resumed {offset}`; the subscription goes on live from there."""
        name, since = data.get("channel"), data.get("since")
        if not isinstance(name, str) or name not in self.names or isinstance(since, bool) \
                or not isinstance(since, int) or since < 0:
            await self.send(p.error_frame(p.ERROR_BAD_INPUT, "pusher:resume needs a subscribed channel and an "
                                                             "offset since (a whole number, 0 or more)"))
            return
        offset = await self.cursor.join(p.switchboard_channel(name), since=since)
        await self.send(p.frame("pusher:resumed", {"offset": offset}, channel=name))
