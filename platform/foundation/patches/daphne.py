"""daphne, autobahn and Twisted's internals, reached into on the versions they were tested with
(foundation.patches.versions), to make daphne a safe WebSocket server for Switchboard. `install()`
patches them; config.asgi calls it.

1. **Close codes.** Autobahn's `sendClose` admits only 1000 and 3000-4999 from an application, but
   1008 (policy), 1009 (too big), 1011 (internal error), 1012 (service restart) and 1013 (try again
   later) are registered codes a server may send (RFC 6455 7.4.1; IANA). Daphne's `serverClose`
   goes through `sendClose`, so without this a `close(code=1008)` raises inside daphne and the
   client sees 1011 instead. The close frame also carries the application's reason text, which
   daphne drops.
2. **Frames over the size limit get 1009.** Autobahn fails such a connection by dropping the TCP
   connection (`failByDrop`), which a client sees as 1006; with it off, autobahn sends 1009 and
   never reads the oversized frame into memory. The limit is WS_PREAUTH_MAX_FRAME_BYTES until the
   application lifts it (`FrameLimit`, once its client has authenticated), WS_MAX_FRAME_BYTES after.
3. **A bounded incoming queue.** Daphne hands every received frame to the application through an
   unbounded queue; a client sending faster than its frames are handled grew the node without
   limit. Past WS_MAX_QUEUED_FRAMES unhandled frames, or WS_MAX_QUEUED_BYTES of them (counted as
   received, before decoding), the connection is closed with 4003. The queue is a SlimQueue
   (foundation.slim_queue): asyncio.Queue's 2.5 KB were a good part of what a held connection costs.
4. **A bounded outgoing buffer.** `send` on an ASGI socket never blocks: what a client does not read
   piles up in Twisted's write buffer. Past WS_MAX_OUTGOING_BYTES the connection is closed with
   4002 and further frames are dropped. The buffer is also offered to the application as the scope
   extension `switchboard.outgoing` (an `OutgoingBuffer`): the consumer learns when the bytes of a
   frame have left the node, and only then counts a message delivered, so a slow reader that is
   cut off keeps its undelivered messages in its mailbox. Its `closed` turns true once the socket is
   gone or cut off: a reader replaying history stops there instead of querying for nobody.
5. **Proxy headers from trusted proxies only.** With `--proxy-headers` daphne believes any client's
   `X-Forwarded-For` (its leftmost value, which the client writes) and `X-Forwarded-Proto`. Both are
   read by foundation.forwarded instead: only from a peer in TRUSTED_PROXIES, and the client is the
   rightmost hop that is not a trusted proxy.
6. **Request bodies capped before they are buffered** (foundation.body_cap): 413 and the connection
   closed past a path's cap, instead of Twisted's temporary file of no limit.
7. **No form parsing in Twisted.** Twisted parses a POST's Content-Type (with the email package,
   costly) and a form body into `request.args`, which daphne never reads (the application gets the
   body as it came): `_parsePOSTFormSubmission` off.
8. **Autobahn's debug lines built only when logged** (foundation.autobahn_debug): its eagerly built
   debug-line arguments were an eighth of a web node's CPU in a reconnect storm.
9. **The closing handshake ends after the application has read what came before it.** Autobahn
   drops the TCP connection as soon as the client's close frame arrives, and the client may then
   reconnect elsewhere before the ACKs it sent just before are handled and committed (a rolling
   restart handed hundreds of messages again after their ACKs on a slowed machine). With a
   `CloseHold` (the scope extension `switchboard.close_hold`) that the application wants, the drop
   waits until the application has handled those frames and says so, CLOSE_HANDSHAKE_TIMEOUT at most.

Three more modules build on these libraries' internals, and run only once the check below has
passed: foundation.daphne_adapter (what the patches above offer the application: `OutgoingBuffer`
reads Twisted's private write buffer), foundation.body_cap (its replacement methods read Twisted's
`HTTPChannel._path` and `_command` and `Request._disconnected`) and foundation.drain_server (its
daphne Server, started by config.web after the check, overrides `listen_success` and reads
`connections`).

**Only on the versions it was tested with.** All of this replaces daphne's and autobahn's methods
and reads Twisted's private write buffer (`dataBuffer`, `offset`, `_tempDataLen`, `doWrite`). Another
version may rename or move any of them without an error: the slow-reader cut-off silently stops
working, and a message counts as delivered when it is written rather than when it has left the node.
So `install()` first compares the installed daphne, Twisted and autobahn with TESTED_VERSIONS (what
requirements.lock pins) and refuses to start on any other version, naming each package, the version
found and the one expected. An operator who has checked the patches against other versions sets
DAPHNE_ALLOW_UNTESTED_VERSIONS: the node then starts, with a warning naming them. `config.web` runs
the same check before it starts daphne, so a web node stops with that message and no traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os

from autobahn.exception import Disconnected
from django.conf import settings

from foundation import body_cap
from foundation.autobahn_debug import deferring
from foundation.daphne_adapter import (
    CLOSE_HOLD_EXTENSION,
    FRAME_LIMIT_EXTENSION,
    OUTGOING_EXTENSION,
    CloseHold,
    FrameLimit,
    IncomingQueue,
    OutgoingBuffer,
)
from foundation.forwarded import client_from_headers, trusted_networks
from foundation.metrics import CONNECTIONS_CLOSED
from foundation.patches.versions import require_tested
from foundation.transport.frames import CLOSE_FRAME_FLOOD, CLOSE_SLOW_READER

log = logging.getLogger(__name__)

SERVER_CODES = {1000, 1001, 1008, 1009, 1011, 1012, 1013}
# HTTP responses whose application wants to know when their bytes have left the node: streams that
# last for minutes (SSE), and Socket.IO's polls, which carry stored messages (messaging.gateway.socketio).
STREAM_PATHS = ("/sse/", "/socket.io/")
# A client that does not answer our close frame within this many seconds is dropped; so is one whose
# close frame the application has not finished reading after as long (9.).
CLOSE_HANDSHAKE_TIMEOUT = 5


# The distributions this module was written and tested against: the versions requirements.lock pins
# (tests/foundation/patches/test_daphne.py holds the two together). After an upgrade, check every
# patch above against the new versions, then change these.
TESTED_VERSIONS = {"daphne": "4.2.3", "Twisted": "26.10.0", "autobahn": "26.10.2"}
ALLOW_UNTESTED_SETTING = "DAPHNE_ALLOW_UNTESTED_VERSIONS"


# Once per process, so an allowed mismatch warns once (a refusal raises again): config.web checks before
# it starts daphne, install() again when config.asgi is imported.
@functools.cache
def check_versions() -> None:
    """Refuse (UntestedVersions) to patch versions other than TESTED_VERSIONS, unless the operator
    allows it with DAPHNE_ALLOW_UNTESTED_VERSIONS; then only warn."""
    require_tested(TESTED_VERSIONS, patcher=__name__, allow_setting=ALLOW_UNTESTED_SETTING,
                   risk="on other versions the slow-reader cut-off can silently stop working")


def _setting(name: str, default: int) -> int:
    return int(getattr(settings, name, default))


# 3. a SlimQueue as a WebSocket's input queue
def _create_with_slim_queue(server, protocol, scope):
    """daphne's Server.create_application (4.2.3), with a SlimQueue as the socket's input queue: a
    WebSocket's queue has one reader, and asyncio.Queue's 2.5 KB were a good part of what a held
    connection costs (foundation.slim_queue). It counts the bytes waiting in it (3.)."""
    assert "application_instance" not in server.connections[protocol]
    input_queue = IncomingQueue()
    scope.setdefault("asgi", {"version": "3.0"})
    application_instance = server.application(scope=scope, receive=input_queue.get,
                                              send=functools.partial(server.handle_reply, protocol))
    if protocol not in server.connections:
        return None
    server.connections[protocol]["application_instance"] = asyncio.ensure_future(application_instance)
    return input_queue


def _upgrade_let_go(process):
    """WebRequest.process, and after a WebSocket upgrade (daphne hands the socket to the WebSocket
    protocol and sets the request's transport to None) the HTTP channel lets go of its request once
    the call that upgraded returns: the two refer to each other, and the pair (some twenty objects
    per connection) would otherwise wait for the collector (issue 47)."""

    @functools.wraps(process)
    def process_then_let_go(self):
        result = process(self)
        channel = getattr(self, "channel", None)
        if self.transport is None and channel is not None and self.requestHeaders.hasHeader(b"upgrade"):
            channel.callLater(0, channel.requests.clear)  # (the channel's own timer: TimeoutMixin's)
        return result

    return process_then_let_go


# 8. autobahn's debug-line arguments built only when logged
def _autobahn_debug_deferred() -> None:
    """Swap the formatting helpers autobahn's WebSocket modules call for deferring ones (once)."""
    # Here, not at the top: autobahn's Twisted module is imported only where daphne is patched.
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol  # likewise

    for module in (protocol, twisted_websocket):
        for name in ("pformat", "hltype", "hlval"):
            fn = getattr(module, name, None)
            if fn is not None and not hasattr(fn, "__wrapped__"):
                setattr(module, name, deferring(fn))
    # The one use that is not a log argument: Timings.__str__ returns pformat's text.
    protocol.Timings.__str__ = lambda self: str(protocol.pformat(self._timings))


def install() -> None:
    check_versions()
    # Here, not at the top: only patching needs daphne (whose server module installs Twisted's reactor
    # on import); config.web imports this module for its check alone.
    from daphne import http_protocol, server, ws_protocol
    from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol  # likewise

    if getattr(WebSocketProtocol, "_switchboard_patched", False):
        return
    _autobahn_debug_deferred()  # 8.
    max_frames = _setting("WS_MAX_QUEUED_FRAMES", 500)
    max_queued_bytes = _setting("WS_MAX_QUEUED_BYTES", 4 * 1024 * 1024)
    max_outgoing = _setting("WS_MAX_OUTGOING_BYTES", 8 * 1024 * 1024)
    max_preauth_frame = _setting("WS_PREAUTH_MAX_FRAME_BYTES", 4096)

    # 1. close codes, with the application's reason text (ASGI `websocket.close` "reason")
    def server_close(self, code=None, reason=None):
        code = 1000 if code is None else code
        if code in SERVER_CODES or 3000 <= code <= 4999:
            reason_bytes = reason.encode("utf-8", errors="replace")[:123] if reason else None
            self.sendCloseFrame(code=code, reasonUtf8=reason_bytes, isReply=False)
        else:
            self.sendClose(code=1011)

    WebSocketProtocol.serverClose = server_close

    original_handle_reply = WebSocketProtocol.handle_reply

    def handle_reply(self, message):
        if message.get("type") == "websocket.close" and message.get("reason") and self.state != self.STATE_CONNECTING:
            self.serverClose(code=message.get("code"), reason=message["reason"])
            return None
        return original_handle_reply(self, message)

    WebSocketProtocol.handle_reply = handle_reply

    # 2. 1009 instead of a dropped connection; a bounded close handshake
    original_factory_init = WebSocketFactory.__init__

    def factory_init(self, *args, **kwargs):
        original_factory_init(self, *args, **kwargs)
        self.setProtocolOptions(failByDrop=False, closeHandshakeTimeout=CLOSE_HANDSHAKE_TIMEOUT)

    WebSocketFactory.__init__ = factory_init

    # 3. a bounded incoming queue
    original_on_message = WebSocketProtocol.onMessage

    def on_message(self, payload, is_binary):
        queue = getattr(self, "application_queue", None)
        incoming = getattr(self, "_switchboard_incoming", None)
        if not self.muted and queue is not None:
            if queue.qsize() >= max_frames:
                flood = f"more than {max_frames} frames waiting to be handled"
            elif incoming is not None and incoming.bytes + len(payload) > max_queued_bytes:
                flood = f"more than {max_queued_bytes} bytes waiting to be handled"
            else:
                flood = None
            if flood:
                log.warning("closing %s: %s", self.client_addr, flood)
                self.muted = True
                CONNECTIONS_CLOSED.labels("frame_flood").inc()
                self.serverClose(code=CLOSE_FRAME_FLOOD, reason=flood)
                # the application still hears the disconnect (onClose), so its cleanup runs
                return None
        if incoming is not None and not self.muted:
            incoming.arriving = len(payload)
        return original_on_message(self, payload, is_binary)

    WebSocketProtocol.onMessage = on_message

    original_on_close = WebSocketProtocol.onClose

    def on_close(self, was_clean, code, reason):
        # A muted protocol would skip telling the application it is gone: it always must be told.
        self.muted = False
        outgoing = getattr(self, "_switchboard_outgoing", None)
        if outgoing is not None:
            outgoing.closed = True
        return original_on_close(self, was_clean, code, reason)

    WebSocketProtocol.onClose = on_close

    original_connection_lost = WebSocketProtocol.connectionLost

    def connection_lost(self, reason):
        try:
            return original_connection_lost(self, reason)
        finally:
            outgoing = getattr(self, "_switchboard_outgoing", None)
            if outgoing is not None:
                outgoing.detach()  # (its wrappers on the transport held it in a cycle)
            hold = getattr(self, "_switchboard_close_hold", None)
            if hold is not None:
                hold.forget()
            closed = getattr(self, "is_closed", None)
            if getattr(closed, "called", False) and closed.result is self:
                closed.result = None  # autobahn resolves it with the protocol: a cycle; nobody here waits on it

    WebSocketProtocol.connectionLost = connection_lost

    # 4. a bounded outgoing buffer, offered to the application
    original_create = server.Server.create_application

    def create_application(self, protocol, scope):
        if isinstance(protocol, WebSocketProtocol) and getattr(protocol, "transport", None) is not None:
            buffer = OutgoingBuffer(protocol.transport)
            protocol._switchboard_outgoing = buffer
            scope.setdefault("extensions", {})[OUTGOING_EXTENSION] = buffer
            scope["extensions"][FRAME_LIMIT_EXTENSION] = FrameLimit(protocol, max_preauth_frame)
            protocol._switchboard_close_hold = scope["extensions"][CLOSE_HOLD_EXTENSION] = CloseHold(
                CLOSE_HANDSHAKE_TIMEOUT)
        elif scope.get("type") == "http" and str(scope.get("path", "")).startswith(STREAM_PATHS):
            # A long-lived HTTP stream (SSE), or a Socket.IO poll, gets the same view of its
            # socket's buffer; a kept-alive connection's transport is wrapped once.
            transport = getattr(getattr(protocol, "channel", None), "transport", None)
            if transport is not None:
                buffer = getattr(transport, "_switchboard_outgoing", None) or OutgoingBuffer(transport)
                transport._switchboard_outgoing = buffer
                scope.setdefault("extensions", {})[OUTGOING_EXTENSION] = buffer
        if isinstance(protocol, WebSocketProtocol):
            queue = _create_with_slim_queue(self, protocol, scope)
        else:
            queue = original_create(self, protocol, scope)
        if isinstance(protocol, WebSocketProtocol) and queue is not None:
            protocol._switchboard_incoming = queue
        return queue

    server.Server.create_application = create_application

    original_send = WebSocketProtocol.serverSend

    def server_send(self, content, binary=False):
        if getattr(self, "_switchboard_slow", False):
            return None  # cut off: nothing more is queued for a reader that does not read
        try:
            original_send(self, content, binary)
        except Disconnected:
            # The client went away while the frame was being made (autobahn refuses a send on a
            # closed protocol): nothing is queued, as for any closed socket; the consumer's
            # disconnect follows. Raised, it would crash the consumer, which a drain then waits on.
            return None
        buffer = getattr(self, "_switchboard_outgoing", None)
        if buffer is not None and buffer.pending() > max_outgoing:
            log.warning("closing %s: %d bytes queued for a reader that does not keep up", self.client_addr,
                        buffer.pending())
            self._switchboard_slow = True
            buffer.closed = True
            CONNECTIONS_CLOSED.labels("slow_reader").inc()
            self.serverClose(code=CLOSE_SLOW_READER)
        return None

    WebSocketProtocol.serverSend = server_send

    # 9. the closing handshake's drop held until the application has read what came before it
    original_on_close_frame = WebSocketProtocol.onCloseFrame
    original_drop = WebSocketProtocol.dropConnection

    def on_close_frame(self, code, reason_raw):
        self._switchboard_in_close_frame = True
        try:
            return original_on_close_frame(self, code, reason_raw)
        finally:
            self._switchboard_in_close_frame = False

    def drop_connection(self, abort=False):
        hold = getattr(self, "_switchboard_close_hold", None)
        if (hold is not None and getattr(self, "_switchboard_in_close_frame", False) and not self.muted
                and hold.hold(getattr(self, "application_queue", None), lambda: original_drop(self, abort))):
            return None
        return original_drop(self, abort)

    WebSocketProtocol.onCloseFrame = on_close_frame
    WebSocketProtocol.dropConnection = drop_connection

    # 5. proxy headers only from trusted proxies, the client being the rightmost untrusted hop
    networks = trusted_networks()

    def parse_x_forwarded_for(headers, address_header_name=None, port_header_name=None, proto_header_name=None,
                              original_addr=None, original_scheme=None):
        return client_from_headers(headers, original_addr, original_scheme, networks)

    ws_protocol.parse_x_forwarded_for = parse_x_forwarded_for
    http_protocol.parse_x_forwarded_for = parse_x_forwarded_for

    # 6. request bodies capped before they are buffered (and timed, and gated)
    got_length, handle_content_chunk, process = body_cap.request_methods(http_protocol.WebRequest)
    http_protocol.WebRequest.gotLength = got_length
    http_protocol.WebRequest.handleContentChunk = handle_content_chunk
    http_protocol.WebRequest.process = _upgrade_let_go(process)

    # 7. no form parsing (Twisted sets the flag per request, from an argument daphne never passes)
    original_request_init = http_protocol.WebRequest.__init__

    def request_init(self, *args, **kwargs):
        original_request_init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    http_protocol.WebRequest.__init__ = request_init

    WebSocketProtocol._switchboard_patched = True
    log.debug("daphne patched (pid %s)", os.getpid())

