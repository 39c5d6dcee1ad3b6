"""HTTP request bodies capped before they are buffered (installed by foundation.daphne_adapter).

Twisted reads a request's whole body before daphne hands the request to the application: into
memory when the declared length is under 100 kB, otherwise (or when no length is declared: a
chunked body) into a temporary file of no limit. So any request on any path, authenticated or not,
could grow a web node's temporary directory for as long as its client kept sending (`curl -T
/dev/zero -H 'Transfer-Encoding: chunked' …/healthz`).

Now each request gets a cap from its path as soon as its headers are in: HTTP_MAX_BODY_BYTES
(Django's DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB, by default), or a larger one where a path prefix
documents it (HTTP_MAX_BODY_BYTES_BY_PREFIX: the calls between domains, /internal/, carry up to
NETWORK_MAX_BODY_BYTES). A declared length over the cap is answered at once; a chunked body is kept
in memory and answered the moment it passes the cap. The answer is the API's error shape,
`413 {"error": "request_too_large", "detail": …}`, and the connection is closed, so nothing more of
the body is read, and nothing was written to disk.
"""

from __future__ import annotations

import io
import json
import logging

from django.conf import settings

from foundation.metrics import CONNECTIONS_CLOSED

log = logging.getLogger(__name__)


def cap_for(path: bytes) -> int:
    """The largest body a request to `path` may carry."""
    for prefix, cap in getattr(settings, "HTTP_MAX_BODY_BYTES_BY_PREFIX", {}).items():
        if path.startswith(prefix.encode()):
            return int(cap)
    return int(getattr(settings, "HTTP_MAX_BODY_BYTES", settings.DATA_UPLOAD_MAX_MEMORY_SIZE))


def refusal(cap: int) -> bytes:
    body = json.dumps({"error": "request_too_large", "detail": f"request bodies are limited to {cap} bytes"}).encode()
    return (b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def _refuse(request, cap: int) -> None:
    if getattr(request, "_switchboard_refused", False):
        return
    request._switchboard_refused = True
    request.content = io.BytesIO()  # what was kept is dropped
    transport = getattr(request.channel, "transport", None)
    log.info("refused a request body over %d bytes", cap)
    CONNECTIONS_CLOSED.labels("body_too_large").inc()
    if transport is not None:
        transport.write(refusal(cap))
        transport.loseConnection()


def install(request_class) -> None:
    """Patch daphne's request class (a twisted.web.http.Request): its body is capped."""
    original_got_length = request_class.gotLength
    original_chunk = request_class.handleContentChunk
    original_process = request_class.process

    def got_length(self, length):
        cap = cap_for(getattr(self.channel, "_path", b"") or b"")
        self._switchboard_cap, self._switchboard_read = cap, 0
        if length is not None and length > cap:
            self.content = io.BytesIO()
            _refuse(self, cap)
        elif length is None:
            self.content = io.BytesIO()  # chunked: in memory, and never past the cap
        else:
            original_got_length(self, length)

    def handle_content_chunk(self, data):
        if getattr(self, "_switchboard_refused", False):
            return
        cap = getattr(self, "_switchboard_cap", None)
        if cap is not None:
            self._switchboard_read += len(data)
            if self._switchboard_read > cap:
                _refuse(self, cap)
                return
        original_chunk(self, data)

    def process(self):
        if getattr(self, "_switchboard_refused", False):
            return None  # answered already; the connection is closing
        return original_process(self)

    request_class.gotLength = got_length
    request_class.handleContentChunk = handle_content_chunk
    request_class.process = process
