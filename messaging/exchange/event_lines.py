"""The REST intake: event lines checked for shape, then appended to the app's intake stream
(messaging.exchange.streams) for the engine (`manage.py eventsource`) to apply.

The intake is strict: the caller is a server, so one malformed line refuses the whole call (naming
its index) and nothing is appended. Sequencing is the engine's: it holds events after a gap and
ignores a sequence number it has already applied or holds, so a call retried after a timeout
changes nothing (idempotent by sequence number).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from foundation.transport.redis_clients import sync_client
from messaging.core.protocol import BIGINT_MAX, plain_int
from messaging.exchange.streams import intake_reader_key, intake_stream_key

KINDS = "FUBPS"
# How many `|`-separated fields each kind has: seq, kind, then from and to as the kind needs them.
FIELDS = {"F": 4, "U": 4, "B": 2, "P": 4, "S": 3}
LINE_MAX = 64  # 3 bigints, a letter and 3 bars fit in 62 characters


class EventLineError(ValueError):
    def __init__(self, index: int, reason: str):
        super().__init__(f"events[{index}]: {reason}")
        self.index = index
        self.reason = reason


def event_line_problem(line: str) -> str | None:
    """Why `line` is no event line `seq|kind|from|to` (from and to as the kind needs them), or None."""
    if len(line) > LINE_MAX:
        return f"longer than {LINE_MAX} characters"
    parts = line.split("|")
    if len(parts) < 2 or parts[1] not in FIELDS:
        return f"the kind (second field) must be one of {', '.join(KINDS)}"
    kind = parts[1]
    if len(parts) != FIELDS[kind]:
        return f"a {kind} event has {FIELDS[kind]} fields separated by '|'"
    seq = plain_int(parts[0], BIGINT_MAX)
    if seq is None or seq < 1:
        return "the sequence number must be a positive integer"
    if any(plain_int(user, BIGINT_MAX) is None for user in parts[2:]):
        return "user ids must be non-negative integers"
    return None


def event_lines_check(lines: list[str]) -> None:
    """Raise EventLineError for the first line that is no event line."""
    for index, line in enumerate(lines):
        problem = event_line_problem(line)
        if problem is not None:
            raise EventLineError(index, problem)


@dataclass(frozen=True)
class Appended:
    accepted: int
    entry_id: str  # the batch's entry in the app's intake stream


class IntakeFull(Exception):
    """The app's intake holds as much as it may: nothing was appended."""

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


# Appends the entry only while the stream (its memory, as Redis counts it) stays under the cap: the
# cap of a stream its app's eventsource reads (its reader key is fresh), a smaller one otherwise.
# Nothing is ever trimmed here: only the reader trims, up to what it has committed.
_APPEND_LUA = """
local reading = redis.call('EXISTS', KEYS[2]) == 1
local cap = tonumber(reading and ARGV[2] or ARGV[3])
local used = 0
if redis.call('EXISTS', KEYS[1]) == 1 then used = redis.call('MEMORY', 'USAGE', KEYS[1]) end
if used + string.len(ARGV[1]) > cap then return {reading and 1 or 0, used} end
return redis.call('XADD', KEYS[1], '*', 'lines', ARGV[1])
"""


def events_append(*, app_id: int, lines: list[str]) -> Appended:
    """Check `lines` and append them to the app's intake stream as one entry (field `lines`: the
    lines joined by "\\n"). Raises EventLineError (nothing appended) for a malformed line, and
    IntakeFull when the stream holds EXCHANGE_INTAKE_MAX_BYTES, or EXCHANGE_INTAKE_UNREAD_BYTES
    while no eventsource reads it: one app cannot fill the Redis every tenant shares."""
    event_lines_check(lines)
    payload = "\n".join(lines)
    answer = sync_client().eval(_APPEND_LUA, 2, intake_stream_key(app_id), intake_reader_key(app_id), payload,
                                settings.EXCHANGE_INTAKE_MAX_BYTES, settings.EXCHANGE_INTAKE_UNREAD_BYTES)
    if isinstance(answer, list):
        reading, used = answer
        if reading:
            raise IntakeFull(f"the app's event intake holds {used} bytes, its limit: its eventsource is behind; "
                             "send again shortly", retry_after=1)
        raise IntakeFull(f"no eventsource reads this app's events (start `manage.py eventsource --app <name>`); "
                         f"{used} bytes wait already, the limit while nothing reads", retry_after=30)
    return Appended(accepted=len(lines), entry_id=answer.decode() if isinstance(answer, bytes) else answer)
