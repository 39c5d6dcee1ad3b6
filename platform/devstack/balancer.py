"""HAProxy in front of several web nodes: its configuration, in one place, for `make run` and compose.

    python -m devstack.balancer --compose > platform/haproxy.cfg   # regenerate compose's copy

What the configuration guarantees (the same text for `make run WEB_NODES=N` and docker-compose.yml,
which differ only in how the servers are named: listed ports here, docker's DNS there):

- HTTP mode, and a WebSocket upgrade becomes a tunnel that may stay silent for TUNNEL_TIMEOUT (the
  protocol pings far more often); plain requests and SSE streams (a heartbeat every 30 s) get
  CLIENT_SERVER_TIMEOUT of silence.
- A node is in rotation only while its /readyz answers 200: checked every second, out after one
  failure (a draining node answers 503 at once, a dead one does not answer), back after two
  successes. Being marked down does not cut the node's open connections: a draining node closes
  its clients itself, with 1012, so they reconnect through here to the others.
- `balance leastconn`: a new connection goes to the node holding the fewest, which is right for
  long-lived WebSockets (round robin would pile them on a node that just came back empty-handed
  last, never evening out).
- A connection refused by a node that died between two checks is retried on another node.
- A Socket.IO polling session keeps to the node that opened it (a stick table on its `sid`).
- X-Forwarded-For gets the client's address appended, and X-Forwarded-Proto is set (never passed
  through from the client); the web nodes believe both only from TRUSTED_PROXIES
  (foundation.forwarded), which must therefore name this HAProxy's address.
- HAProxy runs in the foreground (-db), supervised like any child, and says what matters on its
  standard error, which the supervisor prints with the others: servers going up and down, and
  configuration errors. Requests are not logged (no `log` target): the web nodes log those.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devstack import sysdeps

BACKEND = "web"
HEALTH_PATH = "/readyz"
CHECK_INTERVAL = "1s"
TUNNEL_TIMEOUT = "1h"
CLIENT_SERVER_TIMEOUT = "60s"
COMPOSE_PORT = 8000
COMPOSE_INTERNAL_PORT = 8001  # the calls between domains (_internal_frontend)
INTERNAL_PREFIX = "/internal/"
COMPOSE_MAX_WEB_NODES = 10
COMPOSE_FILE = Path(__file__).resolve().parents[1] / "haproxy.cfg"
SOCKETIO_SID_HEADER = "x-socketio-sid"  # messaging.gateway.socketio.endpoint's handshake answer names its session
SOCKETIO_STICK_EXPIRE = "10m"  # a session's requests come every ping interval (25 s) at the most


@dataclass(frozen=True)
class Server:
    """One web node behind HAProxy: its NODE_ID names it in HAProxy's logs and stats."""

    name: str
    port: int
    host: str = "127.0.0.1"


def _common(header: str) -> list[str]:
    return [
        header,
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        f"    timeout client {CLIENT_SERVER_TIMEOUT}",
        f"    timeout server {CLIENT_SERVER_TIMEOUT}",
        f"    timeout tunnel {TUNNEL_TIMEOUT}",
        "    timeout http-request 10s",
        "    timeout check 2s",
        "    retries 3",
        "    option redispatch 1",
        "",
    ]


def _frontend(bind: str) -> list[str]:
    return [
        "frontend switchboard",
        f"    bind {bind}",
        "    option forwardfor",
        "    http-request set-header X-Forwarded-Proto http",
        f"    default_backend {BACKEND}",
        "",
    ]


def _internal_frontend(bind: str) -> list[str]:
    """Where neighbouring domains call (/internal/*: forwarding, the flood, pings, the meta pull):
    a listener of its own, to be reached over the network between the domains only, that serves
    nothing else; the public frontend serves everything else and not /internal/ (404)."""
    return [
        "frontend internal",
        f"    bind {bind}",
        f"    http-request deny deny_status 404 unless {{ path_beg {INTERNAL_PREFIX} }}",
        f"    default_backend {BACKEND}",
        "",
    ]


