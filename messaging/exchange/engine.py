"""The exchange engine: pure (no sockets, no database), one per app.

Events arrive in any order; the engine holds back those beyond a gap and applies them strictly in
sequence from `applied_seq + 1`. Applying an event changes the in-memory follow graph and names its
recipients among the users connected *at that moment* (absent users' notifications are dropped, the
graph still changes). Applied events collect in a pending batch that the caller takes with
`batch_take()`, commits (messaging.exchange.store) and only then delivers: see `Batch`.

Gap policy: a gap (the first missing number, with later events held behind it) is reported after
`gap_report_seconds` (log, metric, ExchangeState.gap_seq/gap_since/held); after
`gap_timeout_seconds` (0 = never) the missing numbers are given up: counted in `skipped`, and the
held events applied in order. We chose to skip rather than wait forever because one lost line would
otherwise stop the whole app's exchange; a number that arrives after it was skipped is a duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# An event: (seq, kind, from, to, raw line bytes including its line end).
Event = tuple[int, str, "int | None", "int | None", bytes]
# Recipients: None = every connected user (a broadcast), else the user ids.
Recipients = "frozenset[int] | set[int] | tuple[int, ...] | None"

_ARITY = {"F": 4, "U": 4, "P": 4, "B": 2, "S": 3}
_NOBODY: tuple[int, ...] = ()


_BIGINT_MAX = 2**63 - 1  # sequence numbers and user ids are stored as Postgres bigints
_BIGINT_DIGITS = len(str(_BIGINT_MAX))


def _number(field: bytes) -> int | None:
    """A whole number 0..2**63-1 in plain ASCII digits (int() would also take ' 5', '+5', '5_0', or
    a number no bigint holds, which would end the commit that stores it), or None."""
    if not field.isdigit() or len(field) > _BIGINT_DIGITS:  # bytes.isdigit: ASCII digits only
        return None
    number = int(field)
    return number if number <= _BIGINT_MAX else None


def line_parse(raw: bytes) -> Event | None:
    """`seq|type|from|to` (fields as the type needs them) -> an Event, or None if malformed: the same
    rules as the REST intake's (messaging.exchange.event_lines.event_line_problem)."""
    parts = raw.rstrip(b"\r\n").split(b"|")
    if len(parts) < 2:
        return None
    try:
        kind = parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    if _ARITY.get(kind) != len(parts):
        return None
    numbers = [_number(field) for field in (parts[0], *parts[2:])]
    if None in numbers or numbers[0] < 1:
        return None
    seq, frm, to = numbers[0], (numbers[1] if len(numbers) > 1 else None), (numbers[2] if len(numbers) > 2 else None)
    return (seq, kind, frm, to, raw)


@dataclass
class Batch:
    """Events applied since the last batch, in order, each with its recipients, and the net graph
    change they imply. The caller commits `adds`/`removes` with `applied_seq` in one transaction
    and writes the notifications only after that commit: so after a crash the durable graph is
    exactly the one implied by the notifications delivered (none of an uncommitted batch went out),
    and the restarted engine resumes at `applied_seq + 1`."""

    applied_seq: int
    events: list[tuple[Event, Recipients]] = field(default_factory=list)
    adds: list[tuple[int, int]] = field(default_factory=list)  # (follower, followee)
    removes: list[tuple[int, int]] = field(default_factory=list)
    skipped: int = 0
    duplicates: int = 0


