"""What daphne needs to be a safe WebSocket server for Switchboard, installed by config.asgi.

1. **Close codes.** Autobahn's `sendClose` admits only 1000 and 3000-4999 from an application, but
   1008 (policy), 1009 (too big), 1011 (internal error), 1012 (service restart) and 1013 (try again
   later) are registered codes a server may send (RFC 6455 7.4.1; IANA). Daphne's `serverClose`
   goes through `sendClose`, so without this a `close(code=1008)` raises inside daphne and the
   client sees 1011 instead. The close frame also carries the application's reason text, which
   daphne drops.
2. **Frames over the size limit get 1009.** Autobahn fails such a connection by dropping the TCP
   connection (`failByDrop`), which a client sees as 1006; with it off, autobahn sends 1009 and
   never reads the oversized frame into memory.
3. **A bounded incoming queue.** Daphne hands every received frame to the application through an
   unbounded queue; a client sending faster than its frames are handled grew the node without
   limit. Past WS_MAX_QUEUED_FRAMES unhandled frames the connection is closed with 4003.
4. **A bounded outgoing buffer.** `send` on an ASGI socket never blocks: what a client does not read
   piles up in Twisted's write buffer. Past WS_MAX_OUTGOING_BYTES the connection is closed with
   4002 and further frames are dropped. The buffer is also offered to the application as the scope
   extension `switchboard.outgoing` (an `OutgoingBuffer`): the consumer learns when the bytes of a
   frame have left the node, and only then counts a message delivered, so a slow reader that is
   cut off keeps its undelivered messages in its mailbox.
5. **Proxy headers from trusted proxies only.** With `--proxy-headers` daphne believes any client's
   `X-Forwarded-For`. The header is honoured only when the peer is one of TRUSTED_PROXIES.

**Only on the versions it was tested with.** All of this replaces daphne's and autobahn's methods
and reads Twisted's private write buffer (`dataBuffer`, `offset`, `_tempDataLen`, `doWrite`). Another
version may rename or move any of them without an error: the slow-reader cut-off silently stops
working, and a message counts as delivered when it is written rather than when it has left the node.
So `install()` first compares the installed daphne, Twisted and autobahn with TESTED_VERSIONS (what
requirements.lock pins) and refuses to start on any other version, naming each package, the version
found and the one expected. An operator who has checked the adapter against other versions sets
DAPHNE_ALLOW_UNTESTED_VERSIONS: the node then starts, with a warning naming them. `config.web` runs
the same check before it starts daphne, so a web node stops with that message and no traceback.
"""

from __future__ import annotations

import functools
import importlib.metadata
import ipaddress
import logging
import os
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from foundation.metrics import CONNECTIONS_CLOSED
from foundation.transport.frames import CLOSE_FRAME_FLOOD, CLOSE_SLOW_READER

log = logging.getLogger(__name__)

SERVER_CODES = {1000, 1001, 1008, 1009, 1011, 1012, 1013}
OUTGOING_EXTENSION = "switchboard.outgoing"
STREAM_PATHS = ("/sse/",)  # HTTP responses that stream for minutes
# A client that does not answer our close frame within this many seconds is dropped.
CLOSE_HANDSHAKE_TIMEOUT = 5


# The distributions this module was written and tested against: the versions requirements.lock pins
# (tests/foundation/test_daphne_adapter.py holds the two together). After an upgrade, check every
# patch below against the new versions, then change these.
TESTED_VERSIONS = {"daphne": "4.2.3", "Twisted": "26.10.0", "autobahn": "26.10.2"}
ALLOW_UNTESTED_SETTING = "DAPHNE_ALLOW_UNTESTED_VERSIONS"


class UntestedVersions(ImproperlyConfigured):
    """daphne, Twisted or autobahn is not at the version this module was tested with."""


def untested_versions() -> list[tuple[str, str, str]]:
    """(distribution, version found, version expected) for each one not at its tested version."""
    found = []
    for name, expected in TESTED_VERSIONS.items():
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        if version != expected:
            found.append((name, version, expected))
    return found


# Once per process, so an allowed mismatch warns once (a refusal raises again): config.web checks before
# it starts daphne, install() again when config.asgi is imported.
@functools.cache
def check_versions() -> None:
    """Refuse (UntestedVersions) to patch versions other than TESTED_VERSIONS, unless the operator
    allows it with DAPHNE_ALLOW_UNTESTED_VERSIONS; then only warn."""
    mismatches = untested_versions()
    if not mismatches:
        return
    found = "; ".join(f"{name} {version} (expected {expected})" for name, version, expected in mismatches)
    if getattr(settings, ALLOW_UNTESTED_SETTING, False):
        log.warning("starting on untested versions, as %s allows: %s; foundation.daphne_adapter's patches may not "
                    "work on them", ALLOW_UNTESTED_SETTING, found)
        return
    raise UntestedVersions(
        f"untested versions: {found}. foundation.daphne_adapter patches daphne and autobahn and reads private "
        "attributes of Twisted; on other versions the slow-reader cut-off can silently stop working. Install the "
        "locked versions (make install, or pip install --require-hashes -r requirements.lock), or, once the adapter "
        f"is checked against these versions, set {ALLOW_UNTESTED_SETTING}=true to start anyway.")


def _setting(name: str, default: int) -> int:
    return int(getattr(settings, name, default))