def _backend_head() -> list[str]:
    # Host: localhost, which ALLOWED_HOSTS holds by default: Django refuses a request for a host it
    # does not serve, and a node answering 400 would be taken out of rotation.
    # A Socket.IO session (Engine.IO) lives on the node that opened it: its handshake answers with
    # the session id in SOCKETIO_SID_HEADER, remembered here with that node, and every later
    # request naming the session (`?sid=`: polls, posts, the upgrade to a WebSocket) goes there.
    # If that node is gone the request goes elsewhere, is told "Session ID unknown", and the
    # client opens a new session and recovers (docs/protocol.md, "Socket.IO").
    return [
        f"backend {BACKEND}",
        "    balance leastconn",
        f"    stick-table type string len 64 size 1m expire {SOCKETIO_STICK_EXPIRE}",
        "    stick match url_param(sid)",
        f"    stick store-response res.hdr({SOCKETIO_SID_HEADER})",
        f"    option httpchk GET {HEALTH_PATH} HTTP/1.1",
        "    http-check send hdr Host localhost",
        "    http-check expect status 200",
        f"    default-server inter {CHECK_INTERVAL} fall 1 rise 2",
    ]


def _stats(bind: str) -> list[str]:
    return [
        "",
        "listen stats",
        f"    bind {bind}",
        "    stats enable",
        "    stats uri /",
        "    stats refresh 2s",
    ]


def haproxy_config(*, port: int, servers: Sequence[Server], host: str = "127.0.0.1",
                   stats_port: int | None = None) -> str:
    """The configuration for `make run`: HAProxy on host:port in front of `servers`; its stats page
    (and the CSV devstack.rolling reads) on 127.0.0.1:stats_port when given."""
    if not servers:
        raise ValueError("HAProxy needs at least one web node behind it")
    lines = _common("# Written by devstack.balancer for make run; rewritten at every start.")
    lines += _frontend(f"{host}:{port}") + _backend_head()
    lines += [f"    server {s.name} {s.host}:{s.port} check" for s in servers]
    if stats_port is not None:
        lines += _stats(f"127.0.0.1:{stats_port}")
    return "\n".join(lines) + "\n"


def compose_config() -> str:
    """docker-compose.yml's configuration: up to COMPOSE_MAX_WEB_NODES replicas of the `web`
    service, found by docker's DNS (resolved again while running, so `--scale web=N` is followed);
    /internal/* only on COMPOSE_INTERNAL_PORT, which compose publishes on the private interface."""
    lines = _common("# docker-compose.yml's load balancer. Generated: python -m devstack.balancer --compose")
    lines += [
        "resolvers docker",
        "    nameserver dns 127.0.0.11:53",
        "    hold valid 5s",
        "",
    ]
    public = _frontend(f"*:{COMPOSE_PORT}")
    public.insert(-2, f"    http-request deny deny_status 404 if {{ path_beg {INTERNAL_PREFIX} }}")
    lines += public + _internal_frontend(f"*:{COMPOSE_INTERNAL_PORT}") + _backend_head()
    lines.append(f"    server-template web {COMPOSE_MAX_WEB_NODES} web:{COMPOSE_PORT} check resolvers docker init-addr none")
    lines += _stats("*:8404")
    return "\n".join(lines) + "\n"


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def haproxy_argv(config: Path) -> list[str]:
    """HAProxy in the foreground (-db), on `config`; sysdeps installs it when missing."""
    binary = sysdeps.haproxy_path()
    if binary is None:
        raise RuntimeError("HAProxy is not installed: python -m devstack.sysdeps haproxy")
    return [binary, "-db", "-f", str(config)]


def check_config(config: Path) -> str | None:
    """None when HAProxy accepts `config` (haproxy -c), else what it said."""
    result = subprocess.run([*haproxy_argv(config)[:1], "-c", "-f", str(config)],
                            capture_output=True, text=True, timeout=30)
    return None if result.returncode == 0 else (result.stdout + result.stderr).strip()


def server_states(stats_port: int, timeout: float = 2) -> dict[str, str]:
    """What HAProxy thinks of each web node ({"web-1": "UP", "web-2": "DOWN", ...}), from the
    stats page's CSV export."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/;csv", timeout=timeout) as resp:
        text = resp.read().decode()
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {row["svname"]: row["status"] for row in rows
            if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.balancer", description=__doc__.splitlines()[0])
    parser.add_argument("--compose", action="store_true", help="print docker-compose.yml's platform/haproxy.cfg")
    args = parser.parse_args(argv)
    if not args.compose:
        parser.print_help()
        return 2
    sys.stdout.write(compose_config())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
