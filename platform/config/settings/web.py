"""Settings of what a web node reads from its clients beyond /ws (request bodies, Socket.IO), of the
browser client it serves them, and of how it runs (the GIL switch interval).

Read from the environment here and only here; base.py star-imports this module.
"""

from __future__ import annotations

from pathlib import Path

from .env import env_bool, env_float, env_int, env_list

# The browser client is a package of its own (clients/js, the npm package switchboard-client) and its
# one source: every web node serves it as /static/switchboard/switchboard.js from there (through the
# staticfiles finders, as base.py's WHITENOISE_USE_FINDERS says, and collectstatic in the image).
STATICFILES_DIRS = [("switchboard", Path(__file__).resolve().parents[3] / "clients" / "js")]

# The largest HTTP request body a web node reads, in bytes, before the application sees it
# (foundation.body_cap; past it: 413 and the connection closed), and larger caps where a path prefix
# documents one: the calls between domains carry up to NETWORK_MAX_BODY_BYTES (messaging.federation).
HTTP_MAX_BODY_BYTES = env_int("HTTP_MAX_BODY_BYTES", 2_621_440)  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE
DATA_UPLOAD_MAX_MEMORY_SIZE = HTTP_MAX_BODY_BYTES
NETWORK_MAX_BODY_BYTES = env_int("NETWORK_MAX_BODY_BYTES", 32 * 1024 * 1024)
HTTP_MAX_BODY_BYTES_BY_PREFIX = {"/internal/": NETWORK_MAX_BODY_BYTES}
# A request body not complete this many seconds after its headers is answered 408 and its connection
# closed (foundation.body_cap): a body sent a byte at a time holds no connection for ever. 0: no limit.
HTTP_BODY_TIMEOUT_SECONDS = env_float("HTTP_BODY_TIMEOUT_SECONDS", 30.0)
# Path prefixes whose requests are checked from their headers before any of their body is read: the
# calls between domains must come from a neighbour, signed, fresh and with a nonce not yet used
# (messaging.federation.wire.transport.peer_headers_gate), or they are refused and their connection closed.
HTTP_HEADER_GATES = {"/internal/": "messaging.federation.wire.transport.peer_headers_gate"}
# Of the bodies a neighbour's calls may carry past the public cap (over NETWORK_LARGE_BODY_BYTES, up to
# NETWORK_MAX_BODY_BYTES), at most this many per link are read at once on a web node; one more is
# answered 503 (its caller retries with its backoff). Memory held by such bodies on a node is at most
# links x this x NETWORK_MAX_BODY_BYTES.
NETWORK_LARGE_BODY_BYTES = env_int("NETWORK_LARGE_BODY_BYTES", HTTP_MAX_BODY_BYTES)
NETWORK_LARGE_BODIES_PER_LINK = env_int("NETWORK_LARGE_BODIES_PER_LINK", 2)
# Socket.IO at /socket.io/ (messaging.gateway.socketio): Engine.IO's heartbeat (the server pings every
# interval; a session whose pong does not come within the timeout is closed) and the largest
# payload a client may send in one poll or WebSocket frame, in bytes (told to clients at the handshake).
SOCKETIO_PING_INTERVAL = env_float("SOCKETIO_PING_INTERVAL", 25.0)
SOCKETIO_PING_TIMEOUT = env_float("SOCKETIO_PING_TIMEOUT", 20.0)
SOCKETIO_MAX_PAYLOAD = env_int("SOCKETIO_MAX_PAYLOAD", 1_000_000)
# Bounds of an Engine.IO session (messaging.gateway.socketio.engine; docs/security.md, "Socket.IO"). Packets
# one poll's payload may carry (past it: 400 and the session ended), and, until its client has
# logged in, the payload's bytes and packets (a CONNECT and a PONG are all a session needs then).
SOCKETIO_MAX_PACKETS = env_int("SOCKETIO_MAX_PACKETS", 1000)
SOCKETIO_PREAUTH_MAX_PAYLOAD = env_int("SOCKETIO_PREAUTH_MAX_PAYLOAD", 16 * 1024)
SOCKETIO_PREAUTH_MAX_PACKETS = env_int("SOCKETIO_PREAUTH_MAX_PACKETS", 16)
# Sessions whose client has not logged in yet, per node and per client address: a handshake beyond
# either is refused (403, Engine.IO's code 4); each such session ends WS_AUTH_TIMEOUT after it opened.
SOCKETIO_PREAUTH_SESSIONS_PER_NODE = env_int("SOCKETIO_PREAUTH_SESSIONS_PER_NODE", 10_000)
SOCKETIO_PREAUTH_SESSIONS_PER_ADDRESS = env_int("SOCKETIO_PREAUTH_SESSIONS_PER_ADDRESS", 200)
# What may wait for a polling client's next poll, in packets and bytes: past either, the client is
# cut off as a slow reader (as /ws past WS_MAX_OUTGOING_BYTES) and what it held goes back to the mailbox.
SOCKETIO_MAX_OUTBOX_PACKETS = env_int("SOCKETIO_MAX_OUTBOX_PACKETS", 10_000)
SOCKETIO_MAX_OUTBOX_BYTES = env_int("SOCKETIO_MAX_OUTBOX_BYTES", 8 * 1024 * 1024)
# The event loop watched (foundation.loop_watch): a timer every LOOP_LAG_INTERVAL_SECONDS measures how
# late the loop runs what is due (switchboard_event_loop_lag_seconds); a stall longer than
# LOOP_STALL_LOG_SECONDS (0: not logged) is logged with the garbage collections that ran in it (looked
# at every LOOP_STALL_SAMPLE_SECONDS) and, with LOOP_STALL_STACKS, the loop thread's stack sampled
# meanwhile: for a diagnosis only (reading a running thread's frames can crash CPython 3.11).
LOOP_LAG_INTERVAL_SECONDS = env_float("LOOP_LAG_INTERVAL_SECONDS", 0.01)
LOOP_STALL_LOG_SECONDS = env_float("LOOP_STALL_LOG_SECONDS", 0.05)
LOOP_STALL_SAMPLE_SECONDS = env_float("LOOP_STALL_SAMPLE_SECONDS", 0.005)
LOOP_STALL_STACKS = env_bool("LOOP_STALL_STACKS", False)
# Once the node's runtime has started, what it holds is frozen out of the garbage collector's full
# passes (foundation.heap), which otherwise walk it all on the event loop's thread.
WEB_HEAP_FREEZE = env_bool("WEB_HEAP_FREEZE", True)
# The web node's garbage collector thresholds (gc.set_threshold; Python's are 700,10,10; empty leaves
# them): at 700 a node under traffic collected its young objects 25 times a second and promoted what
# was in flight, so a full pass came every few seconds. 10000,7,0 collects the young generation
# rarely and considers a full pass every 80,000 allocations, about as often as Python's own (85,000)
# (foundation.heap; issue 47).
WEB_GC_THRESHOLDS = tuple(int(n) for n in env_list("WEB_GC_THRESHOLDS", ["10000", "7", "0"]))
# What a full garbage collection leaves alive is frozen after it (foundation.heap.survivors_freeze):
# the next full pass walks only what was made since, not every held connection again (issue 47).
WEB_GC_FREEZE_SURVIVORS = env_bool("WEB_GC_FREEZE_SURVIVORS", True)
# The web node's GIL switch interval (sys.setswitchinterval), in seconds: how long a database thread
# whose answer has come may wait for the event loop's thread (config.web).
WEB_GIL_SWITCH_SECONDS = env_float("WEB_GIL_SWITCH_SECONDS", 0.0005)
# A pooled database connection idle this long is checked (SELECT 1) before the intake's next batch
# runs on it (messaging.intake.group_commit): one dropped by a Postgres restart no longer fails that batch.
INTAKE_IDLE_CHECK_SECONDS = env_float("INTAKE_IDLE_CHECK_SECONDS", 1.0)
from .pusher import *  # noqa: E402, F403  (the Pusher protocol door)
