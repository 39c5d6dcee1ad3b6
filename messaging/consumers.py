"""The client WebSocket at /ws (docs/protocol.md).

Thin on purpose: parse a frame, check it is allowed, call one service, write the answer. A bad
frame gets INVALID_MESSAGE and the connection keeps working; an internal failure gets
GENERAL_ERROR with the frame's data (the client may resend: nothing was stored).

What a connection guarantees its client:
- it never writes the same delivery twice, whether a message comes by push or by fetch (the
  consumer handles one event at a time, and remembers what it wrote or holds in flight);
- a stored message counts as delivered only once its frame has left the node (linker clients) or
  the client ACKed it (ACK mode); a connection that closes first, for whatever reason, gives its
  messages back to the mailbox, with no attempt counted;
- whatever goes wrong inside it, its cleanup runs: presence, the master's USER_DISCONNECTED and the
  session row are settled on every way out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from channels.consumer import get_handler_name
from django.conf import settings

from apps_registry.selectors import AppSnapshot, app_snapshot, user_id_parse
from foundation.daphne_adapter import OUTGOING_EXTENSION, OutgoingBuffer
from foundation.transport import sockets
from foundation.transport.frames import (
    CLOSE_AUTH_TIMEOUT,
    CLOSE_POLICY,
    CLOSE_RESTART,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    encode,
)
from messaging import metrics
from messaging.asyncdb import run_db
from messaging.authentication import client_authenticate
from messaging.batching import BatcherFull
from messaging.channels.cursor import ChannelCursor
from messaging.channels.names import (
    GrantError,
    channel_grant_claims,
    channel_granted,
    channel_is_public,
    channel_name_valid,
    channel_of_app,
)
from messaging.channels.selectors import subscriptions_of
from messaging.inbox import ChannelReaderConsumer
from messaging.limits import ConnectionLimits, TokenBucket
from messaging.models import MessageKind
from messaging.protocol import (
    CLIENT_MESSAGE_ID_MAX,
    FEATURE_FAST,
    FETCH_MAX,
    Frame,
    FrameError,
    accepted_frame,
    fast_frame,
    invalid,
    message_ids,
    parse_frame,
    require_dict,
    require_str,
)
from messaging.runtime import LocalConnection, runtime
from messaging.services import (
    OutgoingMessage,
    SendResult,
    claim_token,
    deliveries_mark_delivered,
    deliveries_unacked_for,
    missing_fetch,
    user_presence_announce,
)
from presence import cache
from presence.services import session_close, session_open, user_disconnect_everywhere

log = logging.getLogger(__name__)
WRITTEN_MEMORY = 5000  # recently written delivery ids per connection (dedupe, and fetch's skip list)
APP_REFRESH_SECONDS = 5.0
CONTROL_TYPES = {"PING", "PONG", "ACK"}


@dataclass
class _Unflushed:
    position: int  # the connection's byte count once these frames are queued
    delivery_ids: list[int]
    claims: list[tuple[int, int]]  # (delivery id, claim) of pushed rows: given back if never flushed


class ClientConsumer(ChannelReaderConsumer):
    app: AppSnapshot | None = None
    user_id: str | None = None
    acks: bool = False

    # --- life cycle ----------------------------------------------------------------------------

    async def dispatch(self, message: dict) -> None:
        # Channels' default dispatch runs close_old_connections in a thread before every message
        # (a thread hop per frame: a fifth of a node's CPU under load). This consumer never uses
        # the ORM on the event loop; every DB call goes through run_db, which looks after its own.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.session_id = None
        self.app_loaded_at = 0.0
        self.limits = ConnectionLimits.preauth()
        self.user_bucket: TokenBucket | None = None
        self.written: OrderedDict[int, None] = OrderedDict()
        self.inflight: dict[int, tuple[int, int | None]] = {}  # ACK mode: delivery id -> (message id, claim)
        self.inflight_by_message: dict[int, int] = {}
        self.unflushed: deque[_Unflushed] = deque()
        self.unflushed_ids: set[int] = set()
        self.channels: ChannelCursor | None = None  # set at authentication
        self.durable: set[str] = set()  # channels of the user's server-managed subscriptions
        self.closing = False
        self.outgoing: OutgoingBuffer | None = (self.scope.get("extensions") or {}).get(OUTGOING_EXTENSION)
        if self.outgoing is not None:
            self.outgoing.on_flush = self._on_flush
        await self.accept()
        self.auth_timer = asyncio.get_running_loop().call_later(
            settings.WS_AUTH_TIMEOUT, lambda: asyncio.ensure_future(self._auth_timeout()))

    async def _auth_timeout(self) -> None:
        if self.user_id is None and not self.closing:
            await self._close(CLOSE_AUTH_TIMEOUT, "not authenticated in time")

    async def _close(self, code: int, reason: str = "") -> None:
        if not self.closing:
            self.closing = True
            self.close_note = f"server closed ({code}){': ' + reason if reason else ''}"[:200]
            await self.close(code=code, reason=reason or None)

    async def disconnect(self, code: int) -> None:
        if not getattr(self, "close_note", ""):
            self.close_note = f"client closed ({code})"
        await self._cleanup()

    async def _cleanup(self) -> None:
        if getattr(self, "_cleaned", True):
            return
        self._cleaned = True
        timer = getattr(self, "auth_timer", None)
        if timer is not None:
            timer.cancel()
        if self.outgoing is not None:
            self.outgoing.on_flush = None
        if self.user_id is None or self.app is None:
            return
        node = runtime()
        node.connection_remove(self.channel_name)
        node.work_limits.detach((self.app.pk, self.user_id))
        if self.channels is not None:
            await self.channels.leave_all()
        # What this connection held but its client never got (frames still queued on the node, or
        # not ACKed) goes back to the mailbox under the claim it came with: no attempt counted.
        self._on_flush()
        claims = [c for entry in self.unflushed for c in entry.claims]
        claims += [(d, claim) for d, (_, claim) in self.inflight.items() if claim is not None]
        self.unflushed.clear()
        self.unflushed_ids.clear()
        self.inflight.clear()
        if claims:
            node.released.add(claims)
        try:
            last = await cache.connection_remove(user_id=self.user_id, channel_name=self.channel_name,
                                                 node_id=node.node_id)
            if last:
                await user_presence_announce(app=self.app, user_id=self.user_id, connected=False)
        except Exception:
            # Redis is away: this node's heartbeat removes the stale entry (and announces) later.
            log.exception("presence update on disconnect of %s failed", self.user_id)
        if self.session_id is not None:
            try:
                await run_db(session_close, connection_id=self.session_id,
                             close_reason=getattr(self, "close_note", "") or "connection failed")
            except Exception:
                log.exception("closing session row of %s failed", self.user_id)

    # --- writing to the socket -----------------------------------------------------------------

    async def _write(self, text: str) -> bool:
        """Queue one frame; False when the socket took nothing (closed, or cut off as a slow reader)."""
        before = self.outgoing.queued if self.outgoing is not None else None
        await self.send(text_data=text)
        return before is None or self.outgoing.queued > before

    def _written(self, delivery_ids: list[int], claims: list[tuple[int, int]]) -> None:
        """Frames of stored messages were queued for a linker (non-ACK) client: they count as
        delivered once they have left the node (see _on_flush)."""
        for delivery_id in delivery_ids:
            self.written[delivery_id] = None
        while len(self.written) > WRITTEN_MEMORY:
            self.written.popitem(last=False)
        if self.outgoing is None:
            runtime().delivered.add(delivery_ids)
            return
        self.unflushed.append(_Unflushed(self.outgoing.queued, delivery_ids, claims))
        self.unflushed_ids.update(delivery_ids)

    def _on_flush(self) -> None:
        """Called by the transport after it wrote to the socket: confirm what has left the node."""
        if not self.unflushed or self.outgoing is None:
            return
        flushed = self.outgoing.flushed()
        done: list[int] = []
        while self.unflushed and self.unflushed[0].position <= flushed:
            done.extend(self.unflushed.popleft().delivery_ids)
        if done:
            self.unflushed_ids.difference_update(done)
            runtime().delivered.add(done)

    # --- frames from the client ----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw_len = len(text_data) if text_data is not None else len(bytes_data or b"")
        if raw_len > settings.WS_MAX_FRAME_BYTES or (
            text_data is not None and raw_len * 4 > settings.WS_MAX_FRAME_BYTES
            and len(text_data.encode(errors="surrogatepass")) > settings.WS_MAX_FRAME_BYTES
        ):
            await self._close(CLOSE_TOO_BIG, f"frame over {settings.WS_MAX_FRAME_BYTES} bytes")
            return
        try:
            frame = parse_frame(text_data)
        except FrameError as exc:
            if await self._allowed("INVALID", None):
                metrics.REFUSED.labels("INVALID_MESSAGE").inc()
                await self._write(invalid(exc.reason, exc.data))
            return
        metrics.FRAMES.labels(frame.type).inc()
        if not await self._allowed(frame.type, frame):
            return
        if self.user_id is None:
            if frame.type == "AUTH_CLIENT":
                await self._guard(frame, ClientConsumer.on_auth_client)
            else:
                await self._write(encode("AUTH_REQUIRED", {}))
            return
        await self._guard(frame, self.handlers[frame.type])

    async def _allowed(self, frame_type: str, frame: Frame | None) -> bool:
        """Every frame draws on a budget (control frames on a larger one). Beyond it the frame is
        refused; persistent abuse closes the connection with 1008."""
        bucket = self.limits.control if frame_type in CONTROL_TYPES else self.limits.work
        wait = bucket.take(1)
        if not wait:
            return True
        metrics.LIMITED.labels("frames").inc()
        if self.limits.refusals.add():
            metrics.LIMITED.labels("abusive").inc()
            await self._close(CLOSE_POLICY, "rate limit exceeded repeatedly")
        elif self.user_id is not None:  # before authentication, excess frames get no answer at all
            await self._write(invalid("rate limit exceeded", frame.data if frame else None,
                                      retryAfterMs=_ms(wait)))
        return False

    async def _guard(self, frame: Frame, handler) -> None:
        try:
            await handler(self, frame)
        except FrameError as exc:
            metrics.REFUSED.labels("INVALID_MESSAGE").inc()
            await self._write(invalid(exc.reason, frame.data if exc.data is None else exc.data, **exc.extra))
        except Exception:
            metrics.REFUSED.labels("GENERAL_ERROR").inc()
            log.exception("handling %s from %s failed", frame.type, self.user_id)
            await self._write(encode("GENERAL_ERROR", frame.data, frame.reference))

    async def on_auth_client(self, frame: Frame) -> None:
        data = require_dict(frame)
        app_id, user_id = require_str(data, "appId"), require_str(data, "userId", max_len=96)
        token = data.get("token") if isinstance(data.get("token"), str) else ""
        headers = dict(self.scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1") or None
        outcome = await client_authenticate(app_id=app_id, user_id=user_id, token=token, origin=origin)
        if not outcome.ok:
            await self._refuse(app_id, user_id, outcome.reason, CLOSE_POLICY)
            return
        node = runtime()
        await node.ensure_started()
        app = outcome.app
        acks = data.get("acks") is True
        node.connection_add(self.channel_name, LocalConnection(user_id=user_id, app_id=app.pk, acks=acks,
                                                               close=self._close))
        try:
            first = await cache.connection_add(user_id=user_id, channel_name=self.channel_name, node_id=node.node_id,
                                               acks=acks, limit=app.max_connections_per_user)
        except cache.TooManyConnections as exc:
            node.connection_remove(self.channel_name)
            await self._refuse(app_id, user_id, f"too many connections for this user (limit {exc.limit})",
                               CLOSE_POLICY)
            return
        except cache.NodeDeclaredDead:
            node.connection_remove(self.channel_name)
            await self._refuse(app_id, user_id, "this node is restarting; reconnect", CLOSE_RESTART)
            return
        except Exception:
            node.connection_remove(self.channel_name)
            log.exception("registering %s in presence failed", user_id)
            await self._refuse(app_id, user_id, "service unavailable; reconnect later", CLOSE_TRY_AGAIN)
            return
        client = self.scope.get("client") or ("", 0)
        try:
            self.session_id = await run_db(
                session_open, app_id=app.pk, user_id=user_id, node_id=node.node_id, channel_name=self.channel_name,
                acks=acks, remote_addr=str(client[0] or ""),
                user_agent=headers.get(b"user-agent", b"").decode(errors="replace"),
            )
        except Exception:
            log.exception("opening the session row of %s failed", user_id)
            node.connection_remove(self.channel_name)
            await cache.connection_remove(user_id=user_id, channel_name=self.channel_name, node_id=node.node_id)
            await self._refuse(app_id, user_id, "service unavailable; reconnect later", CLOSE_TRY_AGAIN)
            return
        self.app, self.user_id, self.acks, self.app_loaded_at = app, user_id, acks, time.monotonic()
        self.limits = ConnectionLimits.for_app(app.rate_limit_per_second, app.rate_limit_burst)
        self.user_bucket = node.work_limits.attach((app.pk, user_id), app.deliveries_per_second, app.deliveries_burst)
        self.channels = ChannelCursor(app_id=app.pk, hub=node.hub, reader=self, write=self._write_channel,
                                      transport="ws")
        self.auth_timer.cancel()
        metrics.AUTH.labels("admitted").inc()
        await self._write(encode("AUTH_CLIENT_REPLY", {"appId": app_id, "userId": user_id, "isAuthenticated": True}))
        if first:
            await user_presence_announce(app=app, user_id=user_id, connected=True)
        if acks:
            # Left behind by a connection that could not give them back (its node crashed): they
            # come again, with the same ids.
            node.routing.add(await run_db(deliveries_unacked_for, app_id=app.pk, user_id=user_id))
        # The user's server-managed subscriptions: read live from now (SUBSCRIBE with `since`
        # replays what was missed).
        self.durable = set(await run_db(subscriptions_of, app_id=app.pk, user_id=user_id))
        for name in sorted(self.durable):
            await self.channels.join(name)

    async def _refuse(self, app_id: str, user_id: str, reason: str, code: int) -> None:
        """The linker reply, exactly (strict clients compare it); the reason travels in the close frame."""
        metrics.AUTH.labels("refused").inc()
        log.info("refused %s: %s", user_id, reason)
        await self._write(encode("AUTH_CLIENT_REPLY", {"appId": app_id, "userId": user_id, "isAuthenticated": False}))
        await self._close(code, reason)

    async def _current_app(self) -> AppSnapshot:
        if time.monotonic() - self.app_loaded_at > APP_REFRESH_SECONDS:
            fresh = await run_db(app_snapshot, self.app.app_name)
            if fresh is not None:
                self.app = fresh
            self.app_loaded_at = time.monotonic()
        return self.app

    def _check_recipient(self, app: AppSnapshot, to: Any, data: Any) -> str:
        if not isinstance(to, str) or not to:
            raise FrameError("missing or invalid recipient in 'to' (a user id string)", data)
        parsed = user_id_parse(to)
        if parsed is None:
            raise FrameError(f"recipient '{to[:96]}' is not a user id (<appName>-<digits>, no leading zero)", data)
        if parsed.app_name != app.app_name:
            raise FrameError(f"recipient '{to}' belongs to another app", data)
        if app.home_domain(parsed.number) is None:
            raise FrameError(f"unknown recipient '{to}' (no user distribution covers it)", data)
        return to

    def _check_content(self, app: AppSnapshot, data: dict) -> str:
        content = data.get("content")
        if not isinstance(content, str):
            raise FrameError("missing or invalid 'content' (a string)", data)
        if len(content) > app.max_content_bytes or len(content.encode()) > app.max_content_bytes:
            raise FrameError(f"content exceeds {app.max_content_bytes} bytes", None, limit=app.max_content_bytes)
        return content

    def _charge_work(self, deliveries: int, data: Any) -> None:
        """Each delivery a send creates draws on the user's budget on this node."""
        wait = self.user_bucket.take(deliveries)
        if wait:
            metrics.LIMITED.labels("deliveries").inc()
            raise FrameError("delivery rate limit exceeded", data, limit=self.app.deliveries_per_second,
                             retryAfterMs=_ms(wait))

    async def on_message(self, frame: Frame) -> None:
        app = await self._current_app()
        data = require_dict(frame)
        to = self._check_recipient(app, data.get("to"), data)
        content = self._check_content(app, data)
        client_message_id = data.get("clientMessageId")
        if client_message_id is not None and (
            not isinstance(client_message_id, str) or not client_message_id
            or len(client_message_id) > CLIENT_MESSAGE_ID_MAX
        ):
            raise FrameError(f"clientMessageId must be a string of 1 to {CLIENT_MESSAGE_ID_MAX} characters", data)
        self._charge_work(1, data)
        if frame.feature == FEATURE_FAST:
            await self._send_fast([to], content, frame.reference)
            return
        await self._store(frame, data, OutgoingMessage(
            app_id=app.pk, sender=self.user_id, recipients=(to,), content=content, reference=frame.reference or "",
            client_message_id=client_message_id,
            confirmation_requested=bool(frame.reference) and frame.confirmation_enabled,
        ))

    async def on_group_message(self, frame: Frame) -> None:
        app = await self._current_app()
        data = require_dict(frame)
        recipients = data.get("to")
        if not isinstance(recipients, list) or not recipients:
            raise FrameError("'to' must be a non-empty list of user ids", data)
        if len(recipients) > app.max_group_recipients:
            raise FrameError(f"at most {app.max_group_recipients} recipients per group message", None,
                             limit=app.max_group_recipients)
        recipients = list(dict.fromkeys(self._check_recipient(app, to, data) for to in recipients))
        content = self._check_content(app, data)
        self._charge_work(len(recipients), data)
        if frame.feature == FEATURE_FAST:
            await self._send_fast(recipients, content, frame.reference)
            return
        await self._store(frame, data, OutgoingMessage(
            app_id=app.pk, sender=self.user_id, recipients=tuple(recipients), content=content,
            kind=MessageKind.GROUP, reference=frame.reference or "",
        ))

    async def _store(self, frame: Frame, data: dict, message: OutgoingMessage) -> None:
        """RELIABLE: through the node's intake (group commit); answered once committed."""
        try:
            result = await runtime().intake.submit(message)
        except BatcherFull as exc:
            metrics.INTAKE_REFUSED.inc()
            raise FrameError("server busy: the message was not stored; send it again later", data,
                             retryAfterMs=_ms(exc.retry_after)) from None
        if isinstance(result, Exception):
            raise result
        assert isinstance(result, SendResult)
        if self.acks:
            await self._write(accepted_frame(message_id=result.message_id, client_message_id=message.client_message_id,
                                             reference=frame.reference, duplicate=result.duplicate,
                                             recipients=len(message.recipients)))

    async def _send_fast(self, recipients: list[str], content: str, reference: str | None) -> None:
        """FAST: straight through the channel layer, never stored; best effort."""
        event = sockets.message_fast_event(fast_frame(sender=self.user_id, content=content, reference=reference))
        connections = await cache.connections_of_many_async(recipients)
        await sockets.send_many((c.channel_name, event) for conns in connections.values() for c in conns)

    async def on_fetch(self, frame: Frame) -> None:
        data = require_dict(frame)
        count = data.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise FrameError("'count' must be a positive integer", data)
        count = min(count, FETCH_MAX)
        claim = None
        if self.acks:
            # What is in flight to this connection is not fetched again; the window bounds it.
            count = max(0, min(count, settings.WS_ACK_WINDOW - len(self.inflight)))
            claim = claim_token()
        result = await run_db(missing_fetch, app_id=self.app.pk, user_id=self.user_id, count=count,
                              skip_ids=[*self.written, *self.inflight], claim=claim)
        written: list[int] = []
        for item in result.items:
            if not await self._write(item.frame):
                break
            written.append(item.delivery_id)
            if self.acks:
                self.inflight[item.delivery_id] = (item.message_id, claim)
                self.inflight_by_message[item.message_id] = item.delivery_id
        if self.acks:
            unsent = [(i.delivery_id, claim) for i in result.items[len(written):]]
            if unsent:
                runtime().released.add(unsent)
        elif written:
            self._written(written, [])
        await self._write(encode("FETCH_MISSING_MESSAGES_COMPLETE",
                                 {"leftMissingCount": result.left + len(result.items) - len(written)}))

    async def on_ack(self, frame: Frame) -> None:
        data = require_dict(frame)
        ids = message_ids(data.get("ids"), data)
        known, strays = [], []
        for message_id in ids:
            delivery_id = self.inflight_by_message.pop(message_id, None)
            if delivery_id is None:
                strays.append(message_id)
                continue
            self.inflight.pop(delivery_id, None)
            self.written[delivery_id] = None
            known.append(delivery_id)
        if known:
            runtime().delivered.add(known)
        if strays:
            # Not in flight here (an ACK after a reconnect, say): looked up in the database, so it
            # costs work like a send.
            self._charge_work(1, data)
            await run_db(deliveries_mark_delivered, message_ids=strays, recipient=self.user_id)

    async def on_close_connection(self, frame: Frame) -> None:
        if self.user_id != self.app.master_user_id:
            raise FrameError("only the app's master user may close connections", frame.data)
        data = require_dict(frame)
        target = require_str(data, "userId", max_len=96)
        parsed = user_id_parse(target)
        if parsed is None or parsed.app_name != self.app.app_name:
            raise FrameError(f"'{target}' is not a user of this app", data)
        await user_disconnect_everywhere(user_id=target, reason="closed by the master user")

    async def on_ping(self, frame: Frame) -> None:
        await self._write(encode("PONG", {}))

    async def on_pong(self, frame: Frame) -> None:
        return None

    def _channel_name(self, data: dict) -> str:
        name = data.get("channel")
        if not channel_name_valid(name) or not channel_of_app(self.app, name):
            raise FrameError("'channel' must be a channel name of this app (A-Z a-z 0-9 _ . - @, at most 128)", data)
        return name

    def _channel_allowed(self, app: AppSnapshot, name: str, data: dict) -> None:
        if name in self.durable:
            return  # the app's server subscribed this user
        if not app.client_subscriptions_allowed:
            raise FrameError("client subscriptions are not allowed for this app", data)
        if channel_is_public(app, name):
            return
        token = data.get("token")
        if not isinstance(token, str) or not token:
            raise FrameError(f"channel '{name}' is not public: a token granting it is needed", data)
        try:
            claims = channel_grant_claims(app, token)
        except GrantError as exc:
            raise FrameError(str(exc), data) from None
        if not channel_granted(claims, name, self.user_id):
            raise FrameError(f"the token does not grant channel '{name}'", data)

    async def on_subscribe(self, frame: Frame) -> None:
        app = await self._current_app()
        data = require_dict(frame)
        name = self._channel_name(data)
        since = data.get("since")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int) or since < 0):
            raise FrameError("'since' must be an offset (an integer, 0 or more)", data)
        self._channel_allowed(app, name, data)
        if name not in self.channels and len(self.channels) >= settings.WS_MAX_CHANNELS:
            raise FrameError(f"at most {settings.WS_MAX_CHANNELS} channels per connection", data,
                             limit=settings.WS_MAX_CHANNELS)
        offset = await self.channels.join(name, since=since)
        await self._write(encode("SUBSCRIBED", {"channel": name, "offset": offset}))

    async def on_unsubscribe(self, frame: Frame) -> None:
        data = require_dict(frame)
        name = self._channel_name(data)
        await self.channels.leave(name)
        await self._write(encode("UNSUBSCRIBED", {"channel": name}))

    async def on_reauth(self, frame: Frame) -> None:
        raise FrameError("already authenticated; open a new connection to change user", frame.data)

    handlers = {
        "MESSAGE": on_message,
        "GROUP_MESSAGE": on_group_message,
        "FETCH_MISSING_MESSAGES_REQUEST": on_fetch,
        "ACK": on_ack,
        "CLOSE_CONNECTION": on_close_connection,
        "PING": on_ping,
        "PONG": on_pong,
        "SUBSCRIBE": on_subscribe,
        "UNSUBSCRIBE": on_unsubscribe,
        "AUTH_CLIENT": on_reauth,
    }

    # --- events from the channel layer (foundation.transport.sockets) ------------------------------

    async def message_deliver(self, event: sockets.MessageDeliverEvent) -> None:
        now = time.time()
        node = runtime()
        written: list[int] = []
        written_claims: list[tuple[int, int]] = []
        again: list[int] = []  # already handled here: confirmed again (its first mark may have been lost)
        give_back: list[tuple[int, int]] = []
        frames = 0
        for item in event["items"]:
            delivery_id, claim = item["delivery_id"], item["claim"]
            if delivery_id in self.inflight:
                self.inflight[delivery_id] = (item["message_id"], claim)  # re-claimed: release under the new claim
                continue
            if delivery_id in self.written:
                if delivery_id not in self.unflushed_ids:
                    again.append(delivery_id)
                continue
            if self.closing or (self.acks and len(self.inflight) >= settings.WS_ACK_WINDOW):
                give_back.append((delivery_id, claim))
                continue
            if not await self._write(item["frame"]):
                give_back.append((delivery_id, claim))
                continue
            metrics.DELIVERY_LATENCY.observe(max(0.0, now - item["stored_at"]))
            frames += 1
            if self.acks:
                self.inflight[delivery_id] = (item["message_id"], claim)
                self.inflight_by_message[item["message_id"]] = delivery_id
            else:
                written.append(delivery_id)
                written_claims.append((delivery_id, claim))
        metrics.WRITTEN.inc(frames)
        if written:
            self._written(written, written_claims)
        if again:
            node.delivered.add(again)
        if give_back:
            node.released.add(give_back)

    async def message_fast(self, event: sockets.MessageFastEvent) -> None:
        await self._write(event["frame"])

    async def presence_event(self, event: sockets.PresenceEvent) -> None:
        await self._write(event["frame"])

    async def connection_close(self, event: sockets.ConnectionCloseEvent) -> None:
        await self._close(event["code"], event["reason"])

    # --- channels (the hub hands publishes to the inbox; see messaging.channels.hub) -------------

    async def _write_channel(self, channel: str, offset: int, content: str) -> bool:
        return await self._write(_channel_frame(channel, content, offset))

    async def channel_join(self, event: sockets.ChannelMembershipEvent) -> None:
        if self.channels is not None:
            self.durable.add(event["channel"])
            await self.channels.join(event["channel"])

    async def channel_leave(self, event: sockets.ChannelMembershipEvent) -> None:
        if self.channels is not None:
            self.durable.discard(event["channel"])
            await self.channels.leave(event["channel"])


def _channel_frame(channel: str, content: str, offset: int) -> str:
    return encode("CHANNEL_MESSAGE", {"channel": channel, "content": content, "offset": offset})


def _ms(seconds: float) -> int:
    return 60_000 if seconds == float("inf") else max(1, int(seconds * 1000 + 0.999))
