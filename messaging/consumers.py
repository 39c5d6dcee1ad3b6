"""The client WebSocket at /ws (PROTOCOL.md section 1).

Thin on purpose: parse a frame, check it is allowed, call one service, write the answer. A bad
frame gets INVALID_MESSAGE and the connection keeps working; an internal failure gets
GENERAL_ERROR with the frame's data (the client may resend: nothing was stored).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from apps_registry.selectors import AppSnapshot, app_snapshot, user_id_parse
from messaging import metrics, sockets
from messaging.asyncdb import run_db
from messaging.authentication import client_authenticate
from messaging.models import MessageKind
from messaging.protocol import (
    CLOSE_AUTH_TIMEOUT,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    FEATURE_FAST,
    FETCH_MAX,
    Frame,
    FrameError,
    encode,
    invalid,
    parse_frame,
    require_dict,
    require_str,
)
from messaging.ratelimit import TokenBucket
from messaging.runtime import LocalConnection, runtime
from messaging.services import deliveries_mark_delivered, deliveries_unacked_for, message_send, missing_fetch
from presence import cache
from presence.services import master_notify, session_close, session_open, user_disconnect_everywhere

log = logging.getLogger(__name__)
WRITTEN_MEMORY = 5000  # recently written delivery ids per connection (see missing_fetch)
APP_REFRESH_SECONDS = 5.0
UNLIMITED_TYPES = {"PING", "PONG", "ACK"}


class ClientConsumer(AsyncWebsocketConsumer):
    app: AppSnapshot | None = None
    user_id: str | None = None
    acks: bool = False

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
        self.bucket: TokenBucket | None = None
        self.written: OrderedDict[int, None] = OrderedDict()
        self.closing = False
        await self.accept()
        self.auth_timer = asyncio.get_running_loop().call_later(
            settings.WS_AUTH_TIMEOUT, lambda: asyncio.ensure_future(self._auth_timeout()))

    async def _auth_timeout(self) -> None:
        if self.user_id is None and not self.closing:
            self.closing = True
            await self.close(code=CLOSE_AUTH_TIMEOUT)

    async def disconnect(self, code: int) -> None:
        self.auth_timer.cancel()
        if self.user_id is None or self.app is None:
            return
        runtime().connections.pop(self.channel_name, None)
        metrics.CONNECTIONS.set(len(runtime().connections))
        try:
            last = await cache.connection_remove(user_id=self.user_id, channel_name=self.channel_name)
            if last:
                await master_notify(master_user_id=self.app.master_user_id, event_type="USER_DISCONNECTED",
                                    user_id=self.user_id)
        except Exception:
            # Redis is away: the reaper or this node's next heartbeat settles presence later.
            log.exception("presence update on disconnect of %s failed", self.user_id)
        if self.session_id is not None:
            try:
                await run_db(session_close, connection_id=self.session_id)
            except Exception:
                log.exception("closing session row of %s failed", self.user_id)

    # --- frames from the client ----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw_len = len(text_data) if text_data is not None else len(bytes_data or b"")
        if raw_len > settings.WS_MAX_FRAME_BYTES or (
            text_data is not None and raw_len * 4 > settings.WS_MAX_FRAME_BYTES
            and len(text_data.encode()) > settings.WS_MAX_FRAME_BYTES
        ):
            await self.close(code=CLOSE_TOO_BIG)
            return
        try:
            frame = parse_frame(text_data)
        except FrameError as exc:
            metrics.REFUSED.labels("INVALID_MESSAGE").inc()
            await self.send(text_data=invalid(exc.reason, exc.data))
            return
        metrics.FRAMES.labels(frame.type).inc()
        if self.user_id is None:
            if frame.type == "AUTH_CLIENT":
                await self._guard(frame, ClientConsumer.on_auth_client)
            else:
                await self.send(text_data=encode("AUTH_REQUIRED", {}))
            return
        if frame.type not in UNLIMITED_TYPES and not self.bucket.allow():
            if self.bucket.abusive():
                await self.send(text_data=invalid("rate limit exceeded repeatedly; closing", frame.data))
                await self.close(code=CLOSE_POLICY)
            else:
                await self.send(text_data=invalid("rate limit exceeded", frame.data))
            return
        await self._guard(frame, self.handlers[frame.type])

    async def _guard(self, frame: Frame, handler) -> None:
        try:
            await handler(self, frame)
        except FrameError as exc:
            metrics.REFUSED.labels("INVALID_MESSAGE").inc()
            await self.send(text_data=invalid(exc.reason, frame.data if exc.data is None else exc.data, **exc.extra))
        except Exception:
            metrics.REFUSED.labels("GENERAL_ERROR").inc()
            log.exception("handling %s from %s failed", frame.type, self.user_id)
            await self.send(text_data=encode("GENERAL_ERROR", frame.data, frame.reference))

    async def on_auth_client(self, frame: Frame) -> None:
        data = require_dict(frame)
        app_id, user_id = require_str(data, "appId"), require_str(data, "userId", max_len=96)
        token = data.get("token") if isinstance(data.get("token"), str) else ""
        outcome = await client_authenticate(app_id=app_id, user_id=user_id, token=token)
        metrics.AUTH.labels("admitted" if outcome.ok else "refused").inc()
        if not outcome.ok:
            await self.send(text_data=encode("AUTH_CLIENT_REPLY",
                                             {"appId": app_id, "userId": user_id, "isAuthenticated": False}))
            log.info("refused %s: %s", user_id, outcome.reason)
            self.closing = True
            await self.close(code=CLOSE_POLICY)
            return
        node = runtime()
        await node.ensure_started()
        app = outcome.app
        self.acks = data.get("acks") is True
        headers = dict(self.scope.get("headers") or [])
        client = self.scope.get("client") or ("", 0)
        self.session_id = await run_db(
            session_open, app_id=app.pk, user_id=user_id, node_id=node.node_id, channel_name=self.channel_name,
            acks=self.acks, remote_addr=str(client[0] or ""),
            user_agent=headers.get(b"user-agent", b"").decode(errors="replace"),
        )
        self.app, self.user_id, self.app_loaded_at = app, user_id, time.monotonic()
        self.bucket = TokenBucket(app.rate_limit_per_second, app.rate_limit_burst)
        self.auth_timer.cancel()
        node.connections[self.channel_name] = LocalConnection(user_id=user_id, acks=self.acks)
        metrics.CONNECTIONS.set(len(node.connections))
        first = await cache.connection_add(user_id=user_id, channel_name=self.channel_name,
                                           node_id=node.node_id, acks=self.acks)
        await self.send(text_data=encode("AUTH_CLIENT_REPLY",
                                         {"appId": app_id, "userId": user_id, "isAuthenticated": True}))
        if first:
            await master_notify(master_user_id=app.master_user_id, event_type="USER_CONNECTED", user_id=user_id)
        if self.acks:
            # What this user was sent but never acknowledged comes again, with the same ids.
            node.routing.add(await run_db(deliveries_unacked_for, app_id=app.pk, user_id=user_id))

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
            raise FrameError(f"recipient '{to[:96]}' is not a user id (<appName>-<digits>)", data)
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

    async def on_message(self, frame: Frame) -> None:
        app = await self._current_app()
        data = require_dict(frame)
        to = self._check_recipient(app, data.get("to"), data)
        content = self._check_content(app, data)
        if frame.feature == FEATURE_FAST:
            await self._send_fast([to], content, frame.reference)
            return
        client_message_id = data.get("clientMessageId")
        if client_message_id is not None and (not isinstance(client_message_id, str) or len(client_message_id) > 128):
            raise FrameError("clientMessageId must be a string of at most 128 characters", data)
        await run_db(
            message_send, app_id=app.pk, sender=self.user_id, recipients=[to], content=content,
            reference=frame.reference or "", client_message_id=client_message_id,
            confirmation_requested=bool(frame.reference) and frame.confirmation_enabled,
        )

    async def on_group_message(self, frame: Frame) -> None:
        app = await self._current_app()
        data = require_dict(frame)
        recipients = data.get("to")
        if not isinstance(recipients, list) or not recipients:
            raise FrameError("'to' must be a non-empty list of user ids", data)
        if len(recipients) > app.max_group_recipients:
            raise FrameError(f"at most {app.max_group_recipients} recipients per group message", None,
                             limit=app.max_group_recipients)
        recipients = [self._check_recipient(app, to, data) for to in recipients]
        content = self._check_content(app, data)
        if frame.feature == FEATURE_FAST:
            await self._send_fast(recipients, content, frame.reference)
            return
        await run_db(message_send, app_id=app.pk, sender=self.user_id, recipients=recipients, content=content,
                     kind=MessageKind.GROUP, reference=frame.reference or "")

    async def _send_fast(self, recipients: list[str], content: str, reference: str | None) -> None:
        """FAST: straight through the channel layer, never stored; best effort."""
        event = sockets.message_fast_event(encode("MESSAGE", {"from": self.user_id, "content": content}, reference))
        sends = []
        for to in dict.fromkeys(recipients):
            sends.extend((c.channel_name, event) for c in await cache.connections_of(to))
        await sockets.send_many(sends)

    async def on_fetch(self, frame: Frame) -> None:
        data = require_dict(frame)
        count = data.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise FrameError("'count' must be a positive integer", data)
        result = await run_db(missing_fetch, app_id=self.app.pk, user_id=self.user_id, count=min(count, FETCH_MAX),
                              skip_ids=list(self.written), acks=self.acks)
        for item in result.items:
            await self.send(text_data=item.frame)
        if not self.acks and result.items:
            ids = [i.delivery_id for i in result.items]
            self._remember_written(ids)
            runtime().delivered.add(ids)
        await self.send(text_data=encode("FETCH_MISSING_MESSAGES_COMPLETE", {"leftMissingCount": result.left}))

    async def on_ack(self, frame: Frame) -> None:
        data = require_dict(frame)
        ids = data.get("ids")
        if not isinstance(ids, list) or not ids or len(ids) > FETCH_MAX:
            raise FrameError(f"'ids' must be a list of 1 to {FETCH_MAX} message ids", data)
        try:
            message_ids = [int(i) for i in ids]
        except (TypeError, ValueError):
            raise FrameError("'ids' must hold message ids", data) from None
        await run_db(deliveries_mark_delivered, message_ids=message_ids, recipient=self.user_id)

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
        await self.send(text_data=encode("PONG", {}))

    async def on_pong(self, frame: Frame) -> None:
        return None

    async def on_subscribe(self, frame: Frame) -> None:
        if not self.app.client_subscriptions_allowed:
            raise FrameError("client subscriptions are not allowed for this app", frame.data)
        raise FrameError("channel subscriptions are not available on this server yet", frame.data)

    handlers = {
        "MESSAGE": on_message,
        "GROUP_MESSAGE": on_group_message,
        "FETCH_MISSING_MESSAGES_REQUEST": on_fetch,
        "ACK": on_ack,
        "CLOSE_CONNECTION": on_close_connection,
        "PING": on_ping,
        "PONG": on_pong,
        "SUBSCRIBE": on_subscribe,
        "UNSUBSCRIBE": on_subscribe,
        "AUTH_CLIENT": None,  # set below: re-authentication is refused
    }

    async def on_reauth(self, frame: Frame) -> None:
        raise FrameError("already authenticated; open a new connection to change user", frame.data)

    handlers["AUTH_CLIENT"] = on_reauth

    # --- events from the channel layer (messaging.sockets) -------------------------------------

    async def message_deliver(self, event: sockets.MessageDeliverEvent) -> None:
        now = time.time()
        for item in event["items"]:
            await self.send(text_data=item["frame"])
            metrics.DELIVERY_LATENCY.observe(max(0.0, now - item["stored_at"]))
        metrics.WRITTEN.inc(len(event["items"]))
        if not self.acks:
            ids = [item["delivery_id"] for item in event["items"]]
            self._remember_written(ids)
            runtime().delivered.add(ids)

    async def message_fast(self, event: sockets.MessageFastEvent) -> None:
        await self.send(text_data=event["frame"])

    async def presence_event(self, event: sockets.PresenceEvent) -> None:
        await self.send(text_data=event["frame"])

    async def connection_close(self, event: sockets.ConnectionCloseEvent) -> None:
        self.closing = True
        await self.close(code=event["code"])

    def _remember_written(self, ids: list[int]) -> None:
        for delivery_id in ids:
            self.written[delivery_id] = None
        while len(self.written) > WRITTEN_MEMORY:
            self.written.popitem(last=False)
