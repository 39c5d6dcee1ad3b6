"""Let daphne send the close codes PROTOCOL.md promises.

Autobahn's `sendClose` admits only 1000 and 3000-4999 from an application, but 1008 (policy),
1009 (too big), 1011 (internal error) and 1012 (service restart) are registered codes a server
may send (RFC 6455 7.4.1; IANA). Daphne's `serverClose` goes through `sendClose`, so without this
a `close(code=1008)` raises inside daphne and the client sees 1011 instead.
"""

from __future__ import annotations

SERVER_CODES = {1000, 1001, 1008, 1009, 1011, 1012, 1013}


def install() -> None:
    from daphne.ws_protocol import WebSocketProtocol

    if getattr(WebSocketProtocol, "_switchboard_close_codes", False):
        return

    def server_close(self, code=None):
        code = 1000 if code is None else code
        if code in SERVER_CODES or 3000 <= code <= 4999:
            self.sendCloseFrame(code=code, reasonUtf8=None, isReply=False)
        else:
            self.sendClose(code=1011)

    WebSocketProtocol.serverClose = server_close
    WebSocketProtocol._switchboard_close_codes = True
