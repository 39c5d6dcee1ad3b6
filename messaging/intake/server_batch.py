"""Many server sends in one call (`POST /api/v1/messages/batch`): each message checked, accepted or
refused on its own, and every accepted RELIABLE one stored in one statement, in one transaction
with the idempotency keys the messages carry.

- Each message is checked by the rules of a single send (messaging.intake.server_sends); a refused one
  gets `{error, detail}` in its place, with the code a single send would answer, and the others go.
- A message's `idempotencyKey` is the app's, as a single send's `Idempotency-Key` header is: the
  first time, the message is sent and its answer stored with the key; again with the same message,
  the stored answer comes back and nothing is sent; with another message, `idempotency_key_reused`.
  A key twice in one batch is the same message twice: it is sent once and both places answer.
- The claims, the messages and the stored answers commit together, or none of them does: a batch
  that fails leaves its keys free for the retry. Routing starts once the transaction commits.
- FAST messages are pushed when their turn comes (never stored), and answer `{"id": null,
  "feature": "FAST", "connections": n}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from apps_registry.selectors import AppSnapshot
from messaging.core.accept import SendRefused
from messaging.core.idempotency import (
    Claim,
    IdempotencyConflict,
    idempotency_answers_store,
    idempotency_claims,
    key_reused,
)
from messaging.core.protocol import FEATURE_FAST
from messaging.core.store import messages_store
from messaging.intake.server_sends import CheckedSend, server_fast_push, server_message_check

Result = dict[str, Any]


@dataclass(frozen=True)
class BatchItem:
    """One message of a batch as the API parsed it, or the refusal of its parsing."""

    fields: dict[str, Any] | None  # server_message_check's keyword arguments
    key: str | None = None  # its idempotencyKey
    fingerprint: str = ""  # what makes two messages with one key the same message
    refused: Result | None = None  # {error, detail}: it could not even be read


def server_messages_send_batch(*, app: AppSnapshot, items: list[BatchItem]) -> list[Result]:
    """A result per item, in order: `{id}` (stored), FAST's answer, or `{error, detail}`."""
    results: list[Result | None] = [item.refused for item in items]
    checked: dict[int, CheckedSend] = {}
    for i, item in enumerate(items):
        if item.refused is None:
            try:
                checked[i] = server_message_check(app=app, **item.fields)
            except SendRefused as exc:
                results[i] = {"error": exc.code, "detail": exc.detail, **exc.extra}
    first_of: dict[str, int] = {}  # a key's first message in this batch: the others with it answer as it does
    keyed: dict[str, str] = {}
    for i in checked:
        key = items[i].key
        if key is None:
            continue
        if key not in keyed:
            keyed[key], first_of[key] = items[i].fingerprint, i
        elif keyed[key] != items[i].fingerprint:
            results[i] = _refusal(key_reused(key))
    with transaction.atomic():
        claims = idempotency_claims(app_id=app.pk, keyed=keyed)
        to_store: list[int] = []
        for i, send in checked.items():
            if results[i] is not None:
                continue
            key = items[i].key
            claim = claims.get(key) if key is not None else None
            if key is not None and first_of[key] != i:
                continue  # answered as its key's first message, below
            if claim is not None and claim.new is None:
                results[i] = _replayed(claim)
            elif send.feature == FEATURE_FAST:
                results[i] = {"id": None, "feature": FEATURE_FAST, "connections": server_fast_push(app, send.message)}
            else:
                to_store.append(i)
        stored = messages_store(messages=[checked[i].message for i in to_store])  # one statement
        for i, result in zip(to_store, stored, strict=True):
            results[i] = {"id": str(result.message_id)} | ({"duplicate": True} if result.duplicate else {})
        idempotency_answers_store([(claims[key].new, results[i]) for key, i in first_of.items()
                                   if claims[key].new is not None and results[i] is not None])
    for i in checked:  # a key's other places in the batch
        key = items[i].key
        if key is not None and results[i] is None:
            results[i] = results[first_of[key]]
    return [r if r is not None else {"error": "internal_error", "detail": "not sent"} for r in results]


def _refusal(conflict: IdempotencyConflict) -> Result:
    return {"error": conflict.code, "detail": conflict.detail}


def _replayed(claim: Claim) -> Result:
    return _refusal(claim.conflict) if claim.conflict is not None else claim.answer
