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
from messaging.exchange.streams import intake_stream_key
from messaging.protocol import BIGINT_MAX, plain_int

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


def events_append(*, app_id: int, lines: list[str]) -> Appended:
    """Check `lines` and append them to the app's intake stream as one entry (field `lines`: the
    lines joined by "\\n"). Raises EventLineError (nothing appended) for a malformed line."""
    event_lines_check(lines)
    entry_id = sync_client().xadd(intake_stream_key(app_id), {"lines": "\n".join(lines)},
                                  maxlen=settings.EXCHANGE_INTAKE_STREAM_MAXLEN, approximate=True)
    return Appended(accepted=len(lines), entry_id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id)
