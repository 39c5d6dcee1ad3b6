"""A Socket.IO 5 connection: the /ws consumer (messaging.gateway.consumers) with its frames translated.

It runs above an Engine.IO session (messaging.gateway.socketio.engine), which hands it each Socket.IO packet
as a text frame (a binary attachment as a bytes frame). Every packet the client sends is turned
into the /ws frame it stands for and goes through the same checks, budgets and handlers
(messaging.gateway.connection.handlers); every frame those write is turned into the Socket.IO packet that
stands for it (messaging.gateway.socketio.mapping). So the connection's life, ledger, presence, delivery,
channels and drain are the ones of /ws, and a Socket.IO user and a /ws user are the same to the rest
of the platform.

Only the default namespace `/` exists. The CONNECT packet's `auth` is AUTH_CLIENT's data; the
reply is `{sid, pid}`, where `sid` is the id of the connection's session row (its clientId) and
`pid` a signed token of the app and user that a reconnecting socket.io-client sends back (answered
with the same `pid`: `socket.recovered`). An event with an acknowledgement callback gets its answer
there; in ACK mode a stored message (and a request's outcome, `resolve` or `reject`) is emitted with an
acknowledgement request, and the client's callback is its ACK.
"""

from __future__ import annotations

import json

from django.core import signing
from socketio import packet as sio

from foundation.transport.frames import CLOSE_NORMAL, CLOSE_POLICY, dumps
from messaging.core import metrics
from messaging.core.protocol import FETCH_MAX, FrameError, frame_of, invalid
from messaging.gateway.consumers import ClientConsumer
from messaging.gateway.socketio import mapping

PID_SALT = "switchboard.socketio.pid"
NO_BINARY = "binary data is not taken here: content and every field are text or JSON"


class _StrictJson:
    """Socket.IO's JSON without NaN and Infinity (not JSON: no reply could carry them back)."""

    @staticmethod
    def loads(text: str):
        return json.loads(text, parse_constant=mapping.no_constants)

    @staticmethod
    def dumps(value, **kwargs):
        return dumps(value)


class Packet(sio.Packet):
    json = _StrictJson


def pid_for(app_id: str, user_id: str, session: str = "") -> str:
    """Socket.IO's private session id: the user's, and its resumable session (docs/protocol.md, "Sessions")."""
    return signing.dumps([app_id, user_id, session], salt=PID_SALT, compress=False)


