"""httpx's internals, reached into on the version it was tested with (foundation.patches.versions).

1. **A transport on a network backend of ours.** httpx 0.28 takes no network backend
   (encode/httpx#3749), and the outgoing address filter (foundation.outgoing) must be the one that
   resolves and connects: so the connection pool httpx built (AsyncHTTPTransport's private `_pool`)
   is replaced by the same pool on our backend. tests/foundation/test_outgoing.py proves the filter
   holds.
2. **No `sniffio` looked for on every call.** httpcore 1.0 asks `import sniffio` each time a pool
   hands out a connection, to tell asyncio from trio; anyio 4.16 no longer brings sniffio, so each
   of those imports failed after searching the whole import path (tens of `stat` calls: a request's
   webhook call spent more CPU there than in HTTP). Where sniffio is not installed, it is recorded as
   absent once (`sys.modules["sniffio"] = None`: the import fails at once, and httpcore takes asyncio,
   as it did after each search).
"""

from __future__ import annotations

import importlib.util
import sys

import httpcore
import httpx

from foundation.patches.versions import require_tested

# After an upgrade, check the patch above against the new version, then change this.
TESTED_VERSIONS = {"httpx": "0.28.1"}
require_tested(TESTED_VERSIONS, patcher=__name__,
               risk="on other versions outgoing calls can connect to addresses the filter never checked")

# 2. sniffio, where it is not installed, known to be absent (see above)
if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]


class BackendTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose connections `backend` makes (it resolves and connects)."""

    def __init__(self, limits: httpx.Limits, backend: httpcore.AsyncNetworkBackend) -> None:
        ssl_context = httpx.create_ssl_context()  # once: it loads the CA bundle (tens of ms)
        super().__init__(verify=ssl_context, limits=limits, trust_env=False)
        # 1. the pool httpx built, replaced by the same pool on `backend`
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend)
