"""The hand-over between the REST intake (web nodes) and the engine (`manage.py eventsource`): one
Redis stream per app. The intake appends event lines in batches; the engine reads them as another
source of the same sequence (a sequence number it has already applied or holds is a duplicate)."""

from __future__ import annotations

from foundation.transport.redis_clients import pubsub_namespace


def intake_stream_key(app_id: int) -> str:
    """The app's intake stream (namespaced by the Redis database, as pub/sub names are)."""
    return f"sb:x:{pubsub_namespace()}{app_id}:intake"


def intake_reader_key(app_id: int) -> str:
    """Present while the app's eventsource reads its intake stream (refreshed at every read, it
    expires INTAKE_READER_TTL seconds after the last)."""
    return f"sb:x:{pubsub_namespace()}{app_id}:intake:reader"


INTAKE_READER_TTL = 10
