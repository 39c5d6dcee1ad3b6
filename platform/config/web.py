"""Start a web node: daphne serving config.asgi with Switchboard's WebSocket limits.

    python -m config.web [--bind 0.0.0.0] [--port 8000] [extra daphne options]

Daphne's message-size ceiling is WS_MAX_FRAME_BYTES itself: a larger frame is refused by autobahn
with a clean close 1009 before it is read into memory (foundation.patches.daphne turns autobahn's
default, dropping the TCP connection, into a close frame). Proxy headers are parsed, but believed
only from TRUSTED_PROXIES, the client being the rightmost X-Forwarded-For hop that is not a trusted
proxy (foundation.forwarded, applied by foundation.patches.daphne to both HTTP and WebSocket).
The socket listens with a backlog of WEB_LISTEN_BACKLOG, and a WebSocket handshake may take
WS_HANDSHAKE_TIMEOUT seconds: a reconnect storm's handshakes wait in the kernel's queue and the
node's, not in TCP retransmits or in another reconnect (issue 17).

Before daphne starts, the installed daphne, Twisted and autobahn, Django, Channels and
channels-redis are checked against the versions foundation.patches was tested with: on others the node
stops at once, with a message saying which and how to override (DAPHNE_ALLOW_UNTESTED_VERSIONS,
ALLOW_UNTESTED_VERSIONS), instead of failing inside daphne's import of config.asgi with a traceback.

Before it listens, everything imported so far is frozen out of the garbage collector's full passes
(foundation.heap, WEB_HEAP_FREEZE), which would otherwise walk it all on the event loop's thread, and
the young generation is collected less often (WEB_GC_THRESHOLDS), and what each full pass leaves
alive is frozen after it (WEB_GC_FREEZE_SURVIVORS).

SIGTERM (or SIGINT) drains the node before it exits (foundation.drain_server, messaging.gateway.drain):
/readyz 503, no new sockets, clients closed with 1012 spread over DRAIN_SECONDS, everything batched
flushed, the Node deregistered. A second signal stops it at once.
"""

from __future__ import annotations

import argparse
import os
import sys

import django
from daphne.cli import CommandLineInterface
from django.conf import settings

from foundation.drain_server import DrainingServer
from foundation.patches import versions_check
from foundation.patches.versions import UntestedVersions


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--bind", "-b", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", "-p", default=os.environ.get("PORT", "8000"))
    known, extra = parser.parse_known_args(argv)
    frame_limit = str(int(os.environ.get("WS_MAX_FRAME_BYTES", 1024 * 1024)))

    try:
        django.setup()  # the check reads settings and may log a warning; config.asgi sets up again (idempotent)
        versions_check()
    except UntestedVersions as exc:
        sys.exit(f"web node not started: {exc}")
    # The node's database threads wait on Postgres with the GIL released; when the answer comes,
    # each waits for the event loop's thread to hand the GIL back, up to the switch interval (5 ms
    # by default) per statement. A shorter interval shortens every group commit under load.
    sys.setswitchinterval(settings.WEB_GIL_SWITCH_SECONDS)

    from foundation.heap import gc_thresholds, heap_freeze, survivors_freeze  # (after django.setup(): it logs)
    from messaging.gateway.drain import node_drain  # imports models: only once django.setup() has run

    if settings.WEB_HEAP_FREEZE:
        import config.asgi  # noqa: F401  (what daphne imports next: its objects frozen with the rest)

        heap_freeze()  # before the node listens: no client waits for it
    gc_thresholds(settings.WEB_GC_THRESHOLDS)
    survivors_freeze(settings.WEB_GC_FREEZE_SURVIVORS)

    interface = known.bind.strip("[]").replace(":", r"\:")
    cli = CommandLineInterface()
    cli.server_class = DrainingServer.draining_with(node_drain)
    cli.run([
        "-e", f"tcp:port={int(known.port)}:interface={interface}:backlog={settings.WEB_LISTEN_BACKLOG}",
        "--proxy-headers", "--websocket_connect_timeout", str(settings.WS_HANDSHAKE_TIMEOUT),
        "--websocket-max-message-size", frame_limit, "--websocket-max-frame-size", frame_limit,
        *extra, "config.asgi:application",
    ])
    sys.exit(cli.server.exit_code)


if __name__ == "__main__":
    main(sys.argv[1:])
