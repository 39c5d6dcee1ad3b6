"""The client WebSocket at /ws (docs/protocol.md): a consumer that only dispatches.

Client frames: size and budget are checked on the raw frame (before AUTH_CLIENT a frame may be only
WS_PREAUTH_MAX_FRAME_BYTES long: daphne's transport refuses a larger one from its header, unread,
and the consumer checks again where it runs without that adapter), then JSON, then the frame goes to its handler
(messaging.gateway.connection.handlers). A bad frame gets INVALID_MESSAGE and the connection keeps working;
an internal failure gets GENERAL_ERROR with the frame's data (the client may resend: nothing was
stored). Events from the channel layer (the socket door, foundation.transport.sockets) go to the
connection's ledger (messaging.gateway.connection.ledger) and the socket; channel publishes come through
the inbox (messaging.gateway.connection.inbox).

What a connection guarantees its client:
- it never writes the same delivery twice, whether a message comes by push or by fetch (the
  consumer handles one event at a time, and its ledger remembers what it wrote or holds in flight);
- a stored message counts as delivered only once its frame has left the node (linker clients) or
  the client ACKed it (ACK mode); a connection that closes first, for whatever reason, gives its
  messages back to the mailbox, with no attempt counted;
- whatever goes wrong inside it, its end runs (messaging.gateway.connection.life): presence, the master's
  USER_DISCONNECTED and the session row are settled on every way out;
- when its node drains (messaging.gateway.drain) it is closed with 1012, and the drain waits for its end.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from django.conf import settings

from foundation.daphne_adapter import (
    CLOSE_HOLD_EXTENSION,
    FRAME_LIMIT_EXTENSION,
    OUTGOING_EXTENSION,
    CloseHold,
    FrameLimit,
    OutgoingBuffer,
)
from foundation.draining import DRAINING_REASON, draining
from foundation.transport import sockets
from foundation.transport.frames import CLOSE_AUTH_TIMEOUT, CLOSE_POLICY, CLOSE_RESTART, CLOSE_TOO_BIG, encode
from messaging.channels.cursor import ChannelCursor
from messaging.core import metrics
from messaging.core.protocol import Frame, FrameError, invalid, parse_frame
from messaging.gateway.connection.handlers import HANDLERS, Handler, on_auth_client, retry_after_ms
from messaging.gateway.connection.inbox import ChannelReaderConsumer
from messaging.gateway.connection.ledger import DeliveryLedger
from messaging.gateway.connection.life import ConnectionLife
from messaging.gateway.limits import TokenBucket
from presence.master_view import MasterView
from presence.online import user_is_online
from presence.remote import remote_is_online
from presence.services import master_online

log = logging.getLogger(__name__)
CONTROL_TYPES = {"PING", "PONG", "ACK"}  # cheap: they draw on the frame budget alone


def frame_over(text: str | None, data: bytes | None, limit: int) -> bool:
    """Whether a frame holds more than `limit` bytes (UTF-8), without encoding a text that cannot."""
    if text is None:
        return len(data or b"") > limit
    if len(text) > limit:
        return True
    return len(text) * 4 > limit and len(text.encode(errors="surrogatepass")) > limit


class ClientConsumer(ChannelReaderConsumer):
    life: ConnectionLife | None = None  # from connect on
    ledger: DeliveryLedger | None = None  # from authentication on
    outgoing: OutgoingBuffer | None = None  # the transport's view of the socket's buffer (daphne)
    close_hold: CloseHold | None = None  # the closing handshake's end, held for its ACKs (daphne)
    auth_timer: asyncio.TimerHandle | None = None
    master: MasterView | None = None  # the app's master user's connection: what it was told
    master_timer: asyncio.TimerHandle | None = None
    answers_sends = False  # MESSAGE_ACCEPTED goes to ACK-mode senders only (docs/protocol.md)
    closed_for_good = False  # closed by its master user, the API or an operator (not to come back by itself)

    async def dispatch(self, message: dict) -> None:
        # Channels' default dispatch runs close_old_connections in a thread before every message
        # (a thread hop per frame: a fifth of a node's CPU under load). This consumer never uses
        # the ORM on the event loop; every DB call goes through run_db, which looks after its own.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def switchboard_close_reply(self, message: dict) -> None:
        """The client's close frame has come (foundation.daphne_adapter.CloseHold): every frame it sent
        before has been handled, one at a time in order; the ACKs among them are committed before
        its connection is dropped. The client reconnects when it sees that drop, so its next node,
        which takes over what is still unacknowledged, never hands it again what it ACKed here."""
        hold = self.close_hold
        try:
            if self.life is not None and self.life.authenticated:
                await self.life.node.delivered.caught_up()
        finally:
            if hold is not None:
                hold.done()

    async def websocket_disconnect(self, message: dict) -> None:
        # Channels' own runs close_old_connections in a thread after disconnect: a thread hop per
        # closed socket, a twentieth of a node's CPU in a reconnect storm, for connections this
        # consumer never opens (see dispatch). It has no groups of Channels' kind to discard.
        await self.disconnect(message["code"])
        raise StopConsumer()

    # --- the connection's own state ------------------------------------------------------------

    async def connect(self) -> None:
        self.life = ConnectionLife(channel_name=self.channel_name, close=self.close_with)
        self.durable: set[str] = set()
        self.closing = False
        self.leaving = False  # its node drains: it takes no more pushes
        extensions = self.scope.get("extensions") or {}
        self.outgoing = extensions.get(OUTGOING_EXTENSION)
        self.frame_limit: FrameLimit | None = extensions.get(FRAME_LIMIT_EXTENSION)
        self.close_hold = extensions.get(CLOSE_HOLD_EXTENSION)
        if self.outgoing is not None:
            self.outgoing.on_flush = self._flushed
        await self.accept()
        if draining():  # on a connection accepted before the node stopped listening
            await self.close_with(CLOSE_RESTART, DRAINING_REASON)
            return
        self.life.node.drainable_add(self.channel_name, self._drain)
        self.auth_timer = asyncio.get_running_loop().call_later(
            settings.WS_AUTH_TIMEOUT, lambda: asyncio.ensure_future(self._auth_timeout()))

    def admitted(self) -> None:
        self.auth_timer.cancel()
        if self.frame_limit is not None:
            self.frame_limit.lift()  # the transport refused larger frames unread until now
        self.ledger = DeliveryLedger(acks=self.life.acks, window=settings.WS_ACK_WINDOW)
        if self.close_hold is not None and self.life.acks:
            self.close_hold.wanted = True  # (switchboard_close_reply)
        self.channels = ChannelCursor(app_id=self.life.app.pk, hub=self.life.node.hub, reader=self,
                                      write=self._write_channel, transport="ws", missed=self._write_missed)

    def master_watch(self, view: MasterView) -> None:
        """This is the app's master user's connection, told `view` so far: kept right every
        PRESENCE_MASTER_RESYNC_SECONDS (presence.master_view)."""
        self.master = view
        self._master_resync_later()

    def _master_resync_later(self) -> None:
        def due() -> None:
            if not self.closing and not self.ended:
                asyncio.ensure_future(sockets.send_many([(self.channel_name, sockets.presence_resync_event())]))
                self._master_resync_later()
        self.master_timer = asyncio.get_running_loop().call_later(settings.PRESENCE_MASTER_RESYNC_SECONDS, due)

    def _let_go(self, finished: asyncio.Future | None = None) -> None:
        super()._let_go(finished)
        self.closing = True  # (a late timer or close finds it closed, not half-made)

    async def _drain(self) -> None:
        """The node drains: no more pushes (they go back to the mailbox), the ACKs of what is in
        flight are waited for (settings.DRAIN_ACK_WAIT_SECONDS at most), and what this node has read of the
        client (its ACKs, the frames that left) is committed, before the client hears 1012: on its
        next node it is not handed again what it acknowledged here."""
        self.leaving = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(settings.DRAIN_ACK_WAIT_SECONDS, settings.DRAIN_GRACE_SECONDS / 2)
        while self.ledger is not None and self.ledger.inflight and not self.closing and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self.life is not None:
            await self.life.node.delivered.caught_up()
        await self.close_with(CLOSE_RESTART, DRAINING_REASON)

    async def _auth_timeout(self) -> None:
        if not self.life.authenticated and not self.closing:
            await self.close_with(CLOSE_AUTH_TIMEOUT, "not authenticated in time")

    async def close_with(self, code: int, reason: str = "") -> None:
        if not self.closing:
            self.closing = True
            self.life.close_note = f"server closed ({code}){': ' + reason if reason else ''}"[:200]
            await self.close(code=code, reason=reason or None)

    async def disconnect(self, code: int) -> None:
        if self.life is not None and not self.life.close_note:
            self.life.close_note = f"client closed ({code})"
        await self.end()

    async def release(self) -> None:
        if self.auth_timer is not None:
            self.auth_timer.cancel()
        if self.master_timer is not None:
            self.master_timer.cancel()
        if self.outgoing is not None:
            self.outgoing.on_flush = None
        if self.life is not None:
            position = self.outgoing.flushed() if self.outgoing is not None else None
            try:
                await self.life.end(ledger=self.ledger, channels=self.channels, position=position)
            finally:
                self.life.node.drainable_remove(self.channel_name)  # a drain waits for this end

    # --- writing to the socket -----------------------------------------------------------------

    async def write(self, text: str) -> bool:
        """Queue one frame; False when the socket took nothing (closed, or cut off as a slow reader)."""
        before = self.outgoing.queued if self.outgoing is not None else None
        await self.send(text_data=text)
        return before is None or self.outgoing.queued > before

    def write_position(self) -> int | None:
        return self.outgoing.queued if self.outgoing is not None else None

    def _flushed(self) -> None:
        """Called by the transport after it wrote to the socket: what has left the node is delivered."""
        if self.ledger is not None:
            done = self.ledger.flushed(self.outgoing.flushed())
            if done:
                self.life.node.delivered.add(done)

    # --- frames from the client ----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self.raw_allowed(text_data, bytes_data):
            return
        try:
            frame = parse_frame(text_data)
        except FrameError as exc:
            metrics.REFUSED.labels("INVALID_MESSAGE").inc()
            await self.write(invalid(exc.reason, exc.data))
            return
        await self.handle(frame)

    async def raw_allowed(self, text_data: str | None, bytes_data: bytes | None) -> bool:
        """Size, then rate, on the raw frame: a client over either costs no parsing at all."""
        authenticated = self.life.authenticated
        limit = settings.WS_MAX_FRAME_BYTES if authenticated else settings.WS_PREAUTH_MAX_FRAME_BYTES
        if frame_over(text_data, bytes_data, limit):
            metrics.LIMITED.labels("frame_size" if authenticated else "preauth_frame_size").inc()
            await self.close_with(CLOSE_TOO_BIG, f"frame over {limit} bytes{'' if authenticated else ' before AUTH_CLIENT'}")
            return False
        return await self._allowed(self.life.limits.frames)

    async def handle(self, frame: Frame) -> None:
        """A parsed frame: its work budget, then its handler (AUTH_CLIENT alone before authentication)."""
        metrics.FRAMES.labels(frame.type).inc()
        work = self.life.limits.work
        if work is not None and frame.type not in CONTROL_TYPES and not await self._allowed(work, frame):
            return
        if not self.life.authenticated:
            if frame.type == "AUTH_CLIENT":
                await self._guard(frame, on_auth_client)
            else:
                await self.write(encode("AUTH_REQUIRED", {}))
            return
        await self._guard(frame, HANDLERS[frame.type])

    async def _allowed(self, bucket: TokenBucket, frame: Frame | None = None) -> bool:
        """A frame draws on `bucket` (messaging.gateway.limits). Beyond it the frame is refused; persistent
        abuse closes the connection with 1008."""
        wait = bucket.take(1)
        if not wait:
            return True
        metrics.LIMITED.labels("frames").inc()
        if self.life.limits.refusals.add():
            metrics.LIMITED.labels("abusive").inc()
            await self.close_with(CLOSE_POLICY, "rate limit exceeded repeatedly")
        elif self.life.authenticated:  # before authentication, excess frames get no answer at all
            await self.write(invalid("rate limit exceeded", frame.data if frame else None,
                                     retryAfterMs=retry_after_ms(wait)))
        return False

    async def _guard(self, frame: Frame, handler: Handler) -> None:
        try:
            await handler(self, frame)
        except FrameError as exc:
            metrics.REFUSED.labels("INVALID_MESSAGE").inc()
            echoed = (frame.data if exc.data is None else exc.data) if exc.echo else None
            await self.write(invalid(exc.reason, echoed, **exc.extra))
        except Exception:
            metrics.REFUSED.labels("GENERAL_ERROR").inc()
            log.exception("handling %s from %s failed", frame.type, self.life.user_id)
            await self.write(encode("GENERAL_ERROR", frame.data, frame.reference))

    # --- events from the channel layer (foundation.transport.sockets) --------------------------

    async def message_deliver(self, event: sockets.MessageDeliverEvent) -> None:
        now, ledger, frames = time.time(), self.ledger, 0
        if ledger is None:  # pushed while its authentication was being refused: back to the mailbox
            self.life.node.released.add([(item["delivery_id"], item["claim"]) for item in event["items"]])
            return
        for item in event["items"]:
            delivery_id, message_id, claim = item["delivery_id"], item["message_id"], item["claim"]
            if not ledger.admit(delivery_id, message_id, claim, closing=self.closing or self.leaving):
                continue
            if not await self.write(item["frame"]):
                ledger.not_written(delivery_id, claim)
                continue
            ledger.wrote(delivery_id, message_id, claim)
            metrics.DELIVERY_LATENCY.observe(max(0.0, now - item["stored_at"]))
            frames += 1
        metrics.WRITTEN.inc(frames)
        self.life.settle(ledger.batch_end(self.write_position()))

    async def message_fast(self, event: sockets.MessageFastEvent) -> None:
        await self.write(event["frame"])

    async def exchange_events(self, event: sockets.ExchangeEventsEvent) -> None:
        for frame in event["frames"]:
            if not await self.write(frame):
                return  # the socket took nothing (closed, or cut off as a slow reader): the rest neither

    async def presence_event(self, event: sockets.PresenceEvent) -> None:
        # Announcements about one user can arrive out of the order their changes were made in (two
        # nodes announce, or a restarted node's cleanup announces its dead connections while their
        # users are already back on another node): each is written only if it is still true now,
        # so the last frame the master gets about a user tells where that user stands.
        # The master's view is kept too: a notice that tells it nothing new is not written.
        user_id = event.get("user_id")
        if user_id is not None and await self._stale(user_id, event["online"], event.get("domain")):
            metrics.PRESENCE_STALE.inc()
            return
        if user_id is not None and self.master is not None and not self.master.notice(user_id, event["online"]):
            return
        await self.write(event["frame"])

    async def presence_resync(self, event: sockets.PresenceResyncEvent) -> None:
        """What the master was told against who is online now: the notices for the difference (one
        lost on the way, presence.master_view)."""
        if self.master is None or self.closing:
            return
        app = self.life.app
        try:
            online = await master_online(app_name=app.app_name, master_user_id=app.master_user_id)
        except Exception:  # Redis away for a moment: the next one
            log.warning("reading the online users of %s for its master failed", app.app_name)
            return
        frames = self.master.resync(set(online))
        if frames:
            metrics.PRESENCE_RESYNCED.inc(len(frames))
        for frame in frames:
            if not await self.write(frame):
                return

    async def _stale(self, user_id: str, online: bool, domain: str | None) -> bool:
        try:
            if domain is not None:  # a user of another domain: as this domain's list of it says now
                return await remote_is_online(self.life.app.app_name, domain, user_id) != online
            return await user_is_online(user_id) != online
        except Exception:  # Redis away for a moment: the announcement as it came, rather than none
            log.warning("checking the presence of %s failed; announcement written unchecked", user_id)
            return False

    async def connection_close(self, event: sockets.ConnectionCloseEvent) -> None:
        self.closed_for_good = bool(event.get("final"))
        await self.close_with(event["code"], event["reason"])

    # --- channels (the hub hands publishes to the inbox; see messaging.channels.hub) -------------

    async def _write_channel(self, channel: str, offset: int, content: str) -> bool:
        if self.outgoing is not None and self.outgoing.closed:
            return False  # gone: a replay reads no more history for it
        return await self.write(encode("CHANNEL_MESSAGE", {"channel": channel, "content": content, "offset": offset}))

    async def _write_missed(self, notice: dict) -> None:
        await self.write(encode("CHANNEL_MISSED", notice))

    async def channel_join(self, event: sockets.ChannelMembershipEvent) -> None:
        if self.channels is not None:
            self.durable.add(event["channel"])
            await self.channels.join(event["channel"])

    async def channel_leave(self, event: sockets.ChannelMembershipEvent) -> None:
        if self.channels is not None:
            self.durable.discard(event["channel"])
            await self.channels.leave(event["channel"])
