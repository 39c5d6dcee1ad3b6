"""`Idempotency-Key` on sends: the same key with the same request gets the same answer (status and
body) and no second message; the same key with another request gets 409.

How two requests with one key are kept from both sending: the key is claimed with an INSERT into a
table whose (app, key) is unique, in the same transaction as the send and its stored answer. A
second request's INSERT waits on the unique index until the first commits (then it reads and
replays the stored answer) or rolls back (then it claims the key itself). A send that fails leaves
nothing behind: the claim rolls back with it, so the key is free for a retry. Nothing a send causes
leaves the process before the commit (routing and channel fan-out run on commit), except a FAST
push, which is never stored and is best effort anyway.

Only successful answers are stored. Keys live API_IDEMPOTENCY_HOURS (24) hours; a beat task drops
older ones (`idempotency_keys_expire`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from messaging.models import IdempotencyKey

HEADER = "Idempotency-Key"
KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no spaces: what a header carries safely


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    replayed: bool = False


class IdempotencyConflict(Exception):
    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


def idempotency_key_valid(key: str) -> bool:
    return bool(KEY_RE.fullmatch(key))


def request_fingerprint(*, method: str, path: str, body: Any) -> str:
    """A digest of what makes two requests "the same": method, path and the parsed body (key order
    and spacing do not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode(errors="surrogatepass")).hexdigest()


_CLAIM_SQL = """
INSERT INTO messaging_idempotencykey (app_id, key, fingerprint, created_at) VALUES (%s, %s, %s, now())
ON CONFLICT (app_id, key) DO NOTHING
RETURNING id
"""
_ANSWER_SQL = "UPDATE messaging_idempotencykey SET status_code = %s, response = %s WHERE id = %s"


def idempotent_send(*, app_id: int, key: str | None, fingerprint: str, send: Callable[[], Answer]) -> Answer:
    """Run `send` at most once per (app, key): the first time its answer is stored with the key;
    afterwards the stored answer is returned (`replayed`). Without a key, `send` simply runs."""
    if key is None:
        return send()
    for _ in range(2):  # the second round only if the key expired between the claim and the read
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(_CLAIM_SQL, [app_id, key, fingerprint])
                claimed = cur.fetchone()
                if claimed is not None:
                    answer = send()
                    cur.execute(_ANSWER_SQL, [answer.status, Jsonb(answer.body), claimed[0]])
                    return answer
        stored = IdempotencyKey.objects.filter(app_id=app_id, key=key).values_list(
            "fingerprint", "status_code", "response").first()
        if stored is None:
            continue
        if stored[0] != fingerprint:
            raise header_reused(key)
        if stored[1] is None:  # only if a claim committed without its answer, which sends never do
            raise IdempotencyConflict("idempotency_key_in_progress",
                                      f"a request with the {HEADER} '{key}' is in progress; retry later")
        return Answer(status=stored[1], body=stored[2], replayed=True)
    raise IdempotencyConflict("idempotency_key_in_progress",
                              f"a request with the {HEADER} '{key}' is in progress; retry later")


def idempotency_keys_expire() -> int:
    """Drop keys older than API_IDEMPOTENCY_HOURS (the idempotency_key_expiry index)."""
    cutoff = timezone.now() - timedelta(hours=settings.API_IDEMPOTENCY_HOURS)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    return deleted


@dataclass(frozen=True)
class Claim:
    """What one key gets when a batch of keys is claimed: `new` (the row to store its answer in:
    send it), or a stored `answer` with its `status` (replay it), or a `conflict` (the key was used
    for another request)."""

    new: int | None = None
    answer: dict[str, Any] | None = None
    status: int | None = None
    conflict: IdempotencyConflict | None = None
    message_id: int | None = None  # a new claim made with its answer: the message id that answer names


def key_reused(key: str) -> IdempotencyConflict:
    """A batch message's key used for another message."""
    return IdempotencyConflict("idempotency_key_reused",
                               f"the idempotency key '{key}' was used for another message; use a new key")


def header_reused(key: str) -> IdempotencyConflict:
    """A single send's Idempotency-Key used for another request."""
    return IdempotencyConflict("idempotency_key_reused",
                               f"the {HEADER} '{key}' was used for another request; use a new key")


_CLAIM_MANY_SQL = """
INSERT INTO messaging_idempotencykey (app_id, key, fingerprint, created_at)
SELECT k.app_id, k.key, k.fingerprint, now()
  FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS k(app_id, key, fingerprint)
 ORDER BY k.app_id, k.key
ON CONFLICT (app_id, key) DO NOTHING
RETURNING app_id, key, id
"""
_STORED_SQL = """
SELECT i.app_id, i.key, i.fingerprint, i.status_code, i.response
  FROM messaging_idempotencykey i JOIN unnest(%s::bigint[], %s::text[]) AS k(app_id, key)
    ON i.app_id = k.app_id AND i.key = k.key
"""


