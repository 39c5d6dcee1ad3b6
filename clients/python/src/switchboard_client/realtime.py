"""An asyncio client of Switchboard's WebSocket protocol (docs/protocol.md): what switchboard.js
does in a browser, for a Python program.

    async with Realtime("wss://host/ws", app_id="app-id-343", user_id="ANZ-1001", acks=True) as rt:
        accepted = await rt.send("ANZ-1002", "hello")      # once stored: accepted.id
        async for message in rt.messages():                # each id once; ACKed when the loop moves on
            print(message.sender, message.content)

It reconnects by itself with backoff and jitter (close codes 1012 and 4002 come back at once, 1013
and the rest back off; 1000 and 1008 end it), fetches what was missed after every authentication,
shows a message id once, acknowledges in ACK mode once the app is done with a message, and keeps
RELIABLE sends in an outbox until MESSAGE_ACCEPTED (resent with the same clientMessageId after a
reconnect: stored once either way). A request to the app's server (`request()`) is resent the same
way until REQUEST_ACCEPTED, then waits for its outcome (RESOLVE or REJECT, pushed or fetched) however
long it takes. A user homed in another domain is refused with that domain's
URL (AUTH_CLIENT_REPLY `redirect`): the client goes there at once with the same credentials.

Sessions (docs/protocol.md "Sessions"): the client keeps the sessionId of every AUTH_CLIENT_REPLY and
presents it at each reconnect, so the outcomes of its requests are pushed to it wherever it
reconnects; a sessionId the server refuses (close 1008 `wrong_user`) is forgotten and the client logs
in afresh at once. `close_session()` ends the session and the client. Requests the app's server makes
of the user (SERVER_REQUEST) go to the `on_request` handler, each requestId once; its answer (RESOLVE
or REJECT) is resent after every reconnect until ANSWER_ACCEPTED, and only then, in ACK mode, is the
SERVER_REQUEST acknowledged.

Frames are handled through one table (`Realtime.FRAMES`: frame type -> method), and sends through
one outbox whose entries name the frame that settles them, so new frame types slot in beside these.
Only the socket's I/O is asynchronous; the protocol logic is plain methods and named timers, as in
switchboard.js, of which this is a port (channels are not ported yet).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random as _random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidURI, WebSocketException

from .backoff import Backoff

log = logging.getLogger("switchboard_client.realtime")

State = Literal["idle", "connecting", "authenticating", "connected", "reconnecting", "closed"]
Feature = Literal["RELIABLE", "FAST"]
TokenSource = str | Callable[[], str | Awaitable[str]]

NO_RECONNECT = frozenset({1000, 1008})  # a normal closure, or a policy the app must fix
PROMPT = frozenset({1012, 4002})  # restart / slow reader: come back soon, nothing is wrong
ABNORMAL = 1006  # no close frame: the link or the server went away
ACK_MAX = 2000  # ids per ACK frame (the server's limit)
MAX_REDIRECTS = 3
GENERAL_ERROR_TRIES = 5
WRONG_USER = "wrong_user"  # the close reason's start when a presented sessionId is not this user's
SEND_TYPES = ("MESSAGE", "GROUP_MESSAGE")


def reconnect_delay(attempt: int, code: int, *, min_delay: float = 0.5, first_max_delay: float = 2.0,
                    max_delay: float = 60.0, random: Callable[[], float] = _random.random) -> float:
    """Seconds to wait before reconnect `attempt` (0: the first after a stable connection): random
    between `min_delay` and a ceiling that starts at `first_max_delay` and doubles up to `max_delay`
    ("full jitter"). A close asking to come back (1012, 4002) always waits like a first attempt."""
    n = 0 if code in PROMPT else max(0, attempt)
    ceiling = Backoff(base=first_max_delay, cap=max_delay, jitter=0.0).seconds(n + 1)
    return min_delay + random() * max(0.0, ceiling - min_delay)


# --- what the client hands the app ----------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """A MESSAGE frame: `sender` is the frame's `from`. FAST messages have no id or seq."""

    sender: str
    content: str
    id: str | None = None
    seq: int | None = None
    reference: str | None = None


@dataclass(frozen=True)
class Confirmation:
    reference: str | None
    id: str | None = None
    seq: int | None = None


@dataclass(frozen=True)
class Accepted:
    """MESSAGE_ACCEPTED: the message is stored, as `id` (`duplicate`: stored before, by a send with
    the same client_message_id; `id` is that one's)."""

    id: str
    client_message_id: str | None
    recipients: int | None = None
    duplicate: bool = False


@dataclass(frozen=True)
class Sent:
    """Outside ACK mode (or FAST), a send is done once written: the protocol answers nothing more."""

    client_message_id: str


