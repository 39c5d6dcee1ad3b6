"""A web node's intake: the RELIABLE messages its connections send, stored together.

What senders hand in within INTAKE_LINGER_SECONDS (and whatever arrives while a store runs) is
stored with one statement (messaging.core.store: group commit), and each sender is answered with its
own message's result once that statement has committed. Nothing is acknowledged before it is
durable.

The node gives the intake its routing batcher (`route`) when it builds it: the committed
deliveries of a batch go there, and from there to the workers through foundation.handoff.

The intake is bounded: past INTAKE_MAX_PENDING waiting sends, `submit` refuses at once with
`BatcherFull` (a node whose database falls behind tells its senders, instead of queueing without
limit).

A server's send (the REST API's, messaging.api.send_endpoint) may come under an idempotency key
(`KeyedSend`): its key is claimed, with its answer (the message's id drawn by the claim), in the
same transaction as the batch's messages, so the key, the message and the answer commit together
or not at all, and a key is written once. Its result
is the new message's, or the answer stored the first time (`Replayed`), or IdempotencyConflict
raised to its sender. A key twice in one batch is one message: the second place is answered as a
replay of the first. A batch without keys is one statement in autocommit, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, OperationalError, connection, transaction
from psycopg.errors import DeadlockDetected, SerializationFailure

from foundation.handoff import Route
from messaging.core.idempotency import IdempotencyConflict, header_reused, idempotency_claims_many
from messaging.core.store import OutgoingMessage, SendResult, messages_store
from messaging.intake.batching import Batcher

log = logging.getLogger(__name__)

STORE_ATTEMPTS = 3  # a batch the database ended as a deadlock's victim is stored again, whole


@dataclass(frozen=True)
class KeyedSend:
    """A RELIABLE send under an idempotency key of its app: `answer` is the body its sender is
    answered with (201), but for its `id`, which the store gives."""

    message: OutgoingMessage
    key: str
    fingerprint: str
    answer: dict[str, Any]

    def answered(self, message_id: int) -> dict[str, Any]:
        return {"id": str(message_id), **self.answer}


@dataclass(frozen=True)
class Replayed:
    """A keyed send's key was claimed before, for the same request: the answer stored then."""

    status: int
    body: dict[str, Any]


Item = OutgoingMessage | KeyedSend
Result = SendResult | Replayed | Exception


class Intake:
    def __init__(self, *, route: Route) -> None:
        self.route = route
        self.batcher = Batcher("intake", self._store, linger=settings.INTAKE_LINGER_SECONDS, max_size=500,
                               max_pending=settings.INTAKE_MAX_PENDING)

    async def submit(self, item: Item) -> SendResult | Replayed:
        """Store `item` with whatever else is waiting; its result once committed. Raises
        BatcherFull when the intake is full, IdempotencyConflict for a keyed send whose key was used
        for another request, or what the database refused this message for."""
        result = await self.batcher.submit(item)
        if isinstance(result, Exception):
            raise result
        return result

    def _store(self, items: list[Item]) -> list[Result]:
        """The batch's flush (in a DB thread): one statement (and, with keys, one transaction). A
        message the database refuses on its own account fails alone: the batch is retried one by
        one to find it."""
        _connection_checked()
        try:
            return self._store_again_if_deadlocked(items)
        except (DataError, IntegrityError) as exc:
            if len(items) == 1:
                return [exc]
        results: list[Result] = []
        for item in items:
            try:
                results.extend(self._store_again_if_deadlocked([item]))
            except (DataError, IntegrityError) as exc:
                results.append(exc)
        return results

    def _store_again_if_deadlocked(self, items: list[Item]) -> list[Result]:
        """`_store_batch`, again (at most STORE_ATTEMPTS in all) when Postgres ended its transaction as
        a deadlock's victim or a serialization failure: nothing of it was stored, and nothing is wrong
        with its messages (a hand-back holding the standby feed's table while it took a mailbox's row,
        once, made every sender of that batch a GENERAL_ERROR)."""
        for attempt in range(1, STORE_ATTEMPTS + 1):
            try:
                return self._store_batch(items)
            except OperationalError as exc:
                if attempt == STORE_ATTEMPTS or not isinstance(exc.__cause__, (DeadlockDetected, SerializationFailure)):
                    raise
                log.warning("a batch of %d message(s) ended as a deadlock's victim; storing it again (%s)",
                            len(items), type(exc.__cause__).__name__)
        raise AssertionError("unreachable")

    def _store_batch(self, items: list[Item]) -> list[Result]:
        if not any(isinstance(item, KeyedSend) for item in items):
            return list(messages_store(messages=items, route=self.route))
        first: dict[tuple[int, str], int] = {}  # each key's first place in the batch
        for i, item in enumerate(items):
            if isinstance(item, KeyedSend):
                first.setdefault((item.message.app_id, item.key), i)
        results: list[Result | None] = [None] * len(items)
        firsts = list(first.items())
        with transaction.atomic():
            claims = idempotency_claims_many([(a, k, items[i].fingerprint) for (a, k), i in firsts],
                                             reused=header_reused, answers=[items[i].answer for _, i in firsts])
            to_store: list[OutgoingMessage] = []
            places: list[int] = []
            for i, item in enumerate(items):
                if not isinstance(item, KeyedSend):
                    to_store.append(item)
                    places.append(i)
                    continue
                if first[item.message.app_id, item.key] != i:
                    continue  # answered as its key's first place, below
                claim = claims[item.message.app_id, item.key]
                if claim.conflict is not None:
                    results[i] = claim.conflict
                elif claim.new is None:
                    results[i] = Replayed(claim.status or 201, claim.answer or {})
                else:  # stored under the id its claim's answer names
                    to_store.append(replace(item.message, message_id=claim.message_id))
                    places.append(i)
            for i, result in zip(places, messages_store(messages=to_store, route=self.route), strict=True):
                results[i] = result
        for i, item in enumerate(items):
            if results[i] is None:  # a key's later place: the same request, or another one
                assert isinstance(item, KeyedSend)
                j = first[item.message.app_id, item.key]
                results[i] = _again(items[j], results[j], item)
        return results  # type: ignore[return-value]


_thread = threading.local()


def _connection_checked() -> None:
    """Before a batch, on a pooled thread whose connection has been idle over
    INTAKE_IDLE_CHECK_SECONDS: SELECT 1, and a new connection if that fails. A connection that
    Postgres dropped while it sat idle (a restart) would otherwise fail the next batch, answering
    every sender in it "unavailable" once Postgres is back. Under load no connection is idle that
    long: no check is made. (A failed batch is not simply retried: a failure at its commit may have
    committed it.)"""
    now = time.monotonic()
    idle = now - getattr(_thread, "used", now)
    _thread.used = now
    if connection.connection is not None and idle > settings.INTAKE_IDLE_CHECK_SECONDS and not connection.is_usable():
        connection.close()


def _again(first: KeyedSend, first_result: Result | None, item: KeyedSend) -> Result:
    """A keyed send whose key came earlier in the same batch."""
    if item.fingerprint != first.fingerprint:
        return header_reused(item.key)
    if isinstance(first_result, SendResult):
        return Replayed(201, first.answered(first_result.message_id))
    if isinstance(first_result, (Replayed, IdempotencyConflict)):
        return first_result
    return IdempotencyConflict("idempotency_key_in_progress", f"a request with the idempotency key "
                                                              f"'{item.key}' is in progress; retry later")