# The claims of sends whose answer is known but for the message's id: each claim is made with its
# answer (201), whose `id` is drawn here from the messages' sequence; the caller stores the message
# under that id in the same transaction. One write per key: no answer to store afterwards.
_CLAIM_ANSWERED_SQL = """
INSERT INTO messaging_idempotencykey (app_id, key, fingerprint, created_at, status_code, response)
SELECT k.app_id, k.key, k.fingerprint, now(), 201,
       jsonb_build_object('id', nextval('messaging_message_id_seq'::regclass)::text) || k.answer::jsonb
  FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[]) AS k(app_id, key, fingerprint, answer)
 ORDER BY k.app_id, k.key
ON CONFLICT (app_id, key) DO NOTHING
RETURNING app_id, key, id, (response->>'id')::bigint
"""


def idempotency_claims(*, app_id: int, keyed: dict[str, str],
                       reused: Callable[[str], IdempotencyConflict] = key_reused) -> dict[str, Claim]:
    """`idempotency_claims_many` for the keys of one app (key -> fingerprint), by key."""
    claims = idempotency_claims_many([(app_id, key, fingerprint) for key, fingerprint in keyed.items()],
                                     reused=reused)
    return {key: claim for (_, key), claim in claims.items()}


def idempotency_claims_many(keyed: list[tuple[int, str, str]], *,
                            reused: Callable[[str], IdempotencyConflict] = key_reused,
                            answers: list[dict[str, Any]] | None = None) -> dict[tuple[int, str], Claim]:
    """Inside the caller's transaction: each (app, key, fingerprint) of `keyed` (no (app, key)
    twice) claimed in one statement, or its stored answer found, by (app, key). A concurrent claim
    of the same key waits for its transaction, as for one send; keys are claimed in (app, key)
    order, so two batches that share keys wait for each other instead of deadlocking. The caller
    sends the `new` ones and stores their answers with `idempotency_answers_store` in the same
    transaction; `reused` words the conflict of a key claimed with another fingerprint. With
    `answers` (one per key: its 201 answer but for the `id`), each new claim is made with its
    answer and names the message id drawn for it (`message_id`): the caller stores the message
    under it, and has no answer to store."""
    if not keyed:
        return {}
    columns = [[a for a, _, _ in keyed], [k for _, k, _ in keyed], [f for _, _, f in keyed]]
    with connection.cursor() as cur:
        if answers is None:
            cur.execute(_CLAIM_MANY_SQL, columns)
            claims = {(app_id, key): Claim(new=row_id) for app_id, key, row_id in cur.fetchall()}
        else:
            cur.execute(_CLAIM_ANSWERED_SQL, [*columns, [json.dumps(answer) for answer in answers]])
            claims = {(app_id, key): Claim(new=row_id, message_id=message_id)
                      for app_id, key, row_id, message_id in cur.fetchall()}
        others = [(a, k, f) for a, k, f in keyed if (a, k) not in claims]
        if others:
            cur.execute(_STORED_SQL, [[a for a, _, _ in others], [k for _, k, _ in others]])
            # (a raw cursor reads jsonb as its text: Django's JSONField parses it, not psycopg)
            stored = {(a, k): (f, status, json.loads(answer) if isinstance(answer, str) else answer)
                      for a, k, f, status, answer in cur.fetchall()}
    for app_id, key, fingerprint in others:
        found = stored.get((app_id, key))
        if found is None:  # expired between the claim and the read: sending it as new is not safe here
            conflict = IdempotencyConflict("idempotency_key_in_progress",
                                           f"the idempotency key '{key}' expired as it was read; retry")
            claims[app_id, key] = Claim(conflict=conflict)
        elif found[0] != fingerprint:
            claims[app_id, key] = Claim(conflict=reused(key))
        elif found[2] is None:  # only if a claim committed without its answer, which sends never do
            claims[app_id, key] = Claim(conflict=IdempotencyConflict(
                "idempotency_key_in_progress", f"a request with the idempotency key '{key}' is in progress; "
                                               "retry later"))
        else:
            claims[app_id, key] = Claim(answer=found[2], status=found[1])
    return claims


def idempotency_answers_store(answers: list[tuple[int, dict[str, Any]]]) -> None:
    """Inside the claims' transaction: (claim row, the message's answer) for each new claim."""
    if not answers:
        return
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE messaging_idempotencykey i SET status_code = 201, response = a.response::jsonb "
            "FROM unnest(%s::bigint[], %s::text[]) AS a(id, response) WHERE i.id = a.id",
            [[row for row, _ in answers], [json.dumps(body) for _, body in answers]])
