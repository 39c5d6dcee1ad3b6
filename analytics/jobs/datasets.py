"""The lake's layout and the columns of every dataset, in one place for both sides: the exporter
writes them with pyarrow (analytics.services.lake), the Spark jobs read them (analytics.jobs.common).

Layout under ANALYTICS_LAKE:

    messages/day=YYYY-MM-DD/part-<run>-<n>.parquet         message metadata (never content), once each
    deliveries/day=YYYY-MM-DD/part-...                     delivery records that reached a final state
    presence_events/day=YYYY-MM-DD/part-...                connects and disconnects, once each
    sessions/day=YYYY-MM-DD/part-...                       closed sessions, once each, by day of their end
    deliveries_live/run=<run>/part-... + _SUCCESS          snapshot: every delivery not final yet (_SUCCESS
                                                           holds its time, written once all files are in)
    sessions_live/run=<run>/part-... + _SUCCESS            snapshot: every session not exported as closed
    _staging/run-<run>/...                                 an export's files before it commits (never read)
    _reports/<kind>/run-<run>/                             a job's result rows, loaded into the report tables

`day` is the UTC day of the dataset's `partition_by` column. Names starting with `_` are skipped
by Spark's and pyarrow's directory listings.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGING = "_staging"
REPORTS = "_reports"
SUCCESS = "_SUCCESS"
LIVE_RUN_PREFIX = "run="
DAY = "day"


@dataclass(frozen=True)
class Dataset:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, type): int64, string, bool or timestamp (UTC, microseconds)
    partition_by: str | None = None  # the timestamp column whose UTC day partitions the files
    live: bool = False  # a snapshot that each export replaces as a whole

    @property
    def column_names(self) -> list[str]:
        return [name for name, _ in self.columns]


_DELIVERY = (
    ("id", "int64"), ("message_id", "int64"), ("app_id", "int64"), ("app_name", "string"),
    ("feature", "string"),  # the message kind: direct, group or confirmation
    ("recipient", "string"), ("state", "string"), ("attempts", "int64"), ("last_error", "string"),
    ("created_at", "timestamp"), ("sent_at", "timestamp"), ("delivered_at", "timestamp"),
    ("dead_at", "timestamp"), ("expired_at", "timestamp"),
)
_SESSION = (
    ("connection_id", "string"), ("app_id", "int64"), ("app_name", "string"), ("user_id", "string"),
    ("node_id", "string"), ("domain", "string"), ("transport", "string"), ("acks", "bool"),
    ("connected_at", "timestamp"), ("disconnected_at", "timestamp"), ("close_reason", "string"),
)

MESSAGES = Dataset("messages", (
    ("id", "int64"), ("app_id", "int64"), ("app_name", "string"), ("sender", "string"), ("kind", "string"),
    ("confirmation_requested", "bool"), ("has_client_message_id", "bool"), ("origin_domain", "string"),
    ("content_bytes", "int64"), ("created_at", "timestamp"),
), partition_by="created_at")
DELIVERIES = Dataset("deliveries", _DELIVERY, partition_by="created_at")
DELIVERIES_LIVE = Dataset("deliveries_live", (*_DELIVERY, ("as_of", "timestamp")), live=True)
PRESENCE_EVENTS = Dataset("presence_events", (
    ("id", "int64"), ("kind", "string"), ("at", "timestamp"), ("connection_id", "string"), ("app_id", "int64"),
    ("app_name", "string"), ("user_id", "string"), ("node_id", "string"), ("domain", "string"),
    ("transport", "string"), ("connected_at", "timestamp"), ("close_reason", "string"),
), partition_by="at")
SESSIONS = Dataset("sessions", _SESSION, partition_by="disconnected_at")
SESSIONS_LIVE = Dataset("sessions_live", (*_SESSION, ("as_of", "timestamp")), live=True)

ALL = (MESSAGES, DELIVERIES, DELIVERIES_LIVE, PRESENCE_EVENTS, SESSIONS, SESSIONS_LIVE)


def live_run_dir(dataset: Dataset, run: int) -> str:
    return f"{dataset.name}/{LIVE_RUN_PREFIX}{run:08d}"


# --- what the jobs produce -----------------------------------------------------------------------
# One row per figure, loaded into analytics.models.ReportRow. app "" = all apps; subgroup "" = all.
RESULT_COLUMNS = (
    ("metric", "string"), ("grain", "string"), ("period", "timestamp"), ("app", "string"),
    ("subgroup", "string"), ("bucket", "string"), ("value", "double"),
)
MINUTE, HOUR, DAY_GRAIN, RANGE, SNAPSHOT = "minute", "hour", "day", "range", "snapshot"
# Which live snapshot a report read: period = its time, subgroup = the dataset, value = its run.
LIVE_SNAPSHOT = "live_snapshot"

# presence
CONCURRENT = "concurrent_connections"  # minute: the most connections open at once during the minute
PEAK_CONCURRENT = "peak_concurrent_connections"  # range
UNIQUE_USERS = "unique_users"  # day and range
SESSIONS_ENDED = "sessions_ended"  # range: sessions that ended in the range
SESSION_LENGTH = "session_length_seconds"  # range, buckets p50 / p90 / p99, of sessions that ended in the range
CONNECTS, DISCONNECTS = "connects", "disconnects"  # hour
TOP_USERS = "connected_seconds"  # range: the users with the most connected time, per app; bucket = user id
TOP_USERS_PER_APP = 10

# backlog
BACKLOG = "backlog_deliveries"  # snapshot: subgroup pending|dead, bucket = age bucket
OLDEST_PENDING = "oldest_pending_age_seconds"  # snapshot
LATENCY = "delivery_latency_ms"  # range, accepted -> delivered; subgroup = feature; buckets p50 / p90 / p99
DELIVERED = "delivered"  # range: deliveries accepted in the range and delivered
ATTEMPTS = "attempts"  # range: deliveries accepted in the range by attempts; subgroup = state, bucket = attempts
DEAD_LETTERS = "dead_letters"  # snapshot: bucket = last error (top errors per app)
DEAD_LETTER_ERRORS_PER_APP = 20

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
# (label, upper bound in seconds); the last has none.
AGE_BUCKETS = (("< 1 min", 60), ("1 min – 1 h", 3600), ("1 h – 1 day", 86400), ("1 – 7 days", 7 * 86400),
               ("> 7 days", None))
PENDING, DEAD = "pending", "dead"  # the backlog's two subgroups (pending = pending, sent or retrying)
