"""A recorded webhook call's first attempt, made at once by the process that recorded it, on its own
event loop (a web node's request to its app's server, messaging.requests): no hand-over, no worker,
no thread held while the receiver answers. The row was recorded under the claim the caller holds,
with a lease (messaging.webhooks.services), exactly as for a hand-over: the attempt's outcome is
recorded under that claim, in one transaction with what its answer means (the AnswerReader), and a
failed attempt is retried, and dead-lettered, by the webhook workers as any other (the sweep hands
it out once its backoff passes). A process that dies mid-call leaves the row to the sweep once the
lease runs out: the call is made again (at least once, as always).

A node makes at most REQUEST_INLINE_CALLS_PER_APP such calls of one app at once, the next ones
waiting for a slot; past REQUEST_INLINE_WAITING_PER_APP waiting (a receiver that slows down), they
are handed over to the workers (whose slots bound an app's calls across the cluster).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from foundation.asyncdb import run_db
from foundation.handoff import webhook_calls_hand_over
from foundation.outgoing import Answer, OutgoingError
from messaging.webhooks import metrics
from messaging.webhooks.delivery import (
    AnswerReader,
    Claimed,
    call_outcome,
    call_prepared,
    post,
    record_failed,
    records_delivered,
)
from messaging.webhooks.models import WebhookState

log = logging.getLogger(__name__)

_slots: dict[int, asyncio.Semaphore] = {}  # app -> its inline calls at once on this process's loop
_waiting: dict[int, int] = {}  # app -> calls waiting for one of those slots


@dataclass(frozen=True)
class InlineCall:
    delivery_id: str
    claim: int  # the claim it was recorded under (the caller's)
    call: Claimed


async def webhook_call_inline(item: InlineCall, reader: AnswerReader | None,
                              settle: Callable[[Attempted], Awaitable[str]]) -> str:
    """Make the call now (in one of its app's REQUEST_INLINE_CALLS_PER_APP slots here, waited for),
    or hand it over when REQUEST_INLINE_WAITING_PER_APP of its app's wait already: what became of
    it (delivered, retrying, dead, skipped, handed_over). `settle` records the attempt (the node's
    batcher of webhook_calls_settle: many calls' records in one transaction)."""
    app = item.call.app_id
    slots = _slots.setdefault(app, asyncio.Semaphore(settings.REQUEST_INLINE_CALLS_PER_APP))
    if slots.locked() and _waiting.get(app, 0) >= settings.REQUEST_INLINE_WAITING_PER_APP:
        await run_db(webhook_calls_hand_over, [item.delivery_id], item.claim)
        return "handed_over"
    _waiting[app] = _waiting.get(app, 0) + 1
    try:
        await slots.acquire()
    finally:
        _waiting[app] -= 1
    try:
        status, error, answer = await _attempt(item, reader)
    finally:
        slots.release()
    return await settle(Attempted(item, status, error, answer, reader))


async def _attempt(item: InlineCall, reader: AnswerReader | None) -> tuple[int | None, str, Answer | None]:
    prepared = call_prepared(item.call, item.delivery_id)
    if isinstance(prepared, str):
        return None, prepared, None
    body, headers = prepared
    deadline = settings.WEBHOOK_TIMEOUT_SECONDS
    try:
        # (the client keeps as many connections as there are slots: a busy receiver is not reconnected to)
        answer = await asyncio.wait_for(post(item.call.url, body, headers, deadline,
                                             reader.answer_bytes if reader else 200,
                                             keepalive=settings.REQUEST_INLINE_CALLS_PER_APP), deadline + 1)
    except (OutgoingError, TimeoutError) as exc:
        return None, str(exc)[:500] or "no answer", None
    return call_outcome(answer)


@dataclass(frozen=True)
class Attempted:
    """An inline call's attempt, to record (`webhook_calls_settle`)."""

    item: InlineCall
    status: int | None
    error: str
    answer: Answer | None
    reader: AnswerReader | None


def webhook_calls_settle(attempts: list[Attempted]) -> list[str]:
    """Record a batch of inline calls' attempts in one transaction (a web node's batcher): the
    delivered ones in one statement, with what their answers mean (each reader's `answered_many`);
    a failed one as any failed attempt (retried by the workers, or dead). What became of each."""
    with transaction.atomic():
        done = records_delivered([(a.item.delivery_id, a.item.claim, a.status) for a in attempts if not a.error])
        by_reader: dict[int, tuple[AnswerReader, list[tuple[dict, bytes, bool]]]] = {}
        outcomes = []
        for a in attempts:
            if not a.error:
                recorded = a.item.delivery_id in done
                outcomes.append(WebhookState.DELIVERED.value if recorded else "skipped")
                if recorded and a.reader is not None and a.answer is not None:
                    by_reader.setdefault(id(a.reader), (a.reader, []))[1].append(
                        (a.item.call.payload, a.answer.body, a.answer.complete))
                continue
            state = record_failed(a.item.delivery_id, a.item.claim, a.status, a.error)
            if state == WebhookState.DEAD and a.reader is not None:
                a.reader.dead(payload=a.item.call.payload, error=a.error)
            outcomes.append(state or "skipped")
        for reader, answered in by_reader.values():
            reader.answered_many(answered)
    for a, outcome in zip(attempts, outcomes, strict=True):
        if outcome != "skipped":
            metrics.WEBHOOKS.labels(a.item.call.event, "failed" if outcome == WebhookState.RETRYING else outcome).inc()
    return outcomes
