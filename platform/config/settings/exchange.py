"""Settings of the ordered event exchange (issue 19, messaging.exchange).

Read from the environment here and only here; network.py imports the names (base.py imports network.py).
"""

from __future__ import annotations

from .env import env_float, env_int

# --- the REST intake and the /ws bridge (messaging.exchange.intake, messaging.exchange.ws_bridge) --
# Event lines per POST /api/v1/events call.
EXCHANGE_INTAKE_MAX_EVENTS = env_int("EXCHANGE_INTAKE_MAX_EVENTS", 10_000)
# Entries (one per call) an app's intake stream keeps (XADD MAXLEN ~): the engine reads far faster
# than callers write, so only a stopped engine lets it fill; the oldest batches then go.
EXCHANGE_INTAKE_STREAM_MAXLEN = env_int("EXCHANGE_INTAKE_STREAM_MAXLEN", 100_000)
# How long the answer "does the app have /ws users online" is reused (the engine asks per batch).
EXCHANGE_WS_LISTENERS_TTL_SECONDS = env_float("EXCHANGE_WS_LISTENERS_TTL_SECONDS", 1.0)
