"""Settings of the event exchange (issue 19: messaging.exchange, `manage.py eventsource`).

Read from the environment here and only here; network.py star-imports this module.
"""

from __future__ import annotations

from .env import env_float, env_int, env_str

# --- engine (messaging.exchange.engine / adapter) ---
# Group commit: a batch of applied events is committed (Follow rows + applied_seq) once it holds
# this many events or its oldest event waited this long, whichever comes first. Notifications of a
# batch are written only after its commit, so the window is also the added latency.
EXCHANGE_COMMIT_EVENTS = env_int("EXCHANGE_COMMIT_EVENTS", 20000)
EXCHANGE_COMMIT_MS = env_float("EXCHANGE_COMMIT_MS", 20.0)
# A gap (a missing sequence number with later events held behind it) is reported after this long...
EXCHANGE_GAP_REPORT_SECONDS = env_float("EXCHANGE_GAP_REPORT_SECONDS", 5.0)
# ...and given up after this long: the missing numbers are skipped and the held events applied.
# 0 = wait forever (the gap stays reported).
EXCHANGE_GAP_TIMEOUT_SECONDS = env_float("EXCHANGE_GAP_TIMEOUT_SECONDS", 30.0)
# An event this far or further ahead of the last applied sequence number is refused (counted and
# logged as malformed): held, it would open a gap the timeout could only close by skipping to it.
EXCHANGE_MAX_AHEAD = env_int("EXCHANGE_MAX_AHEAD", 1_000_000)
# The event port trusts its network (docs/security.md). Where it is bound wider, a source must send
# this secret as its first line, or it is closed before any event is read. Empty: no secret asked.
EXCHANGE_SOURCE_SECRET = env_str("EXCHANGE_SOURCE_SECRET", "")
# Bytes a TCP client may have waiting in its socket buffer before it is disconnected as too slow.
EXCHANGE_CLIENT_BUFFER_BYTES = env_int("EXCHANGE_CLIENT_BUFFER_BYTES", 16 * 1024 * 1024)

# --- the REST intake and the /ws bridge (messaging.exchange.event_lines, messaging.exchange.ws_bridge) --
# Event lines per POST /api/v1/events call.
EXCHANGE_INTAKE_MAX_EVENTS = env_int("EXCHANGE_INTAKE_MAX_EVENTS", 10_000)
# An app's intake stream may hold this many bytes (Redis's own count of its memory) while its
# eventsource reads it, and this many while none does; past them a call is refused (429), never
# trimmed: the shared Redis cannot be filled by one tenant, and no unread event is dropped.
EXCHANGE_INTAKE_MAX_BYTES = env_int("EXCHANGE_INTAKE_MAX_BYTES", 16 * 1024 * 1024)
EXCHANGE_INTAKE_UNREAD_BYTES = env_int("EXCHANGE_INTAKE_UNREAD_BYTES", 1024 * 1024)
# How long the answer "does the app have /ws users online" is reused (the engine asks per batch).
EXCHANGE_WS_LISTENERS_TTL_SECONDS = env_float("EXCHANGE_WS_LISTENERS_TTL_SECONDS", 1.0)