class RealtimeError(Exception):
    """What the server refused (`reason`, the echoed `data`, `limit`, `retry_after_ms`), or what went wrong."""

    def __init__(self, message: str, *, reason: str | None = None, data: Any = None, limit: int | None = None,
                 frame_type: str | None = None, retry_after_ms: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message
        self.data = data
        self.limit = limit
        self.frame_type = frame_type
        self.retry_after_ms = retry_after_ms
        self.code: str | int | None = code  # the refusal's code ("request_closed", ...); Closed: the close code


@dataclass(frozen=True)
class Outcome:
    """A request's outcome: what `request()` returns (a RESOLVE), or the `outcome` event, for either
    kind, of a request this client is not waiting for (made before a restart, say). `id` is the
    outcome message's own id; `reason` ("timeout", "endpoint_failed") only when the platform rejected;
    `duplicate`: the server had the request already (a resend, or the same client_message_id again)."""

    content: str
    request_id: str
    id: str
    client_message_id: str | None = None
    kind: Literal["resolve", "reject"] = "resolve"
    reason: str | None = None
    duplicate: bool = False


class RequestRejected(RealtimeError):
    """A request that got no RESOLVE: its REJECT (`frame_type` "REJECT": the server's `content`, the
    `request_id`, and `reason` "timeout" or "endpoint_failed" when the platform rejected, else None),
    or its refusal (`frame_type` "INVALID_MESSAGE": `reason` is the server's text and `code` says why:
    unknown_endpoint, too_many_requests, timeout_too_long, content_too_large, ...)."""

    def __init__(self, message: str, *, reason: str | None, content: str | None = None,
                 request_id: str | None = None, code: str | None = None, outcome_id: str | None = None,
                 client_message_id: str | None = None, frame_type: str = "REJECT", data: Any = None,
                 limit: int | None = None, retry_after_ms: int | None = None) -> None:
        super().__init__(message, reason=reason, data=data, limit=limit, frame_type=frame_type,
                         retry_after_ms=retry_after_ms)
        self.reason = reason  # (None for a REJECT of the server's own: not the message)
        self.content, self.request_id, self.code = content, request_id, code
        self.id, self.client_message_id = outcome_id, client_message_id  # (the REJECT message's id)


class Closed(RealtimeError):
    """The client stopped for good: closed by the app, or refused by the server (1000, 1008)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"connection closed ({code}{' ' + reason if reason else ''})", reason=reason)
        self.code = code


@dataclass(frozen=True)
class ServerRequest:
    """A request the app's server makes of the user (SERVER_REQUEST), as the `on_request` handler gets it:
    `id` is the SERVER_REQUEST message's own id (acknowledged in ACK mode once the answer is accepted)."""

    request_id: str
    content: str
    id: str
    seq: int | None = None


RequestHandler = Callable[[str, ServerRequest], Any]


@dataclass
class _Answer:
    """A server request handed to the handler: `handling` (the handler runs), `answering` (its answer is
    sent until accepted) or `done` (accepted, or refused for good)."""

    message_id: str
    state: Literal["handling", "answering", "done"] = "handling"


@dataclass
class _Outgoing:
    """A send not settled yet: `queued` (to be written) or `sent` (written, waiting for `settled_by`)."""

    frame: dict[str, Any]
    cmid: str
    group: bool
    awaits: bool
    future: asyncio.Future[Any]
    settled_by: str = "MESSAGE_ACCEPTED"
    state: Literal["queued", "sent"] = "queued"
    tries: int = 0


@dataclass
class _Waiting:
    """A request waiting for its outcome (its REQUEST_ACCEPTED may have come: `request_id`)."""

    future: asyncio.Future[Outcome]
    request_id: str | None = None
    duplicate: bool = False


class _Ticket:
    """A message handed to `count` messages() loops: done when each has settled it (at once, not on
    a later turn of the event loop, so a close() right after the loop moved on still sends its ACK)."""

    def __init__(self, done: Callable[[str | None, BaseException | None], None], message_id: str | None,
                 failed: BaseException | None, count: int) -> None:
        self.done, self.message_id, self.failed, self.count = done, message_id, failed, count

    def settle(self, handled: bool) -> None:
        if not handled and self.failed is None:
            self.failed = RealtimeError("a messages() loop was left before it was done with the message")
        self.count -= 1
        if self.count == 0:
            self.done(self.message_id, self.failed)


@dataclass
class _Iterator:
    queue: asyncio.Queue[tuple[Message, _Ticket] | None] = field(default_factory=asyncio.Queue)


Handler = Callable[[Any], Any]


class Realtime:
    """A connection to Switchboard that stays open until `close()`.

    Events (`on(name, callback)`; callbacks may be plain functions or coroutine functions):
    `state` (State), `connected` {app_id, user_id, session_id, resumed} (resumed: the session presented
    was taken back), `disconnected` {code, reason, will_reconnect},
    `reconnecting` {delay, attempt}, `message` (Message), `confirmation` (Confirmation), `accepted`
    (Accepted), `user_connected` / `user_disconnected` {user_id}, `online_users` {users, page, pages,
    count} (the app's master user), `synced` {} (a fetch ended with nothing left missing), `redirect`
    {from, to, count}, `fallback` {from, to}, `error` (RealtimeError), `outcome` (Outcome: of a
    request this client is not waiting for; in ACK mode acknowledged like a message once every
    callback is done, and without a callback not acknowledged: an `error` says so), `answered` {request_id,
    kind ("resolve" | "reject"), content, replay} (the server accepted an answer of the `on_request` handler).

    Messages are handed over in the order they came, one at a time; one that comes while nobody takes
    messages (no `message` callback, no `messages()` loop) waits for the first. In ACK mode a message
    is acknowledged once every `message` callback has returned (a coroutine: finished) and every
    `messages()` loop has asked for the next one; a callback that raises leaves it unacknowledged,
    and when it comes again it is handed over again.
    """

    FRAMES: dict[str, str] = {  # frame type -> the method that handles it
        "AUTH_CLIENT_REPLY": "_on_auth_reply",
        "MESSAGE": "_on_message",
        "MESSAGE_CONFIRMATION": "_on_message",
        "MESSAGE_ACCEPTED": "_on_settled",
        "REQUEST_ACCEPTED": "_on_request_accepted",
        "SERVER_REQUEST": "_on_server_request",
        "ANSWER_ACCEPTED": "_on_answer_accepted",
        "SESSION_CLOSED": "_on_session_closed",
        "RESOLVE": "_on_outcome",
        "REJECT": "_on_outcome",
        "FETCH_MISSING_MESSAGES_COMPLETE": "_on_fetched",
        "INVALID_MESSAGE": "_on_refused",
        "GENERAL_ERROR": "_on_refused",
        "PING": "_on_ping",
        "USER_CONNECTED": "_on_presence",
        "USER_DISCONNECTED": "_on_presence",
        "ONLINE_USERS": "_on_online_users",
    }  # anything else (PONG, AUTH_REQUIRED, what a newer server adds) is ignored

    def __init__(self, url: str, *, app_id: str, user_id: str, token: TokenSource = "", acks: bool = False,
                 fallback_urls: Iterable[str] = (), fetch_count: int = 100, min_delay: float = 0.5,
                 first_max_delay: float = 2.0, max_delay: float = 60.0, stable_after: float = 10.0,
                 ping_interval: float | None = 25.0, answer_timeout: float | None = 10.0,
                 connect_timeout: float = 15.0, max_queued: int = 1000, seen_ids: int = 10_000,
                 ack_delay: float = 0.02, sends_per_second: float = 20.0, send_burst: float = 40.0,
                 debug: Callable[[str, str], None] | None = None,
                 random: Callable[[], float] = _random.random, session_id: str | None = None) -> None:
        if not url or not app_id or not user_id:
            raise ValueError("Realtime needs url, app_id and user_id")
        self.url = url
        self.app_id, self.user_id, self.token, self.acks = app_id, user_id, token, acks
        self.fallback_urls = list(fallback_urls)
        self.fetch_count, self.max_queued, self.seen_ids = fetch_count, max_queued, seen_ids
        self.min_delay, self.first_max_delay, self.max_delay = min_delay, first_max_delay, max_delay
        self.stable_after, self.connect_timeout = stable_after, connect_timeout
        self.ping_interval, self.answer_timeout = ping_interval, answer_timeout
        self.ack_delay, self.sends_per_second, self.send_burst = ack_delay, sends_per_second, send_burst
        self.debug, self.random = debug, random
        self.state: State = "idle"
        self._first_url = url
        self._listeners: dict[str, list[Handler]] = {}
        self._runner: asyncio.Task[None] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[Message | Confirmation | Outcome] = asyncio.Queue()
        self._iterators: list[_Iterator] = []
        self._ws: ClientConnection | None = None
        self._out: asyncio.Queue[str] | None = None  # the current socket's frames, written in order
        self._deadline: asyncio.Timeout | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting: list[asyncio.Future[None]] = []  # connect() callers
        self._outbox: list[_Outgoing] = []
        self._recent: list[_Outgoing] = []  # non-ACK sends already written: kept briefly to retry a rate-limited one
        self._requests: dict[str, _Waiting] = {}  # clientMessageId -> a request waiting for its outcome
        self._seen: dict[str, None] = {}  # insertion order: the oldest id is forgotten first
        self._handling: set[str] = set()  # ids handed to the app and not done with yet
        self._ack_ids: list[str] = []
        self._attempt = 0
        self._redirects = 0
        self._opened = False
        self._reopen_now = False  # the socket was dropped on purpose (reconnect(), a redirect): no wait
        self._wake: asyncio.Event | None = None
        self._listening = asyncio.Event()  # someone takes messages: a callback or a messages() loop
        self._closing = False
        self._fetch_got = 0
        self._tokens = send_burst
        self._tokens_at = time.monotonic()
        self._paused_until = 0.0
        self._session_id = session_id  # a session to resume (an earlier client's session_id), else the server's
        self._presented: str | None = None  # the sessionId the current socket's AUTH_CLIENT presented
        self._session_closing: asyncio.Future[int] | None = None  # close_session() until SESSION_CLOSED
        self._request_handler: RequestHandler | None = None
        self._answers: dict[str, _Answer] = {}  # requestId -> its answer: each server request once
        self._answering: set[asyncio.Task[None]] = set()

    # --- the app's side ------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        """The session this client belongs to (docs/protocol.md "Sessions"): issued by the server at the
        first authentication, presented again at every reconnect; None before that and after `close_session()`."""
        return self._session_id

    def on_request(self, handler: RequestHandler) -> Callable[[], None]:
        """Answer the requests the app's server makes of this user (SERVER_REQUEST, docs/protocol.md "The
        server asking a client"): `handler(content, request)` (a coroutine function, or a plain one) is
        called once per request id: a SERVER_REQUEST that comes again is not handled twice. What it returns
        is a RESOLVE with that content (a str as it is, anything else as JSON); what it raises is a REJECT
        with the exception's `content` attribute if it has one, else its message. The answer is sent again
        after every reconnect until the server accepted it, and in ACK mode the SERVER_REQUEST is
        acknowledged then. Without a handler a SERVER_REQUEST is not acknowledged (it comes again) and an
        `error` says so. Returns a function that removes the handler."""
        self._request_handler = handler

        def remove() -> None:
            if self._request_handler is handler:
                self._request_handler = None

        return remove

    def on(self, name: str, callback: Handler) -> Callable[[], None]:
        """Listen to an event (see the class docstring); returns a function that stops listening."""
        self._listeners.setdefault(name, []).append(callback)
        if name == "message":
            self._listening.set()
        return lambda: self.off(name, callback)

    def off(self, name: str, callback: Handler) -> None:
        if callback in self._listeners.get(name, []):
            self._listeners[name].remove(callback)

    def on_message(self, callback: Callable[[Message], Any]) -> Callable[[], None]:
        """Call `callback(message)` for every message (in ACK mode it is acknowledged once it returns)."""
        return self.on("message", callback)

    async def messages(self) -> AsyncIterator[Message]:
        """Every message from now on, each id once, until the client closes (then the loop ends). In
        ACK mode a message is acknowledged when the loop asks for the next one. To stop reading,
        close the client from outside the loop; a loop left early (break, return, an exception)
        leaves its message unacknowledged: it comes again after a reconnect (at least once, never lost)."""
        it = _Iterator()
        self._iterators.append(it)
        self._listening.set()
        pending: _Ticket | None = None
        try:
            while True:
                if pending is not None:
                    pending, done = None, pending
                    done.settle(True)
                item = await it.queue.get()
                if item is None:
                    return
                message, pending = item
                yield message
        finally:
            self._iterators.remove(it)
            if pending is not None:
                pending.settle(False)
            while not it.queue.empty():  # handed to this loop but never seen by it
                left = it.queue.get_nowait()
                if left is not None:
                    left[1].settle(False)

    async def connect(self) -> None:
        """Open the connection and keep it open until `close()`: returns once authenticated, raises
        `Closed` if the server refuses for good (1000, 1008)."""
        if self.state == "connected":
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._runner is None or self._runner.done():
            self._closing = False
            self._attempt = self._redirects = 0
            self._wake = asyncio.Event()
            self._runner = asyncio.create_task(self._run(), name=f"switchboard {self.user_id}")
            if self._dispatcher is None or self._dispatcher.done():
                self._dispatcher = asyncio.create_task(self._dispatch(), name=f"switchboard {self.user_id} handlers")
        await waiter

    async def close(self) -> None:
        """Close for good: acknowledgements due are sent first; unsettled sends raise `Closed`."""
        await self._shutdown("closed by the client")

    async def _shutdown(self, reason: str) -> None:
        if self._closing or self.state in ("idle", "closed"):
            self._terminal(1000, reason)
            return
        self._closing = True
        self._flush_acks()
        ws, out = self._ws, self._out
        if ws is not None and out is not None:
            out.put_nowait(reason)  # the writer closes the socket after what it was given
            try:
                await asyncio.wait_for(ws.wait_closed(), 5)
            except TimeoutError:
                pass
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        self._terminal(1000, reason)
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)

    async def close_session(self) -> int:
        """End the session (CLOSE_SESSION) and then the client, for good: the outcomes that still waited
        for it are discarded (returns how many), and those of its requests answered later are not stored.
        Acknowledgements due go out first; sent again after a reconnect until SESSION_CLOSED comes."""
        if self.state in ("idle", "closed"):
            raise Closed(1000, "the client is not connected")
        if self._session_closing is None or self._session_closing.done():
            self._session_closing = asyncio.get_running_loop().create_future()
            if self.state == "connected":
                self._close_session_frame()
        discarded = await asyncio.shield(self._session_closing)
        await self._shutdown("session closed")
        return discarded

    def reconnect(self) -> None:
        """Drop the current socket and connect again now (after a network change, say)."""
        if self._closing or self.state in ("idle", "closed"):
            return
        self._attempt = 0
        self._drop(1000, "reconnecting")

    async def send(self, to: str, content: str, *, reference: str | None = None, feature: Feature = "RELIABLE",
                   client_message_id: str | None = None, confirmation_enabled: bool | None = None) -> Accepted | Sent:
        """One user. In ACK mode a RELIABLE send returns `Accepted` (with the stored `id`) once the
        server has stored it, resending with the same client_message_id after every reconnect until
        then; it raises RealtimeError on a refusal (rate limits and "server busy" are retried after
        retryAfterMs). Otherwise it returns `Sent` once written. While disconnected it waits (at most
        `max_queued` sends)."""
        extra = {} if confirmation_enabled is None else {"confirmationEnabled": confirmation_enabled}
        return await self._enqueue("MESSAGE", {"to": to, "content": content}, reference, feature,
                                   client_message_id, extra)

    async def send_group(self, to: Iterable[str], content: str, *, reference: str | None = None,
                         feature: Feature = "RELIABLE", client_message_id: str | None = None) -> Accepted | Sent:
        """Several users (GROUP_MESSAGE); answers as `send`."""
        return await self._enqueue("GROUP_MESSAGE", {"to": list(to), "content": content}, reference, feature,
                                   client_message_id, {})

    async def request(self, endpoint: str, content: str, *, timeout_ms: int | None = None,
                      client_message_id: str | None = None) -> Outcome:
        """Ask an endpoint of the app's server (docs/protocol.md "Requests") and wait for its outcome,
        however long it takes: the REQUEST is resent with the same client_message_id after every
        reconnect until the server has stored it (stored and asked once either way), then the outcome
        comes pushed or with the fetch after a reconnect; in ACK mode it is acknowledged once handed
        over here. Returns the RESOLVE as an `Outcome` (`.content`); raises `RequestRejected` on a
        REJECT (`.content`, `.reason`, `.request_id`) and at once on a refusal (`.code`); rate limits
        and "server busy" are retried after retryAfterMs. `client_message_id` is made up when left
        out; the same one again (after a restart, say) gets the first request's outcome. Cancelled,
        the request is not resent and its outcome, when it comes, is an `outcome` event."""
        if self.state == "closed":
            raise Closed(1000, "the client is closed")
        if len(self._outbox) >= self.max_queued:
            raise RealtimeError(f"send queue full ({self.max_queued})")
        cmid = client_message_id or f"sb-{uuid.uuid4()}"
        if cmid in self._requests:
            raise RealtimeError(f"request {cmid} is waiting already")
        data: dict[str, Any] = {"endpoint": endpoint, "content": content, "clientMessageId": cmid}
        if timeout_ms is not None:
            data["timeoutMs"] = timeout_ms
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        entry = _Outgoing(frame={"type": "REQUEST", "data": data}, cmid=cmid, group=False, awaits=True,
                          future=future, settled_by="REQUEST_ACCEPTED")
        self._outbox.append(entry)
        self._requests[cmid] = _Waiting(future)
        self._pump()
        try:
            return await asyncio.shield(future)
        finally:
            if self._requests.get(cmid) is not None and self._requests[cmid].future is future:
                del self._requests[cmid]  # (cancelled, or refused: nothing waits any more)
            if entry in self._outbox:
                self._outbox.remove(entry)

    def fetch_missing(self, count: int | None = None) -> None:
        """Ask for missed messages now (it happens by itself after every authentication)."""
        if self.state != "connected":
            return
        self._flush_acks()
        self._fetch_got = 0
        self._work({"type": "FETCH_MISSING_MESSAGES_REQUEST", "data": {"count": count or self.fetch_count}})

    def disconnect_user(self, user_id: str) -> None:
        """The app's master user only: close a user's connections everywhere."""
        if self.state == "connected":
            self._work({"type": "CLOSE_CONNECTION", "data": {"userId": user_id}})

    async def __aenter__(self) -> Realtime:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the socket ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._connections()
        except Exception as error:  # a bug here must not leave the app waiting on a client that stopped
            log.exception("switchboard: the connection loop failed")
            self._emit("error", _failure("the connection loop failed", error))
            self._terminal(1011, "the client failed")

    async def _connections(self) -> None:
        """Connections, one after another, until closed for good."""
        while not self._closing:
            code, reason = await self._session()
            if self._closing:
                return
            if self._reopen_now:
                self._reopen_now = False
                continue
            if code == 1008 and reason.startswith(WRONG_USER) and self._presented:
                self._session_refused(code, reason)
                continue
            if code in NO_RECONNECT:
                self._terminal(code, reason)
                return
            if not self._opened:
                self._fall_back()
            delay = reconnect_delay(self._attempt, code, min_delay=self.min_delay,
                                    first_max_delay=self.first_max_delay, max_delay=self.max_delay,
                                    random=self.random)
            self._attempt += 1
            self._set_state("reconnecting")
            self._emit("disconnected", {"code": code, "reason": reason, "will_reconnect": True})
            self._emit("reconnecting", {"delay": delay, "attempt": self._attempt})
            assert self._wake is not None
            self._wake.clear()
            try:  # reconnect() cuts the wait short
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass
            self._reopen_now = False

    async def _session(self) -> tuple[int, str]:
        """One socket, from opening to its close: (close code, reason)."""
        self._set_state("connecting")
        self._opened = False
        self._presented = None
        try:
            token = self.token() if callable(self.token) else self.token
            if inspect.isawaitable(token):
                token = await token
        except Exception as error:
            self._emit("error", _failure("the token callback failed", error))
            return ABNORMAL, "no token"
        try:
            ws = await connect(self.url, open_timeout=self.connect_timeout, ping_interval=self.ping_interval,
                               ping_timeout=self.answer_timeout, close_timeout=5, max_size=None)
        except InvalidURI as error:  # retrying cannot help
            self._emit("error", _failure(f"cannot open {self.url}", error))
            return 1008, "cannot open the WebSocket"
        except (OSError, TimeoutError, WebSocketException) as error:
            return ABNORMAL, str(error) or type(error).__name__
        self._ws, self._out, self._opened = ws, asyncio.Queue(), True
        writer = asyncio.create_task(self._writer(ws, self._out))
        self._set_state("authenticating")
        self._write({"type": "AUTH_CLIENT", "data": self._auth_data(token)})
        code, reason = ABNORMAL, ""
        try:
            async with asyncio.timeout(self.connect_timeout) as self._deadline:
                async for text in ws:
                    self._receive(ws, text)
        except TimeoutError:
            reason = "no answer to AUTH_CLIENT"
            await ws.close(4000, reason)
        except ConnectionClosed:
            pass
        finally:
            self._detach()
            writer.cancel()
        if not reason:  # (1006 when no close frame came: the link or the server went away)
            code, reason = ws.close_code or ABNORMAL, ws.close_reason or ""
        return code, reason

    def _auth_data(self, token: Any) -> dict[str, Any]:
        data: dict[str, Any] = {"appId": self.app_id, "userId": self.user_id}
        if token:
            data["token"] = token
        if self.acks:
            data["acks"] = True
        if self._session_id:
            data["sessionId"] = self._session_id
        self._presented = self._session_id
        return data

    async def _writer(self, ws: ClientConnection, out: asyncio.Queue[str]) -> None:
        """Writes the socket's frames in the order they were given; a text that is no frame (not "{...}")
        closes it, with that text as the reason."""
        try:
            while True:
                text = await out.get()
                if not text.startswith("{"):
                    await ws.close(1000, text)
                    return
                await ws.send(text)
        except ConnectionClosed:
            pass

    def _drop(self, code: int, reason: str) -> None:
        """Close the current socket on purpose; the next one opens at once."""
        ws = self._ws
        self._reopen_now = True
        self._detach()
        if ws is not None:
            self._spawn(ws.close(code, reason))
            self._emit("disconnected", {"code": code, "reason": reason, "will_reconnect": True})
        if self._wake is not None:
            self._wake.set()

    def _detach(self) -> None:
        """Forget the current socket: what was not accepted on it is sent again on the next."""
        self._ws = self._out = self._deadline = None
        for name in ("acks", "fetch", "stable", "pump", "ack_retry"):
            self._clear(name)
        self._ack_ids = []  # unacknowledged messages come again on the next connection
        self._recent = []
        for entry in self._outbox:
            entry.state = "queued"

    def _session_refused(self, code: int, reason: str) -> None:
        """The sessionId presented is not this user's (another user's, or from another app): forget it and
        log in afresh at once (without a sessionId this cannot happen again)."""
        refused, self._session_id, self._presented = self._presented, None, None
        self._emit("error", RealtimeError(f"the session {refused} was refused ({reason}); logging in with a new one",
                                          reason=WRONG_USER, code=WRONG_USER))
        self._set_state("reconnecting")
        self._emit("disconnected", {"code": code, "reason": reason, "will_reconnect": True})

    def _fall_back(self) -> None:
        """The current URL could not be reached: the next attempt goes to the next of `url` and
        `fallback_urls`, in turn."""
        urls = [self._first_url, *self.fallback_urls]
        if len(urls) < 2:
            return
        before = self.url
        self.url = urls[(urls.index(before) + 1) % len(urls) if before in urls else 0]
        self._emit("fallback", {"from": before, "to": self.url})

    def _terminal(self, code: int, reason: str) -> None:
        """Stopped for good: whatever waits is told."""
        for name in list(self._timers):
            self._clear(name)
        quiet = self.state in ("closed", "idle")
        self._set_state("closed")
        error = Closed(code, reason)
        for entry in self._outbox:
            if not entry.future.done():
                entry.future.set_exception(error)
        self._outbox.clear()
        for waiting in self._requests.values():
            if not waiting.future.done():
                waiting.future.set_exception(error)
        self._requests.clear()
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_exception(error)
        self._waiting.clear()
        if self._session_closing is not None and not self._session_closing.done():
            self._session_closing.set_exception(error)
            self._session_closing.exception()  # (retrieved: close_session() may not be waiting any more)
        for task in list(self._answering):
            if task is not asyncio.current_task():
                task.cancel()  # a handler still at it: its server request comes again on the next connection
        for it in self._iterators:
            it.queue.put_nowait(None)
        if self._dispatcher is not None and self._dispatcher is not asyncio.current_task():
            self._dispatcher.cancel()  # nothing more is handed to the app
        if not quiet:
            self._emit("disconnected", {"code": code, "reason": reason, "will_reconnect": False})

    def _write(self, frame: dict[str, Any]) -> bool:
        if self._out is None:
            return False
        text = json.dumps(frame, separators=(",", ":"))
        self._out.put_nowait(text)
        if self.debug:
            self.debug("out", text)
        return True

    def _work(self, frame: dict[str, Any]) -> bool:
        """A work frame (it draws on the pace the outbox keeps too)."""
        self._take(force=True)
        return self._write(frame)

    def _receive(self, ws: ClientConnection, text: str | bytes) -> None:
        if self.debug:
            self.debug("in", text if isinstance(text, str) else text.decode(errors="replace"))
        if ws is not self._ws:  # a socket dropped meanwhile (by the debug callback, even): not ours any more
            return
        try:
            frame = json.loads(text)
        except ValueError:
            self._emit("error", RealtimeError("a frame that is not JSON"))
            return
        if not isinstance(frame, dict):
            return
        method = self.FRAMES.get(frame.get("type"))  # type: ignore[arg-type]
        if method is None:
            return
        data = frame.get("data")
        try:
            getattr(self, method)(frame, data if isinstance(data, dict) else {})
        except Exception as error:  # a frame this client cannot make sense of must not end the connection
            self._emit("error", _failure(f"a {frame.get('type')} frame could not be handled", error))

    # --- frames --------------------------------------------------------------------------------

    def _on_auth_reply(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        if not data.get("isAuthenticated"):
            redirect = data.get("redirect")
            if isinstance(redirect, str) and redirect:
                self._redirect(redirect)
            else:
                self._emit("error", RealtimeError("authentication refused"))  # the server closes with the reason
            return
        self._redirects = 0
        session = data.get("sessionId")
        resumed = bool(self._presented) and session == self._presented
        if isinstance(session, str) and session:
            self._session_id = session
        if self._deadline is not None:
            self._deadline.reschedule(None)
        self._set_state("connected")
        self._timer("stable", self.stable_after, self._stable)
        self._emit("connected", {"app_id": self.app_id, "user_id": self.user_id, "session_id": self._session_id,
                                 "resumed": resumed})
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)
        self._waiting.clear()
        self.fetch_missing()
        self._pump()
        if self._session_closing is not None and not self._session_closing.done():
            self._close_session_frame()

    def _close_session_frame(self) -> None:
        self._flush_acks()  # (what was handled counts before the session ends)
        self._work({"type": "CLOSE_SESSION", "data": {}})

    def _on_session_closed(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        """SESSION_CLOSED: the session is over; close_session() ends the client (the server closes with 1000)."""
        self._session_id = None
        discarded = data.get("discarded")
        if self._session_closing is not None and not self._session_closing.done():
            self._session_closing.set_result(discarded if isinstance(discarded, int) else 0)

    def _stable(self) -> None:
        self._attempt = 0

    def _redirect(self, url: str) -> None:
        """The user lives in another domain: go there now, with the same credentials, and stay."""
        self._redirects += 1
        if self._redirects > MAX_REDIRECTS:
            self._emit("error", RealtimeError(f"too many redirects ({MAX_REDIRECTS} in a row, the last to {url})",
                                              reason="too many redirects"))
            ws = self._ws
            self._closing = True
            self._detach()
            if ws is not None:
                self._spawn(ws.close(1000, "redirected"))
            self._terminal(1008, "too many redirects")
            return
        self._emit("redirect", {"from": self.url, "to": url, "count": self._redirects})
        self.url = url
        ws = self._ws
        self._reopen_now = True
        self._detach()
        if ws is not None:
            self._spawn(ws.close(1000, "redirected"))

    def _on_ping(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        self._write({"type": "PONG", "data": {}})

    def _on_presence(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        name = "user_connected" if frame["type"] == "USER_CONNECTED" else "user_disconnected"
        self._emit(name, {"user_id": data.get("userId")})

    def _on_online_users(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        self._emit("online_users", {key: data.get(key) for key in ("users", "page", "pages", "count")})

    # --- receiving -----------------------------------------------------------------------------

    def _first_time(self, message_id: str) -> bool:
        """A stored message's id, counted for the fetch: False when it was handed over before (then
        only the server needs to hear of it again)."""
        self._fetch_got += 1
        if message_id in self._seen:
            if self.acks and message_id not in self._handling:  # (a handler still at it ACKs when done)
                self._ack(message_id)
            return False
        self._seen[message_id] = None
        if len(self._seen) > self.seen_ids:
            del self._seen[next(iter(self._seen))]
        return True

    def _on_message(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        raw_id = data.get("id")
        message_id = None if raw_id is None else str(raw_id)
        if message_id is not None:
            if not self._first_time(message_id):
                return
            self._handling.add(message_id)
        if frame["type"] == "MESSAGE":
            self._inbox.put_nowait(Message(sender=data.get("from", ""), content=data.get("content", ""),
                                           id=message_id, seq=data.get("seq"), reference=frame.get("reference")))
        else:
            self._inbox.put_nowait(Confirmation(reference=data.get("reference"), id=message_id, seq=data.get("seq")))

    async def _dispatch(self) -> None:
        """Hands messages to the app in the order they came, one at a time."""
        while True:
            item = await self._inbox.get()
            while isinstance(item, Message) and not self._listeners.get("message") and not self._iterators:
                self._listening.clear()  # nobody takes messages yet: this one waits for the first taker
                await self._listening.wait()
            event = "message" if isinstance(item, Message) else "outcome" if isinstance(item, Outcome) else "confirmation"
            failed: BaseException | None = None
            for callback in list(self._listeners.get(event, [])):
                try:
                    result = callback(item)
                    if inspect.isawaitable(result):
                        await result
                except Exception as error:
                    failed = failed or error
            loops = list(self._iterators) if isinstance(item, Message) else []
            if loops:
                ticket = _Ticket(self._handled, item.id, failed, len(loops))
                for it in loops:
                    it.queue.put_nowait((item, ticket))  # type: ignore[arg-type]
            else:
                self._handled(item.id, failed)

    def _handled(self, message_id: str | None, failed: BaseException | None) -> None:
        if message_id is None:
            return
        self._handling.discard(message_id)
        if failed is not None:
            self._seen.pop(message_id, None)  # not handled: when it comes again, it is handed over again
            self._emit("error", _failure("a message handler failed; the message is not acknowledged", failed))
        elif self.acks:
            self._ack(message_id)

    def _ack(self, message_id: str) -> None:
        self._ack_ids.append(message_id)
        if len(self._ack_ids) >= ACK_MAX:
            self._flush_acks()
        elif "acks" not in self._timers:
            self._timer("acks", self.ack_delay, self._flush_acks)

    def _flush_acks(self) -> None:
        self._clear("acks")
        while self._ack_ids and self.state == "connected":
            ids, self._ack_ids = self._ack_ids[:ACK_MAX], self._ack_ids[ACK_MAX:]
            self._write({"type": "ACK", "data": {"ids": ids}})

    # --- requests ------------------------------------------------------------------------------

    def _on_request_accepted(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        """The request is stored: from now on only its outcome is awaited."""
        cmid = data.get("clientMessageId")
        entry = next((e for e in self._outbox if e.settled_by == "REQUEST_ACCEPTED" and e.cmid == cmid), None)
        if entry is not None:
            self._outbox.remove(entry)
        waiting = self._requests.get(cmid) if isinstance(cmid, str) else None
        if waiting is not None:
            waiting.request_id, waiting.duplicate = str(data.get("id")), data.get("duplicate") is True

    def _on_outcome(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        """RESOLVE or REJECT: settles the request waiting for it (by its clientMessageId), or is an
        `outcome` event; either way each outcome id once."""
        message_id = str(data.get("id"))
        if not self._first_time(message_id):
            return
        cmid = data.get("clientMessageId")
        kind: Literal["resolve", "reject"] = "resolve" if frame["type"] == "RESOLVE" else "reject"
        outcome = Outcome(content=str(data.get("content", "")), request_id=str(data.get("requestId")), id=message_id,
                          client_message_id=cmid, kind=kind, reason=data.get("reason"))
        waiting = self._requests.pop(cmid, None) if isinstance(cmid, str) else None
        if waiting is None or waiting.future.done():
            if not self._listeners.get("outcome"):
                del self._seen[message_id]  # not handled: when it comes again, it is handed over again
                fate = ": it is not acknowledged, and comes again" if self.acks else ""
                self._emit("error", RealtimeError(f"the outcome of request {outcome.request_id} came, and nobody "
                                                  f"listens to 'outcome' events{fate}", reason="unhandled outcome",
                                                  data=data))
                return
            self._handling.add(message_id)
            self._inbox.put_nowait(outcome)
            return
        entry = next((e for e in self._outbox if e.settled_by == "REQUEST_ACCEPTED" and e.cmid == cmid), None)
        if entry is not None:  # (fetched before its resend was accepted: not sent again)
            self._outbox.remove(entry)
        if kind == "resolve":
            waiting.future.set_result(replace(outcome, duplicate=waiting.duplicate))
        else:
            why = f" ({outcome.reason})" if outcome.reason else ""
            waiting.future.set_exception(RequestRejected(
                f"request {outcome.request_id} rejected{why}{': ' + outcome.content if outcome.content else ''}",
                reason=outcome.reason, content=outcome.content, request_id=outcome.request_id,
                outcome_id=message_id, client_message_id=cmid))
        if self.acks:
            self._ack(message_id)

    # --- the server asking the client ----------------------------------------------------------

    def _on_server_request(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        """SERVER_REQUEST: handed to the `on_request` handler, each request id once."""
        self._fetch_got += 1
        message_id, request_id = str(data.get("id")), str(data.get("requestId"))
        known = self._answers.get(request_id)
        if known is not None:  # it came again: its answer is on its way, or was accepted (then only the server needs to hear)
            if known.state == "done" and self.acks:
                self._ack(message_id)
            return
        handler = self._request_handler
        if handler is None:
            fate = ": it is not acknowledged, and comes again" if self.acks else ""
            self._emit("error", RealtimeError(f"server request {request_id} came, and no on_request handler is "
                                              f"registered{fate}", reason="unhandled server request", data=data))
            return
        answer = self._answers[request_id] = _Answer(message_id)
        if len(self._answers) > self.seen_ids:  # the oldest answered ones are forgotten first
            for old in [k for k, a in self._answers.items() if a.state == "done"][:len(self._answers) - self.seen_ids]:
                del self._answers[old]
        request = ServerRequest(request_id=request_id, content=str(data.get("content", "")), id=message_id,
                                seq=data.get("seq"))
        task = asyncio.get_running_loop().create_task(self._answer(handler, request, answer))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, handler: RequestHandler, request: ServerRequest, answer: _Answer) -> None:
        """Run the handler; its answer goes out, and again after every reconnect until accepted."""
        try:
            try:
                value = handler(request.content, request)
                if inspect.isawaitable(value):
                    value = await value
                frame_type, content = "RESOLVE", _answer_text(value)
            except Exception as error:  # (including a value that is no JSON)
                frame_type, content = "REJECT", _rejection_text(error)
            if self.state == "closed" or self._answers.get(request.request_id) is not answer:
                self._forget(request.request_id, answer)
                return
            entry = _Outgoing(frame={"type": frame_type, "data": {"requestId": request.request_id, "content": content}},
                              cmid=request.request_id, group=False, awaits=True, settled_by="ANSWER_ACCEPTED",
                              future=asyncio.get_running_loop().create_future())
            answer.state = "answering"
            self._outbox.append(entry)
            self._pump()
            await entry.future  # (settled by ANSWER_ACCEPTED: _on_answer_accepted acknowledges)
        except Closed:
            self._forget(request.request_id, answer)
        except asyncio.CancelledError:
            self._forget(request.request_id, answer)
            raise
        except RealtimeError as error:  # refused for good (request_closed, not_found): nothing more can come of it
            answer.state = "done"
            if self.acks:
                self._ack(answer.message_id)
            self._emit("error", RealtimeError(
                f"the answer to server request {request.request_id} was refused"
                f"{f' ({error.code})' if error.code else ''}: {error.reason}", reason=error.reason, code=error.code,
                data=error.data, frame_type=error.frame_type))

    def _forget(self, request_id: str, answer: _Answer) -> None:
        """The client stopped before the answer was accepted: the SERVER_REQUEST is not acknowledged, and
        when it comes again (on the next connection) it is handed to the handler again."""
        if self._answers.get(request_id) is answer and answer.state != "done":
            del self._answers[request_id]
        self._outbox[:] = [e for e in self._outbox if not (e.settled_by == "ANSWER_ACCEPTED" and e.cmid == request_id)]

    def _on_answer_accepted(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        request_id = str(data.get("requestId"))
        entry = next((e for e in self._outbox if e.settled_by == "ANSWER_ACCEPTED" and e.cmid == request_id), None)
        if entry is None:
            return
        self._outbox.remove(entry)
        if not entry.future.done():
            entry.future.set_result(None)
        answer = self._answers.get(request_id)
        if answer is None or answer.state == "done":
            return
        answer.state = "done"
        if self.acks:
            self._ack(answer.message_id)
        self._emit("answered", {"request_id": request_id, "kind": "resolve" if entry.frame["type"] == "RESOLVE" else
                                "reject", "content": entry.frame["data"]["content"], "replay": data.get("replay") is True})

    def _on_fetched(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        left = data.get("leftMissingCount")
        if not (isinstance(left, int) and left > 0):
            self._emit("synced", {})
        elif not self._fetch_got:  # nothing came (an ACK window full of messages still being handled)
            self._timer("fetch", 1.0, self.fetch_missing)
        else:
            self.fetch_missing()

    # --- sending -------------------------------------------------------------------------------

    async def _enqueue(self, frame_type: str, data: dict[str, Any], reference: str | None, feature: Feature,
                       client_message_id: str | None, extra: dict[str, Any]) -> Accepted | Sent:
        if self.state == "closed":
            raise Closed(1000, "the client is closed")
        if len(self._outbox) >= self.max_queued:
            raise RealtimeError(f"send queue full ({self.max_queued})")
        data["clientMessageId"] = client_message_id or f"sb-{uuid.uuid4()}"
        frame: dict[str, Any] = {"type": frame_type, "data": data, **extra}
        if reference:
            frame["reference"] = reference
        if feature == "FAST":
            frame["feature"] = "FAST"
        entry = _Outgoing(frame=frame, cmid=data["clientMessageId"], group=frame_type == "GROUP_MESSAGE",
                          awaits=self.acks and feature != "FAST",
                          future=asyncio.get_running_loop().create_future())
        self._outbox.append(entry)
        self._pump()
        try:
            return await asyncio.shield(entry.future)
        except asyncio.CancelledError:
            if entry in self._outbox:  # the caller gave up on it: not resent any more
                self._outbox.remove(entry)
            raise

    def _take(self, force: bool = False) -> float:
        """Draw one token of the work pace; the seconds until one is there (0: taken)."""
        now = time.monotonic()
        self._tokens = min(self.send_burst, self._tokens + (now - self._tokens_at) * self.sends_per_second)
        self._tokens_at = now
        if self._tokens < 1 and not force:
            return (1 - self._tokens) / self.sends_per_second
        self._tokens -= 1
        return 0.0

    def _pump(self) -> None:
        """Write queued sends, in order, at the client's pace and after any pause the server asked for."""
        if self.state != "connected" or "pump" in self._timers:
            return
        for entry in [e for e in self._outbox if e.state == "queued"]:
            wait = max(self._paused_until - time.monotonic(), 0.0) or self._take()
            if wait > 0:
                self._timer("pump", wait, self._pump)
                return
            if not self._write(entry.frame):
                return
            if entry.awaits:
                entry.state = "sent"
                continue
            self._outbox.remove(entry)
            self._recent = [*self._recent[-255:], entry]
            if not entry.future.done():
                entry.future.set_result(Sent(client_message_id=entry.cmid))

    def _on_settled(self, frame: dict[str, Any], data: dict[str, Any]) -> None:
        cmid = data.get("clientMessageId")
        entry = next((e for e in self._outbox if e.state == "sent" and e.settled_by == frame["type"]
                      and (e.cmid == cmid if cmid else e.group)), None)
        accepted = Accepted(id=str(data.get("id")), client_message_id=cmid, recipients=data.get("recipients"),
                            duplicate=data.get("duplicate") is True)
        if entry is not None:
            self._outbox.remove(entry)
            if not entry.future.done():
                entry.future.set_result(accepted)
        self._emit("accepted", accepted)

    def _on_refused(self, frame: dict[str, Any], payload: dict[str, Any]) -> None:
        general = frame["type"] == "GENERAL_ERROR"
        echo = frame.get("data") if general else payload.get("data")
        reason = "the server failed while handling the frame; it may be sent again" if general else str(
            payload.get("reason", ""))
        retry_after = None if general else payload.get("retryAfterMs")
        error = RealtimeError(reason, reason=reason, data=echo, limit=payload.get("limit"), frame_type=frame["type"],
                              retry_after_ms=retry_after, code=None if general else payload.get("code"))
        if isinstance(echo, dict) and "endpoint" in echo or echo is None and not general and next(
                (e.settled_by == "REQUEST_ACCEPTED" for e in self._outbox if e.state == "sent"), False):
            error = RequestRejected(reason, reason=reason, data=echo, limit=payload.get("limit"),
                                    frame_type=frame["type"], retry_after_ms=retry_after, code=payload.get("code"))
        if isinstance(echo, dict) and ("to" in echo or "endpoint" in echo or "requestId" in echo):  # a send, a request, an answer
            self._send_refused(self._send_of(echo), error, retry_after, general)
        elif isinstance(echo, dict) and "count" in echo:
            if retry_after is not None or general:
                self._timer("fetch", (retry_after or 2000) / 1000, self.fetch_missing)
            else:
                self._emit("error", error)
        elif isinstance(echo, dict) and isinstance(echo.get("ids"), list) and retry_after is not None:
            ids = [str(i) for i in echo["ids"]]
            self._timer("ack_retry", retry_after / 1000, lambda: [self._ack(i) for i in ids])
        elif echo is None and not general:  # refused without an echo (content too large): the oldest waiting send
            entry = next((e for e in self._outbox if e.state == "sent"), None)
            if entry is not None:
                self._send_refused(entry, error, retry_after, False)
            else:
                self._emit("error", error)
        else:
            self._emit("error", error)

    def _send_of(self, echo: dict[str, Any]) -> _Outgoing | None:
        if "to" not in echo and "endpoint" not in echo:  # an answer to a server request
            return next((e for e in self._outbox if e.settled_by == "ANSWER_ACCEPTED" and e.state == "sent"
                         and e.cmid == str(echo.get("requestId"))), None)
        candidates = [*(e for e in self._outbox if e.state == "sent"), *self._recent]
        if isinstance(echo.get("clientMessageId"), str):
            request = "endpoint" in echo
            return next((e for e in candidates if e.cmid == echo["clientMessageId"]
                         and (e.settled_by == "REQUEST_ACCEPTED") == request), None)
        return next((e for e in candidates if e.group and e.frame["data"] == echo), None) or next(
            (e for e in candidates if e.group and e.awaits), None)

    def _send_refused(self, entry: _Outgoing | None, error: RealtimeError, retry_after: int | None,
                      general: bool) -> None:
        if entry is None:
            self._emit("error", error)
            return
        if retry_after is not None or (general and entry.tries < GENERAL_ERROR_TRIES):
            entry.tries += 1
            entry.state = "queued"
            if entry not in self._outbox:  # a non-ACK send already settled: back to the front
                self._recent.remove(entry)
                self._outbox.insert(0, entry)
            pause = retry_after / 1000 if retry_after is not None else Backoff(1.0, 16.0, jitter=0).seconds(entry.tries)
            self._paused_until = time.monotonic() + pause
            self._clear("pump")
            self._pump()
            return
        if entry in self._outbox:
            self._outbox.remove(entry)
        if entry.future.done():  # a non-ACK send, settled when written: the refusal is an event
            self._emit("error", error)
        else:
            entry.future.set_exception(error)

    # --- plumbing ------------------------------------------------------------------------------

    def _set_state(self, state: State) -> None:
        if self.state != state:
            self.state = state
            self._emit("state", state)

    def _emit(self, name: str, payload: Any) -> None:
        callbacks = list(self._listeners.get(name, []))
        if name == "error" and not callbacks:
            log.warning("switchboard: %s", payload)
        for callback in callbacks:
            try:
                result = callback(payload)
                if inspect.isawaitable(result):
                    self._spawn(result)
            except Exception as error:
                if name != "error":
                    self._emit("error", _failure(f"a {name!r} handler failed", error))

    def _spawn(self, awaitable: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _timer(self, name: str, seconds: float, fn: Callable[[], Any]) -> None:
        """One timer per name: setting it again replaces it."""
        self._clear(name)

        def fire() -> None:
            self._timers.pop(name, None)
            fn()

        self._timers[name] = asyncio.get_running_loop().call_later(max(0.0, seconds), fire)

    def _clear(self, name: str) -> None:
        handle = self._timers.pop(name, None)
        if handle is not None:
            handle.cancel()


def _answer_text(value: Any) -> str:
    """An answer's content: a str as it is, anything else as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _rejection_text(error: BaseException) -> str:
    """A rejection's content: the exception's `content` attribute when it has one, else its message."""
    content = getattr(error, "content", None)
    if content is not None:
        try:
            return _answer_text(content)
        except (TypeError, ValueError):
            return str(content)
    return str(error) or type(error).__name__


def _failure(message: str, cause: BaseException) -> RealtimeError:
    error = RealtimeError(f"{message}: {cause}", reason=message)
    error.__cause__ = cause
    return error