class OutgoingBuffer:
    """Bytes a connection has queued for its socket, and how many of them have left the node.

    Counts what passes through the transport's `write`; "left" means handed to the kernel (what
    Twisted's write buffer no longer holds). On a transport that does not expose its buffer (TLS
    terminated by daphne itself) nothing is ever pending, and every write counts as gone at once.
    """

    def __init__(self, transport) -> None:
        self.transport = transport
        self.queued = 0
        self.on_flush: Callable[[], None] | None = None
        self._exact = all(hasattr(transport, a) for a in ("dataBuffer", "offset", "_tempDataLen", "doWrite"))
        original_write, original_sequence = transport.write, transport.writeSequence

        def write(data: bytes) -> None:
            self.queued += len(data)
            original_write(data)

        def write_sequence(chunks) -> None:
            chunks = list(chunks)
            self.queued += sum(len(c) for c in chunks)
            original_sequence(chunks)

        transport.write, transport.writeSequence = write, write_sequence
        if self._exact:
            original_do_write = transport.doWrite

            def do_write():
                result = original_do_write()
                if self.on_flush is not None:
                    try:
                        self.on_flush()
                    except Exception:
                        log.exception("flush callback failed")
                return result

            transport.doWrite = do_write

    def pending(self) -> int:
        if not self._exact:
            return 0
        t = self.transport
        return len(t.dataBuffer) - t.offset + t._tempDataLen

    def flushed(self) -> int:
        return self.queued - self.pending()


def _trusted_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n, strict=False) for n in getattr(settings, "TRUSTED_PROXIES", [])]


def _peer_trusted(addr, networks) -> bool:
    if not addr or not networks:
        return False
    try:
        ip = ipaddress.ip_address(str(addr[0]))
    except ValueError:
        return False
    return any(ip in net for net in networks)


def install() -> None:
    check_versions()
    # Here, not at the top: only patching needs daphne (whose server module installs Twisted's reactor
    # on import); messaging's consumers and streams import this module for OutgoingBuffer alone.
    from daphne import http_protocol, server, ws_protocol
    from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol  # likewise

    if getattr(WebSocketProtocol, "_switchboard_patched", False):
        return
    max_frames = _setting("WS_MAX_QUEUED_FRAMES", 500)
    max_outgoing = _setting("WS_MAX_OUTGOING_BYTES", 8 * 1024 * 1024)

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
        if not self.muted and queue is not None and queue.qsize() >= max_frames:
            log.warning("closing %s: more than %d frames waiting to be handled", self.client_addr, max_frames)
            self.muted = True
            CONNECTIONS_CLOSED.labels("frame_flood").inc()
            self.serverClose(code=CLOSE_FRAME_FLOOD)
            # the application still hears the disconnect (onClose), so its cleanup runs
            return None
        return original_on_message(self, payload, is_binary)

    WebSocketProtocol.onMessage = on_message

    original_on_close = WebSocketProtocol.onClose

    def on_close(self, was_clean, code, reason):
        # A muted protocol would skip telling the application it is gone: it always must be told.
        self.muted = False
        return original_on_close(self, was_clean, code, reason)

    WebSocketProtocol.onClose = on_close

    # 4. a bounded outgoing buffer, offered to the application
    original_create = server.Server.create_application

    def create_application(self, protocol, scope):
        if isinstance(protocol, WebSocketProtocol) and getattr(protocol, "transport", None) is not None:
            buffer = OutgoingBuffer(protocol.transport)
            protocol._switchboard_outgoing = buffer
            scope.setdefault("extensions", {})[OUTGOING_EXTENSION] = buffer
        elif scope.get("type") == "http" and str(scope.get("path", "")).startswith(STREAM_PATHS):
            # A long-lived HTTP stream (SSE) gets the same view of its socket's buffer; a kept-alive
            # connection's transport is wrapped once.
            transport = getattr(getattr(protocol, "channel", None), "transport", None)
            if transport is not None:
                buffer = getattr(transport, "_switchboard_outgoing", None) or OutgoingBuffer(transport)
                transport._switchboard_outgoing = buffer
                scope.setdefault("extensions", {})[OUTGOING_EXTENSION] = buffer
        return original_create(self, protocol, scope)

    server.Server.create_application = create_application

    original_send = WebSocketProtocol.serverSend

    def server_send(self, content, binary=False):
        if getattr(self, "_switchboard_slow", False):
            return None  # cut off: nothing more is queued for a reader that does not read
        original_send(self, content, binary)
        buffer = getattr(self, "_switchboard_outgoing", None)
        if buffer is not None and buffer.pending() > max_outgoing:
            log.warning("closing %s: %d bytes queued for a reader that does not keep up", self.client_addr,
                        buffer.pending())
            self._switchboard_slow = True
            CONNECTIONS_CLOSED.labels("slow_reader").inc()
            self.serverClose(code=CLOSE_SLOW_READER)
        return None

    WebSocketProtocol.serverSend = server_send

    # 5. proxy headers only from trusted proxies
    networks = _trusted_networks()
    original_parse = ws_protocol.parse_x_forwarded_for

    def parse_x_forwarded_for(headers, address_header_name=None, port_header_name=None, proto_header_name=None,
                              original_addr=None, original_scheme=None):
        if not _peer_trusted(original_addr, networks):
            return original_addr, original_scheme
        return original_parse(headers, address_header_name, port_header_name, proto_header_name, original_addr,
                              original_scheme)

    ws_protocol.parse_x_forwarded_for = parse_x_forwarded_for
    http_protocol.parse_x_forwarded_for = parse_x_forwarded_for

    WebSocketProtocol._switchboard_patched = True
    log.debug("daphne patched (pid %s)", os.getpid())
