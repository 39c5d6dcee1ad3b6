"""Settings of the queue intake (issue 29: messaging.intake.stream): each app's Redis stream
`sbq:<APPNAME>:in`, written by the app's backend with its own Redis ACL user, read by the workers.

Read from the environment here and only here; network.py star-imports this module (as it does
exchange.py), and base.py merges QUEUE_BEAT_SCHEDULE and QUEUE_TASK_ROUTES into Celery's.
"""

from __future__ import annotations

from .env import env_bool, env_float, env_int, env_str

# The Redis the intake streams (and their ACL users) live on. Empty: REDIS_URL, the Redis every tenant
# shares. Point it at a Redis of its own with `maxmemory` set (policy noeviction) for a hard bound:
# a writer that outruns the gate below can then fill only that server (docs/security.md).
QUEUE_REDIS_URL = env_str("QUEUE_REDIS_URL", "")
# Routing workers (`-Q celery,routing`) run a consumer thread each (messaging.intake.stream.runner).
QUEUE_INTAKE_CONSUMER = env_bool("QUEUE_INTAKE_CONSUMER", True)
# An app's stream may hold this many bytes (Redis's MEMORY USAGE of the key) while a consumer is alive,
# and this many while none is; past them its ACL user loses +xadd (its XADD answers NOPERM) until the
# stream is back under half of the cap (messaging.intake.stream.gate).
QUEUE_INTAKE_MAX_BYTES = env_int("QUEUE_INTAKE_MAX_BYTES", 16 * 1024 * 1024)
QUEUE_INTAKE_UNREAD_BYTES = env_int("QUEUE_INTAKE_UNREAD_BYTES", 1024 * 1024)
# How often each consuming worker measures every stream and opens or closes the gates (a thread of its
# own, one round trip per look); a writer's overshoot past a cap is about its rate times this.
QUEUE_INTAKE_WATCH_SECONDS = env_float("QUEUE_INTAKE_WATCH_SECONDS", 0.05)
# Entries one consumer reads per XREADGROUP (stored in one statement), and how long a read blocks.
QUEUE_INTAKE_BATCH = env_int("QUEUE_INTAKE_BATCH", 500)
QUEUE_INTAKE_BLOCK_SECONDS = env_float("QUEUE_INTAKE_BLOCK_SECONDS", 0.2)
# An entry read but not acknowledged for this long (its consumer died or hangs) is claimed by another
# consumer (XAUTOCLAIM) and processed again: idempotent by its entry id.
QUEUE_INTAKE_RECLAIM_SECONDS = env_float("QUEUE_INTAKE_RECLAIM_SECONDS", 30.0)
# A consumer that has not said it is alive for this long is not: the smaller cap applies.
QUEUE_CONSUMER_TIMEOUT_SECONDS = env_float("QUEUE_CONSUMER_TIMEOUT_SECONDS", 5.0)
# An entry larger than this (its field names and values, and 64 bytes a field) is never read whole:
# the consumer keeps a copy of its first QUEUE_DEAD_LETTER_BYTES and dead-letters it (request_too_large).
QUEUE_INTAKE_ENTRY_MAX_BYTES = env_int("QUEUE_INTAKE_ENTRY_MAX_BYTES", 1024 * 1024)
# An app's dead-letter stream `sbq:<APPNAME>:dead` holds at most this many bytes: the oldest dead
# letters are trimmed (messaging.intake.stream.dead_letters); and a dead letter keeps at most this much
# of its entry's fields (a copy of the first ones, with `truncated` saying what was left out).
QUEUE_DEAD_MAX_BYTES = env_int("QUEUE_DEAD_MAX_BYTES", 4 * 1024 * 1024)
QUEUE_DEAD_LETTER_BYTES = env_int("QUEUE_DEAD_LETTER_BYTES", 4096)
# Beat: the ACL users re-applied from Postgres (a restarted Redis has none) and the gates set, also
# from a worker that is not consuming (routed to the outbound worker: it runs when no routing worker does).
QUEUE_SYNC_SECONDS = env_float("QUEUE_SYNC_SECONDS", 2.0)

QUEUE_BEAT_SCHEDULE: dict[str, dict] = {
    "queue-intake-sync": {"task": "messaging.tasks.queue_intake_sync", "schedule": QUEUE_SYNC_SECONDS,
                          "options": {"expires": QUEUE_SYNC_SECONDS}},
}
QUEUE_TASK_ROUTES: dict[str, dict] = {"messaging.tasks.queue_intake_sync": {"queue": "forwarding"}}
