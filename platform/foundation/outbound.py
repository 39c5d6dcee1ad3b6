"""Sending work out: the one skeleton every sender of the platform runs on, its give-up rule and its
claim tokens (its lock is foundation.locks', its backoff foundation.backoff's).

A sender takes rows it owns from a table and hands them to something outside this process that may
be slow, down or refusing: a neighbouring domain (the link, flood and receipt senders of
messaging.federation) or a tenant's receiver (messaging.webhooks). Each is a `Sender`, which brings
only its SQL and its payload; `send_batches` runs the steps, the same for all of them:

1. **one at a time** (foundation.locks' `one_at_a_time`, where the sender names a key): a second
   sender of the same key returns at once (`busy`). A link's queue must leave in order: two senders posting overlapping
   batches could let the neighbour store a recipient's later messages before its earlier ones;
2. **held back?** the sender's own backoff says "not yet" (a link that failed is retried at its
   `retry_at`): nothing is taken (`held back`). Asked once per run: a run stops at its first
   failure, so after a call that was answered nothing of its own can hold it back;
3. **take a batch**, bounded by rows and by bytes (`Limits`): a backlog of large messages never
   becomes one call the other side refuses for its size;
4. **send**: one call, which must answer within its deadline (foundation.outgoing: a deadline for
   the whole exchange, an answer read up to a cap);
5. **settle** what was answered, or **fail** the batch: a failure counts an attempt on every item,
   and those out of attempts (`out_of_attempts`) are dead-lettered with the reason the call gave.
   Items refused before any call (the sender's own rules, such as a hop limit) die with their reason.

Then the next batch, until the queue is empty or a call fails. A batch its sender took as the
whole queue (`Batch.drained`) ends the run once it is settled (unless the settling left items to go
again at once, `Settled.again`), without a look at an empty queue:
what is queued after the take has a wake-up of its own (foundation.handoff clears a sender's wake-up
mark when its run starts, so a row committed after that wakes a run that starts after it). The sender
decides where a retry is scheduled (its `Backoff`, foundation.backoff: the link's retry time, or the
row's next attempt) and what "dead" means for its rows; the skeleton decides when each step happens,
so a retry and a give-up are recorded the same way everywhere.

**The lock** is foundation.locks' `one_at_a_time` (a transaction-level advisory lock on a
connection kept for locks, so it never outlives its work), free between batches.

This module imports no app: foundation is below every layer.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import Counter

from foundation.locks import one_at_a_time
from foundation.metrics import REGISTRY

log = logging.getLogger(__name__)

SENT = Counter(
    "switchboard_outbound_items_total",
    "Items senders handed out, by sender and outcome (sent, refused, failed, dead)",
    ["sender", "outcome"], registry=REGISTRY,
)


# --- claim tokens ---------------------------------------------------------------------------------


def claim_token() -> int:
    """A fresh claim token: 63 random bits (fits a bigint, never collides in practice). A row handed
    out under a token is acted on only by statements that name it, so a late or duplicate worker
    finds nothing to do."""
    return secrets.randbits(63)


# --- give-up -------------------------------------------------------------------------------------


def out_of_attempts(attempts: str, max_attempts: str) -> str:
    """SQL: true when an item whose failed attempts now number `attempts` is to be dead-lettered
    (the one give-up rule: every sender's failure statement uses it)."""
    return f"(({attempts}) >= ({max_attempts}))"


# --- the skeleton ---------------------------------------------------------------------------------

Item = TypeVar("Item")


@dataclass(frozen=True)
class Limits:
    """How much one call may carry: at most `rows` items and, past the first item, at most `bytes`
    of payload (an item larger than `bytes` still goes, alone)."""

    rows: int
    bytes: int

    def cut(self, sizes: Sequence[int]) -> int:
        """How many of the items, of these sizes, in order, one call takes."""
        total = 0
        for n, size in enumerate(sizes[:max(1, self.rows)]):
            if n and total + size > self.bytes:
                return n
            total += size
        return min(len(sizes), max(1, self.rows))

    def drained(self, *, fetched: int, kept: int) -> bool:
        """Whether a take that found `fetched` rows at the head of its queue (at most `rows`) and
        kept `kept` of them for the call saw the whole queue."""
        return fetched < max(1, self.rows) and kept == fetched


def head_sql(inner: str) -> str:
    """The head of a queue within a call's `Limits`, in SQL. `inner` selects the queue's rows in
    order with `size`, `running` (the running total of the sizes) and `n` (their row number), LIMIT
    %(rows)s; this keeps those within %(bytes)s (the first always, so a row larger than the limit
    goes alone), in order, and adds a last column, how many rows `inner` found (Limits.drained)."""
    return (f"WITH q AS ({inner}) SELECT q.*, (SELECT count(*) FROM q) AS fetched FROM q"
            " WHERE q.running <= %(bytes)s OR q.n = 1 ORDER BY q.n")


@dataclass
class Batch(Generic[Item]):
    items: list[Item]
    # Given up on before any call, with the reason (the sender's own rules: a hop limit).
    refused: list[tuple[Item, str]] = field(default_factory=list)
    # The take saw the whole queue (nothing was left behind the batch): the run ends once it is
    # settled. False where the sender cannot tell: the run looks again.
    drained: bool = False


@dataclass(frozen=True)
class Settled:
    sent: int = 0  # taken by the other side (stored, or already had)
    refused: int = 0  # refused by the other side item by item: dead with its reason
    again: bool = False  # some items stay queued to go again at once: the run looks again


@dataclass(frozen=True)
class Failed:
    failed: int  # an attempt counted
    dead: int = 0  # ... of which out of attempts, dead-lettered
    retry_at: Any = None  # when the sender tries again (for the log)


class CallFailed(Exception):
    """The call produced no answer the items can be settled by; `reason` says why, fit for an
    operator (it is kept on every item as its last error)."""

    def __init__(self, reason: str, status: int | None = None):
        super().__init__(reason)
        self.reason = reason[:500]
        self.status = status


class NotNow(Exception):
    """The sender cannot send this batch now and has not tried (its tenant's calls are at their
    cap): the items go back, no attempt counted."""


class Sender(Protocol[Item]):
    name: str  # for logs and metrics: "link", "flood", "receipts", "webhook"
    lock_key: str | None  # None: the batch is owned by a claim instead

    def limits(self) -> Limits: ...

    def held_back(self) -> bool: ...

    def take(self, limits: Limits) -> Batch[Item]: ...

    def send(self, batch: Batch[Item]) -> Any: ...

    def settle(self, batch: Batch[Item], answer: Any) -> Settled: ...

    def fail(self, batch: Batch[Item], error: CallFailed) -> Failed: ...

    def give_up(self, refused: list[tuple[Item, str]]) -> int: ...

    def put_back(self, batch: Batch[Item]) -> None: ...


@dataclass
class Outcome:
    sender: str
    key: str | None
    sent: int = 0
    refused: int = 0  # by the other side, or by the sender's rules before a call: dead
    failed: int = 0  # in a call that failed: an attempt counted
    dead: int = 0  # of those, out of attempts
    calls: int = 0
    skipped: str = ""  # why nothing (more) was tried: "busy", "held back", "not now", "budget", "more than one call"
    error: str = ""

    def as_dict(self) -> dict:
        return {"sent": self.sent, "refused": self.refused, "failed": self.failed, "dead": self.dead,
                "calls": self.calls, "skipped": self.skipped, "error": self.error}


@contextmanager
def _no_lock() -> Iterator[bool]:
    yield True


def send_batches(sender: Sender, *, max_batches: int | None = None, budget_seconds: float | None = None,
                 whole: bool = False) -> Outcome:
    """Run `sender` through the skeleton's steps (the module docstring) until its queue is empty,
    a call fails, it is held back, `max_batches` calls were made, or `budget_seconds` have passed
    (`skipped` "budget": more may wait; the caller hands the rest to a new run, so a long queue never
    holds one worker thread for longer than that and a call's deadline). `whole`: a batch goes only
    if it is the whole queue (`Batch.drained`); a take that is not ends the run before any call
    (`skipped` "more than one call": a hand-back's last call, which must leave nothing behind)."""
    outcome = Outcome(sender.name, sender.lock_key)
    limits = sender.limits()
    started = time.monotonic()
    asked = False  # held_back() is asked once per run
    while max_batches is None or outcome.calls < max_batches:
        if budget_seconds is not None and outcome.calls and time.monotonic() - started >= budget_seconds:
            outcome.skipped = "budget"
            return outcome
        with (one_at_a_time(sender.lock_key) if sender.lock_key else _no_lock()) as held:
            if not held:
                outcome.skipped = "busy"
                return outcome
            if not asked:
                asked = True
                if sender.held_back():
                    outcome.skipped = "held back"
                    return outcome
            batch = sender.take(limits)
            if whole and batch.items and not batch.drained:
                outcome.skipped = "more than one call"
                return outcome
            if batch.refused:
                given_up = sender.give_up(batch.refused)
                outcome.refused += given_up
                SENT.labels(sender.name, "refused").inc(given_up)
            if not batch.items:
                if batch.refused:
                    continue
                return outcome
            outcome.calls += 1
            try:
                answer = sender.send(batch)
            except NotNow as exc:
                sender.put_back(batch)
                outcome.skipped, outcome.error = "not now", str(exc)
                return outcome
            except CallFailed as exc:
                failed = sender.fail(batch, exc)
                outcome.failed += failed.failed - failed.dead
                outcome.dead += failed.dead
                outcome.error = exc.reason
                SENT.labels(sender.name, "failed").inc(failed.failed - failed.dead)
                SENT.labels(sender.name, "dead").inc(failed.dead)
                log.warning("%s sender %s: %s (%d items, %d now dead; next try %s)", sender.name,
                            sender.lock_key or "", exc.reason, len(batch.items), failed.dead, failed.retry_at)
                return outcome
            settled = sender.settle(batch, answer)
            outcome.sent += settled.sent
            outcome.refused += settled.refused
            SENT.labels(sender.name, "sent").inc(settled.sent)
            SENT.labels(sender.name, "refused").inc(settled.refused)
            if batch.drained and not settled.again:
                return outcome
        # The lock is free between batches: rows queued while it was held (their wake-up found
        # this sender busy) are in the next take.
    return outcome
