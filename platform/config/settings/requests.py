"""Settings of requests to the apps' servers (messaging.requests, docs/protocol.md "Requests").

Read from the environment here and only here; network.py star-imports this module (as it does
queues.py), and base.py merges
REQUESTS_BEAT_SCHEDULE into Celery's.
"""

from __future__ import annotations

from .env import env_float, env_int, env_str

# How often beat rejects the requests past their deadline (`reason: "timeout"`): a timeout is late by
# at most this much.
REQUEST_TIMEOUT_SWEEP_SECONDS = env_float("REQUEST_TIMEOUT_SWEEP_SECONDS", 1.0)
# An app's request stream (sbq:<APPNAME>:requests) keeps about this many entries at most: a server
# that never reads it does not grow Redis without end (its requests time out).
REQUEST_STREAM_MAX_ENTRIES = env_int("REQUEST_STREAM_MAX_ENTRIES", 100_000)
# A web node makes the first attempt of its requests' webhook calls itself, on its event loop, at most
# this many of one app's at once (the rest wait for a slot); past the waiting bound, and for every
# retry, the webhook workers do.
REQUEST_INLINE_CALLS_PER_APP = env_int("REQUEST_INLINE_CALLS_PER_APP", 8)
REQUEST_INLINE_WAITING_PER_APP = env_int("REQUEST_INLINE_WAITING_PER_APP", 1000)
# How much of a request webhook's 2xx answer is read for `{"resolve"|"reject": content}`.
REQUEST_WEBHOOK_ANSWER_MAX_BYTES = env_int("REQUEST_WEBHOOK_ANSWER_MAX_BYTES", 1024 * 1024 + 4096)
# Where servers answer this domain's requests (answerUrl); empty: this domain's URL in the registry.
REQUESTS_ANSWER_BASE_URL = env_str("REQUESTS_ANSWER_BASE_URL", "")
# The window /metrics reads the requests' outcomes and latency over (messaging.requests.metrics).
REQUEST_METRICS_WINDOW_SECONDS = env_int("REQUEST_METRICS_WINDOW_SECONDS", 300)
REQUEST_RETENTION_DAYS = env_int("REQUEST_RETENTION_DAYS", 7)  # closed requests (and ended sessions) older than this go
# A server's request of a client (POST /api/v1/users/{user}/requests) times out after this long unless
# it names its own `timeoutSeconds`.
SERVER_REQUEST_TIMEOUT_SECONDS = env_float("SERVER_REQUEST_TIMEOUT_SECONDS", 300.0)
# A client's resumable session with outcomes (or requests) waiting ends once none of its connections
# has been open for this long: what waited for it is discarded (messaging.requests.sessions).
SESSION_TIMEOUT_SECONDS = env_int("SESSION_TIMEOUT_SECONDS", 24 * 3600)
SESSION_TIMEOUT_SWEEP_SECONDS = env_float("SESSION_TIMEOUT_SWEEP_SECONDS", 60.0)

REQUESTS_BEAT_SCHEDULE = {
    "requests-time-out": {"task": "messaging.tasks.requests_time_out", "schedule": REQUEST_TIMEOUT_SWEEP_SECONDS},
    "requests-purge": {"task": "messaging.tasks.requests_purge", "schedule": 3600.0},
    "sessions-time-out": {"task": "messaging.tasks.sessions_time_out", "schedule": SESSION_TIMEOUT_SWEEP_SECONDS},
}