def pid_session(pid: object, app_id: str, user_id: str) -> str | None:
    """The resumable session a `pid` brought back for this user ("" for none), or None: not this
    user's pid (or not one of ours)."""
    if not isinstance(pid, str) or len(pid) > 512:
        return None
    try:
        value = signing.loads(pid, salt=PID_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(value, list) or value[:2] != [app_id, user_id]:
        return None
    return value[2] if len(value) == 3 and isinstance(value[2], str) else ""


def pid_matches(pid: object, app_id: str, user_id: str) -> bool:
    return pid_session(pid, app_id, user_id) is not None


class SocketIOConsumer(ClientConsumer):
    async def connect(self) -> None:
        self.answering: int | None = None  # the ack id of the event being handled, until answered
        self.collected: list[dict] | None = None  # fetch_missing with a callback: its messages
        self.emitted: dict[int, int] = {}  # ack id of a message emitted in ACK mode -> message id
        self.asked: dict[int, str] = {}  # ack id of a server_request emitted -> its request id
        self.next_ack = 0
        self.login: dict = {}  # the CONNECT packet's auth
        self.redirect: str | None = None  # a refused login's other domain
        self.recovering = False  # the login brought back its pid: what waits is pushed once admitted
        self.quiet_fetch = False  # that push's own fetch: its end says nothing unless more is left
        await super().connect()

    @property
    def answers_sends(self) -> bool:
        return self.answering is not None  # `message` with a callback gets {id}

    # --- packets from the client -----------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self.raw_allowed(text_data, bytes_data):
            return
        if bytes_data is not None:
            return await self._refuse(NO_BINARY)
        plain = mapping.plain_event(text_data)  # the common case, parsed without a Packet
        if plain is not None:
            if plain is mapping.MALFORMED:
                return await self._refuse("malformed Socket.IO packet")
            return await self._event(*plain)
        try:
            pkt = Packet(encoded_packet=text_data)
        except (ValueError, TypeError, RecursionError):
            return await self._refuse("malformed Socket.IO packet")
        if pkt.attachment_count:
            # Content is text: a packet that declares binary attachments is refused at once, and the
            # connection closed, rather than its attachments gathered (a count of up to ten digits,
            # each a frame of up to the payload limit, held until the last came).
            self.answering = pkt.id  # (its callback, if it asked for one, hears why)
            try:
                await self._refuse(NO_BINARY)
            finally:
                self.answering = None
            return await self.close_with(CLOSE_POLICY, "binary attachments are not accepted")
        await self._packet(pkt)

    async def _packet(self, pkt: Packet) -> None:
        namespace = pkt.namespace or "/"
        if namespace != "/":
            if pkt.packet_type == sio.CONNECT:
                await self._send(Packet(sio.CONNECT_ERROR, {"message": "Invalid namespace"}, namespace=namespace))
            return
        kind = pkt.packet_type
        if kind == sio.CONNECT:
            await self._connect(pkt)
        elif kind in (sio.EVENT, sio.BINARY_EVENT):
            await self._event(pkt.data, pkt.id)
        elif kind in (sio.ACK, sio.BINARY_ACK):
            message_id = self.emitted.pop(pkt.id, None) if pkt.id is not None else None
            asked = self.asked.pop(pkt.id, None) if pkt.id is not None else None
            if message_id is not None and self.life.authenticated:
                await self.handle(frame_of({"type": "ACK", "data": {"ids": [str(message_id)]}}, escaped=False))
            if asked is not None and self.life.authenticated:  # the callback of a server_request: its answer
                answer = mapping.answer_frame(asked, pkt.data)
                await (self._as_frame(answer, escaped=True) if answer else self._refuse(mapping.ANSWER_SHAPE))
        elif kind == sio.DISCONNECT:
            if self.life is not None and not self.life.close_note:
                self.life.close_note = "client disconnected (Socket.IO DISCONNECT)"
            await self.close_with(CLOSE_NORMAL, "client disconnected")

    async def _connect(self, pkt: Packet) -> None:
        if self.life.authenticated:
            return await self._send(Packet(sio.CONNECT, self._connected()))
        auth = pkt.data if isinstance(pkt.data, dict) else {}
        self.login = auth
        session = pid_session(auth.get("pid"), str(auth.get("appId")), str(auth.get("userId")))
        self.recovering = session is not None
        data = {k: auth[k] for k in ("appId", "userId", "token", "acks") if k in auth}
        if session:  # recovery resumes the session the pid carries
            data["sessionId"] = session
        await self._as_frame({"type": "AUTH_CLIENT", "data": data}, escaped=True)
        if self.life.authenticated and self.recovering:
            await self._recover()

    def _connected(self) -> dict:
        """CONNECT's answer: the session's id, and the pid (the one brought back, when recovering)."""
        app_id, session = str(self.login.get("appId")), self.life.client_session
        resumed = self.recovering and pid_session(self.login["pid"], app_id, self.life.user_id) == session
        pid = self.login["pid"] if resumed else pid_for(app_id, self.life.user_id, session)
        return {"sid": str(self.life.session_id), "pid": pid}

    async def _recover(self) -> None:
        """A reconnect that brought its `pid` back (socket.io-client's connection state recovery):
        what is stored for the user and was not delivered (in ACK mode: not acknowledged) is pushed
        now, as `message` events, up to FETCH_MAX of them; `fetch_complete` tells how many more wait
        for `fetch_missing`."""
        self.recovering = False
        self.quiet_fetch = True
        try:
            await self.handle(frame_of({"type": "FETCH_MISSING_MESSAGES_REQUEST", "data": {"count": FETCH_MAX}},
                                       escaped=False))
        finally:
            self.quiet_fetch = False

    async def _event(self, data: object, ack_id: int | None) -> None:
        args = data if isinstance(data, list) else []
        self.answering = ack_id
        try:
            if not args or not isinstance(args[0], str):
                raise FrameError("an event is a list that starts with its name")
            if not self.life.authenticated:
                raise FrameError("not connected: send CONNECT with auth first")
            raw = mapping.frame_for_event(args[0], args[1] if len(args) > 1 else None)
            if args[0] == "fetch_missing" and ack_id is not None:
                self.collected = []
            await self._as_frame(raw, escaped=True)
            if self.answering is not None:  # a handler that writes no answer (FAST, ack): done
                await self._answer(mapping.DONE.get(raw["type"], {}) if raw.get("feature") != "FAST"
                                   else {"id": None, "feature": "FAST"})
        except FrameError as exc:
            await self._refuse(exc.reason)
        finally:
            self.answering = None
            self.collected = None

    async def _as_frame(self, raw: dict, *, escaped: bool) -> None:
        try:
            frame = frame_of(raw, escaped=escaped)
        except FrameError as exc:
            await self._refuse(exc.reason)
            return
        await self.handle(frame)

    async def _refuse(self, reason: str) -> None:
        metrics.REFUSED.labels("INVALID_MESSAGE").inc()
        await self.write(invalid(reason))

    # --- frames to the client --------------------------------------------------------------------

    async def write(self, text: str) -> bool:
        """A /ws frame, written as the Socket.IO packet that stands for it (or kept for the answer
        of the event being handled)."""
        frame = json.loads(text)
        kind, data = frame["type"], frame.get("data")
        if kind == "AUTH_CLIENT_REPLY":
            if data.get("isAuthenticated"):
                metrics.SOCKETIO_CONNECTS.labels("admitted").inc()
                return await self._send(Packet(sio.CONNECT, self._connected()))
            self.redirect = data.get("redirect")
            return True  # the refusal's reason comes with the close (close_with)
        if not self.life.authenticated and self.answering is None and kind in ("INVALID_MESSAGE", "GENERAL_ERROR",
                                                                                "AUTH_REQUIRED"):
            # (a refused CONNECT; an event sent before it answers its own callback, below)
            error = mapping.error_of(kind, data)
            return await self._send(Packet(sio.CONNECT_ERROR, {"message": error["detail"],
                                                               "data": {"code": error["error"]}}))
        if kind in mapping.STORED:  # (a message, a confirmation, a request's outcome)
            message = mapping.message_of(kind, data, frame.get("reference"))
            if self.collected is not None and kind == "MESSAGE":
                self.collected.append(message)
                return True
            ack_id = None
            if (self.life.acks and "id" in data) or kind == "SERVER_REQUEST":  # its ACK (or answer): the callback
                self.next_ack += 1
                ack_id = self.next_ack
                if self.life.acks:
                    self.emitted[ack_id] = int(data["id"])
                if kind == "SERVER_REQUEST":
                    self.asked[ack_id] = str(data.get("requestId"))
            return await super().write(mapping.event_text(mapping.STORED[kind], message, ack_id))
        answer = mapping.answer_of(kind, data, self.collected)
        if answer is not None:
            if self.answering is not None:
                return await self._answer(answer)
            if self.quiet_fetch and kind == "FETCH_MISSING_MESSAGES_COMPLETE" and not answer["leftMissingCount"]:
                return True
            event = mapping.UNANSWERED.get(kind)
            return True if event is None else await super().write(mapping.event_text(event, answer))
        event = mapping.event_of(kind, data)
        return True if event is None else await super().write(mapping.event_text(*event))

    async def _answer(self, result: dict) -> bool:
        ack_id, self.answering = self.answering, None
        return await self._send(Packet(sio.ACK, [result], id=ack_id))

    async def _send(self, pkt: Packet) -> bool:
        """A packet of our own making: JSON only (the server sends no binary), so one text frame."""
        return await super().write(pkt.encode())

    # --- the end ---------------------------------------------------------------------------------

    async def close_with(self, code: int, reason: str = "") -> None:
        """A refused login is a CONNECT_ERROR `{message, data: {code, redirect?}}`; a connection the
        platform ends for good (closed by the master user's CLOSE_CONNECTION, the API's or the
        admin's disconnect, or with 1008: a revoked key, abuse) gets a Socket.IO DISCONNECT first,
        on either transport, so the client does not come back. Any other close (a drain's 1012,
        overload, a slow reader, a takeover) closes the transport only: the client reconnects."""
        if not self.closing and self.life is not None:
            if not self.life.authenticated and code not in mapping.RECONNECT_CODES:
                error: dict = {"code": code}
                if self.redirect:
                    error["redirect"] = self.redirect
                metrics.SOCKETIO_CONNECTS.labels("refused").inc()
                await self._send(Packet(sio.CONNECT_ERROR, {"message": reason or "refused", "data": error}))
            elif self.life.authenticated and (code == CLOSE_POLICY or self.closed_for_good):
                await self._send(Packet(sio.DISCONNECT))
        await super().close_with(code, reason)
