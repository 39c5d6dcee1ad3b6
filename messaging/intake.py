"""A web node's intake: the RELIABLE messages its connections send, stored together.

What senders hand in within INTAKE_LINGER_SECONDS (and whatever arrives while a store runs) is
stored with one statement (messaging.store: group commit), and each sender is answered with its
own message's result once that statement has committed. Nothing is acknowledged before it is
durable.

The node gives the intake its routing batcher (`route`) when it builds it: the committed
deliveries of a batch go there, and from there to the workers through messaging.handoff.

The intake is bounded: past INTAKE_MAX_PENDING waiting sends, `submit` refuses at once with
`BatcherFull` (a node whose database falls behind tells its senders, instead of queueing without
limit).
"""

from __future__ import annotations

from django.conf import settings
from django.db import DataError, IntegrityError

from messaging.batching import Batcher
from messaging.handoff import Route
from messaging.store import OutgoingMessage, SendResult, messages_store


class Intake:
    def __init__(self, *, route: Route) -> None:
        self.route = route
        self.batcher = Batcher("intake", self._store, linger=settings.INTAKE_LINGER_SECONDS, max_size=500,
                               max_pending=settings.INTAKE_MAX_PENDING)

    async def submit(self, message: OutgoingMessage) -> SendResult:
        """Store `message` with whatever else is waiting; its result once committed. Raises
        BatcherFull when the intake is full, or what the database refused this message for."""
        result = await self.batcher.submit(message)
        if isinstance(result, Exception):
            raise result
        return result

    def _store(self, messages: list[OutgoingMessage]) -> list[SendResult | Exception]:
        """The batch's flush (in a DB thread): one statement. A message the database refuses on its
        own account fails alone: the batch is retried one by one to find it."""
        try:
            return messages_store(messages=messages, route=self.route)
        except (DataError, IntegrityError) as exc:
            if len(messages) == 1:
                return [exc]
        results: list[SendResult | Exception] = []
        for message in messages:
            try:
                results.extend(messages_store(messages=[message], route=self.route))
            except (DataError, IntegrityError) as exc:
                results.append(exc)
        return results