class Engine:
    def __init__(self, *, applied_seq: int = 0, followers: dict[int, set[int]] | None = None,
                 connected: set[int] | None = None, gap_report_seconds: float = 5.0,
                 gap_timeout_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.applied_seq = applied_seq
        self.followers: dict[int, set[int]] = followers if followers is not None else {}
        # Shared with the adapter: it adds and removes users as clients come and go.
        self.connected: set[int] = connected if connected is not None else set()
        self.gap_report_seconds = gap_report_seconds
        self.gap_timeout_seconds = gap_timeout_seconds
        self.clock = clock
        self.held: dict[int, Event] = {}
        self.gap_seq: int | None = None
        self.gap_since: float | None = None
        self.gap_reported = False
        self._pending: list[tuple[Event, Recipients]] = []
        self._changes: dict[tuple[int, int], bool] = {}  # (follower, followee) -> follows after the batch
        self._skipped = 0
        self._duplicates = 0

    # --- intake ---
    def offer(self, event: Event) -> None:
        """Take one event: apply it (and whatever it unblocks) or hold it behind the gap."""
        seq = event[0]
        applied = self.applied_seq
        if seq == applied + 1:
            self._apply(event)
            if self.held:
                self._drain()
        elif seq <= applied or seq in self.held:
            self._duplicates += 1
            return
        else:
            self.held[seq] = event
        if self.held:
            if self.gap_seq != self.applied_seq + 1:
                self._gap_open()
        elif self.gap_seq is not None:
            self._gap_close()

    def offer_many(self, events: Iterable[Event]) -> None:
        for event in events:
            self.offer(event)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def batch_empty(self) -> bool:
        """Nothing applied or skipped since the last batch was taken."""
        return not self._pending and not self._skipped

    def batch_return(self, batch: Batch) -> None:
        """A taken batch whose commit failed, put back before what was applied since: the next
        commit carries both (the later change of a follow pair wins)."""
        self._pending = batch.events + self._pending
        changes = {pair: True for pair in batch.adds} | {pair: False for pair in batch.removes}
        changes.update(self._changes)
        self._changes = changes
        self._skipped += batch.skipped
        self._duplicates += batch.duplicates

    def batch_take(self) -> Batch:
        """The applied events since the last call (see Batch), and a fresh batch begins."""
        changes = self._changes
        batch = Batch(applied_seq=self.applied_seq, events=self._pending,
                      adds=[pair for pair, on in changes.items() if on],
                      removes=[pair for pair, on in changes.items() if not on],
                      skipped=self._skipped, duplicates=self._duplicates)
        self._pending, self._changes, self._skipped, self._duplicates = [], {}, 0, 0
        return batch

    # --- gaps ---
    def tick(self, now: float | None = None) -> bool:
        """Report a gap that has lasted, give it up after the timeout; True if the gap state changed
        (so the caller persists the report or commits what the skip applied)."""
        if self.gap_seq is None or self.gap_since is None:
            return False
        now = self.clock() if now is None else now
        waited = now - self.gap_since
        timeout = self.gap_timeout_seconds
        if timeout > 0 and waited >= timeout:
            first_held = min(self.held)
            missing = first_held - self.applied_seq - 1
            log.warning("exchange: giving up sequence numbers %s..%s after %.0fs; applying %s held events",
                        self.applied_seq + 1, first_held - 1, waited, len(self.held))
            self._skipped += missing
            self.applied_seq = first_held - 1
            self._drain()
            if self.held:
                self._gap_open(now)
            else:
                self._gap_close()
            return True
        if not self.gap_reported and waited >= self.gap_report_seconds:
            self.gap_reported = True
            log.warning("exchange: sequence number %s missing for %.0fs; %s events held behind it",
                        self.gap_seq, waited, len(self.held))
            return True
        return False

    def _gap_open(self, now: float | None = None) -> None:
        self.gap_seq = self.applied_seq + 1
        self.gap_since = self.clock() if now is None else now
        self.gap_reported = False

    def _gap_close(self) -> None:
        self.gap_seq = self.gap_since = None
        self.gap_reported = False

    # --- applying ---
    def _drain(self) -> None:
        held = self.held
        nxt = self.applied_seq + 1
        while nxt in held:
            self._apply(held.pop(nxt))
            nxt += 1

    def _apply(self, event: Event) -> None:
        self.applied_seq = event[0]
        kind = event[1]
        connected = self.connected
        if kind == "B":
            recipients: Recipients = None
        elif kind == "P":
            recipients = (event[3],) if event[3] in connected else _NOBODY
        elif kind == "S":
            fans = self.followers.get(event[2])
            recipients = (fans & connected) if fans else _NOBODY
        elif kind == "F":
            frm, to = event[2], event[3]
            fans = self.followers.get(to)
            if fans is None:
                fans = self.followers[to] = set()
            fans.add(frm)
            self._changes[(frm, to)] = True
            recipients = (to,) if to in connected else _NOBODY
        else:  # "U"
            frm, to = event[2], event[3]
            fans = self.followers.get(to)
            if fans is not None:
                fans.discard(frm)
            self._changes[(frm, to)] = False
            recipients = _NOBODY
        self._pending.append((event, recipients))
