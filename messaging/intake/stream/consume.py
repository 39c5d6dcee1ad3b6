"""A batch of an app's intake entries consumed: each checked by the rules of a REST send
(messaging.intake.server_sends), the good ones stored in one statement (RELIABLE) or pushed (FAST), the
others dead-lettered with their reason, then all acknowledged and deleted from the stream.

An entry's fields: `to` (a user id, or a JSON list of user ids: a group message), `content`, and
optionally `feature` (RELIABLE, the default, or FAST), `reference`, `sender` (a user of the app;
its master user by default). An entry with `replyTo` instead is the server's answer to a request
(docs/protocol.md, "Requests"): `replyTo` (the request id), `outcome` (resolve or reject) and
`content`; one that cannot be taken (unknown request, closed already with another answer, too late)
is dead-lettered with its reason (`not_found`, `request_closed`). The same answer again is taken as
a replay: nothing changes. Any other field, text that is not UTF-8, an entry larger than
QUEUE_INTAKE_ENTRY_MAX_BYTES (never read whole: intake.stream.reader) or anything a REST send would
refuse sends it to the dead-letter stream `sbq:<APPNAME>:dead` with `entry` (its id), `reason`
("<error code>: <detail>", the REST API's answer) and a bounded copy of its fields
(intake.stream.dead_letters).

The app's API rate limit applies as to the REST API, on the same bucket (messaging.intake.throttling):
a token per entry. Entries beyond the tokens there are are not refused: they are left unacknowledged,
as they were read (`Consumed.waiting`), and the consumer reads them again once there are tokens
(`Consumed.retry_after`; intake.stream.runner). Nothing is lost and nothing is dead-lettered for it;
the backlog waits in the stream, where the gate bounds it, and the writer is refused (NOPERM) once
it is full, as when the workers fall behind.

Guarantees:
- an entry is stored once and routed once however often it is processed (a consumer killed after
  storing and before acknowledging; a claim by XAUTOCLAIM): its message's clientMessageId is
  `sbq:<domain>:<entry id>`, unique per (app, sender), and a repeat stores and routes nothing. No client can
  take such an id first: `sbq:` is refused on /ws and Socket.IO (messaging.core.protocol);
- a FAST entry is pushed at most once, with no marker kept anywhere: it is acknowledged and deleted
  (one MULTI, an XACK per entry) before it is pushed, and only the consumer whose XACK removed it
  from the group's pending list (answered 1) pushes it. A second consumer that claimed it, or this
  one processing it again after a crash, gets 0 and pushes nothing; the group's pending list is the
  marker, for exactly as long as the entry can be processed again. A consumer that dies between the
  acknowledgement and the push loses that push (FAST is best effort: at most once, never twice);
- nothing RELIABLE is acknowledged before it is stored or dead-lettered: the acknowledgement, the
  deletion and the dead letters go in one MULTI after the commit. A dead letter may be written twice
  if its consumer dies between the two (the dead-letter stream is at least once).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import redis
from django.conf import settings
from django.db import DataError, IntegrityError

from apps_registry.selectors import AppSnapshot, app_snapshot
from foundation.transport.queue_names import GROUP, intake_key
from messaging.core.accept import SendRefused, content_require
from messaging.core.protocol import FEATURE_FAST, FEATURE_RELIABLE, QUEUE_CLIENT_MESSAGE_ID_PREFIX
from messaging.core.store import OutgoingMessage, messages_store
from messaging.intake.server_sends import CheckedSend, server_fast_push, server_message_check
from messaging.intake.stream.dead_letters import Oversized, dead_letter_add
from messaging.intake.stream.reader import Entry
from messaging.intake.stream.stats import stats_add
from messaging.intake.throttling import rate_limit_take_up_to
from messaging.requests.services import Answer, RequestClosed, RequestUnknown, requests_answer

log = logging.getLogger(__name__)

FIELDS = frozenset({"to", "content", "feature", "reference", "sender"})
ANSWER_FIELDS = frozenset({"replyTo", "outcome", "content"})  # an answer to a request (messaging.requests)
TO_INVALID = "'to' must be a user id or a non-empty JSON list of user ids"
# Entries left waiting for tokens are read again after at most this long: soon enough that they never
# sit idle long enough to be claimed by another consumer (QUEUE_INTAKE_RECLAIM_SECONDS, 30 s), rarely
# enough that a stream far over its app's limit is not read again and again for nothing.
RETRY_AFTER_MAX = 1.0


@dataclass(frozen=True)
class Consumed:
    stored: int = 0  # RELIABLE entries stored (and handed to routing)
    pushed: int = 0  # FAST entries pushed
    repeated: int = 0  # entries processed before: nothing sent again
    dead: int = 0
    waiting: int = 0  # entries over the app's rate limit: left unacknowledged, to be read again
    retry_after: float = 0.0  # when `waiting`: seconds until they may have tokens


def entry_fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    """The entry's fields as text: SendRefused for bytes that are not UTF-8 or a field not listed."""
    try:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
    except UnicodeDecodeError:
        raise SendRefused("invalid_request", "fields must be UTF-8 text") from None
    unknown = sorted(set(fields) - FIELDS)
    if unknown:
        raise SendRefused("invalid_request", f"unknown field {unknown[0][:64]!r} (fields: {', '.join(sorted(FIELDS))})")
    return fields


def entry_check(app: AppSnapshot, fields: dict[str, str]) -> CheckedSend:
    """The send an entry asks for, checked as a REST send is: SendRefused, or what to send."""
    to = fields.get("to", "")
    group, recipients = False, [to]
    if to.startswith("["):
        try:
            recipients = json.loads(to)
        except ValueError:
            raise SendRefused("invalid_request", TO_INVALID) from None
        if not isinstance(recipients, list) or not recipients or not all(isinstance(u, str) for u in recipients):
            raise SendRefused("invalid_request", TO_INVALID)
        group = True
    elif not to:
        raise SendRefused("invalid_request", TO_INVALID)
    return server_message_check(app=app, recipients=recipients, content=fields.get("content"), group=group,
                                feature=fields.get("feature", FEATURE_RELIABLE), sender=fields.get("sender"),
                                reference=fields.get("reference", ""))


@dataclass(frozen=True)
class EntryAnswer:
    request_id: int
    outcome: str
    content: str


def answer_raw_check(app: AppSnapshot | None, app_name: str, raw: dict[bytes, bytes]) -> EntryAnswer:
    """An entry with `replyTo`: the server's answer to a request (fields replyTo, outcome = resolve
    or reject, content), checked: SendRefused, or the answer."""
    if app is None:
        raise SendRefused("invalid_request", f"app {app_name} does not exist")
    try:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
    except UnicodeDecodeError:
        raise SendRefused("invalid_request", "fields must be UTF-8 text") from None
    unknown = sorted(set(fields) - ANSWER_FIELDS)
    if unknown:
        raise SendRefused("invalid_request", f"unknown field {unknown[0][:64]!r} in an answer "
                                             f"(fields: {', '.join(sorted(ANSWER_FIELDS))})")
    reply_to = fields["replyTo"]
    if not reply_to.isascii() or not reply_to.isdigit() or len(reply_to) > 18:
        raise SendRefused("invalid_request", "'replyTo' must be a request id")
    if fields.get("outcome") not in ("resolve", "reject"):
        raise SendRefused("invalid_request", "'outcome' must be resolve or reject")
    return EntryAnswer(request_id=int(reply_to), outcome=fields["outcome"],
                       content=content_require(app, fields.get("content", "")))


def _answers(app: AppSnapshot, answers: list[EntryAnswer]) -> list[str | None]:
    """Answer requests from entries, all in one transaction: per entry, None, or the dead letter's reason."""
    if not answers:
        return []
    results = requests_answer(app=app, answers=[Answer(a.request_id, a.outcome, a.content) for a in answers],
                              via="stream")
    return [f"not_found: no request {a.request_id} of app {app.app_name}" if isinstance(r, RequestUnknown)
            else f"request_closed: the request is {r.state}" if isinstance(r, RequestClosed) else None
            for a, r in zip(answers, results, strict=True)]


def entry_raw_check(app: AppSnapshot | None, app_name: str, raw: dict[bytes, bytes] | Oversized) -> CheckedSend:
    """An entry as read (its fields, or an Oversized copy) checked: SendRefused, or what to send."""
    if app is None:
        raise SendRefused("invalid_request", f"app {app_name} does not exist")
    if isinstance(raw, Oversized):
        raise SendRefused("request_too_large", f"the entry holds {raw.size} bytes in {raw.count} fields; at most "
                                               f"{settings.QUEUE_INTAKE_ENTRY_MAX_BYTES} (QUEUE_INTAKE_ENTRY_MAX_BYTES)")
    return entry_check(app, entry_fields(raw))


def _tokens_take(app: AppSnapshot | None, wanted: int) -> tuple[int, float]:
    """Tokens of the app's API bucket for `wanted` entries: how many it got, and the seconds until
    the rest may have them. Redis away: all pass, as REST requests do (messaging.intake.throttling)."""
    if app is None or not wanted:
        return wanted, 0.0  # an app that is gone: its entries are dead-lettered, which costs nobody's budget
    try:
        granted, wait = rate_limit_take_up_to(app_pk=app.pk, rate=app.api_rate_limit_per_second,
                                              burst=app.api_rate_limit_burst, wanted=wanted)
    except redis.RedisError:
        log.warning("API rate limit not applied to the queue intake of %s: Redis unavailable", app.app_name,
                    exc_info=True)
        return wanted, 0.0
    if granted >= wanted:
        return wanted, 0.0
    # Until the rest could all have tokens at the app's rate; no longer than the bucket takes to fill
    # (it holds no more than its burst: waiting longer would waste what the rate gives) nor RETRY_AFTER_MAX.
    rest = min(wanted - granted, app.api_rate_limit_burst)
    return granted, min(RETRY_AFTER_MAX, wait + (rest - 1) / app.api_rate_limit_per_second)


def _store(messages: list[OutgoingMessage]) -> tuple[list, list[tuple[int, Exception]]]:
    """Store the batch in one statement; if the statement itself is refused (a value Postgres will
    not take), store one at a time so only the bad entries fail: (results, [(index, error)])."""
    try:
        return messages_store(messages=messages), []
    except (DataError, IntegrityError):
        results, failed = [], []
        for index, message in enumerate(messages):
            try:
                results.append(messages_store(messages=[message])[0])
            except (DataError, IntegrityError) as exc:
                results.append(None)
                failed.append((index, exc))
        return results, failed


def _fast_claim(client: redis.Redis, app_name: str, ids: list[bytes]) -> list[bool]:
    """Acknowledge and delete the FAST entries `ids` (one MULTI): per entry, whether this XACK took
    it off the group's pending list, i.e. whether this consumer is the one that may push it."""
    pipe = client.pipeline(transaction=True)
    for entry_id in ids:
        pipe.xack(intake_key(app_name), GROUP, entry_id)
    pipe.xdel(intake_key(app_name), *ids)
    return [bool(acked) for acked in pipe.execute()[:-1]]


def queue_entries_consume(*, client: redis.Redis, app_name: str, entries: Sequence[Entry]) -> Consumed:
    """Consume `entries` of the app's stream (read or claimed by this consumer, in stream order):
    store, push or dead-letter as many as the app's rate limit lets through, then acknowledge and
    delete them; the others are left as they are (`waiting`). Raises on an infrastructure error
    (Postgres or Redis away) with nothing RELIABLE acknowledged: the entries stay pending and are
    processed again later, which stores and routes nothing twice."""
    app = app_snapshot(app_name)
    granted, retry_after = _tokens_take(app, sum(1 for _, raw in entries if raw is not None))
    taken: list[Entry] = []
    for entry_id, raw in entries:
        if raw is None:
            taken.append((entry_id, raw))  # deleted from the stream before it was consumed (its writer trimmed it): acknowledged only
        elif granted:
            taken.append((entry_id, raw))
            granted -= 1
    waiting = len(entries) - len(taken)
    reliable: list[tuple[bytes, dict | Oversized, OutgoingMessage]] = []
    fast: list[tuple[bytes, OutgoingMessage]] = []
    dead: list[tuple[bytes, dict | Oversized, str]] = []
    answers: list[tuple[bytes, dict, EntryAnswer]] = []
    for entry_id, raw in taken:
        if raw is None:
            continue
        if isinstance(raw, dict) and b"replyTo" in raw:
            try:
                answers.append((entry_id, raw, answer_raw_check(app, app_name, raw)))
            except SendRefused as refused:
                dead.append((entry_id, raw, f"{refused.code}: {refused.detail}"))
            continue
        try:
            checked = entry_raw_check(app, app_name, raw)
        except SendRefused as refused:
            dead.append((entry_id, raw, f"{refused.code}: {refused.detail}"))
            continue
        if checked.feature == FEATURE_FAST:
            fast.append((entry_id, checked.message))
        else:
            # (the domain in it: a message forwarded from another domain's queue, with an entry id of
            # that domain's Redis, never takes the place of this one's)
            cmid = f"{QUEUE_CLIENT_MESSAGE_ID_PREFIX}{settings.DOMAIN_NAME}:{entry_id.decode()}"
            reliable.append((entry_id, raw, replace(checked.message, client_message_id=cmid)))
    results, failed = _store([m for _, _, m in reliable]) if reliable else ([], [])
    for index, exc in failed:
        entry_id, raw, _ = reliable[index]
        log.warning("queue entry %s of %s refused by the database: %s", entry_id, app_name, exc)
        dead.append((entry_id, raw, "invalid_request: the database refused this message"))
    answered = 0
    for (entry_id, raw, _), reason in zip(answers, _answers(app, [a for _, _, a in answers]), strict=True):
        if reason is None:
            answered += 1
        else:
            dead.append((entry_id, raw, reason))
    stored = answered + sum(1 for r in results if r is not None and not r.duplicate)
    repeated = sum(1 for r in results if r is not None and r.duplicate)
    pushed = 0
    if fast:
        for (_, message), ours in zip(fast, _fast_claim(client, app_name, [i for i, _ in fast]), strict=True):
            if ours:
                server_fast_push(app, message)
                pushed += 1
    done = Consumed(stored=stored, pushed=pushed, repeated=repeated + len(fast) - pushed, dead=len(dead),
                    waiting=waiting, retry_after=retry_after if waiting else 0.0)
    pipe = client.pipeline(transaction=True)  # acknowledged and deleted together: never one without the other
    for entry_id, raw, reason in dead:
        dead_letter_add(pipe, app_name, entry_id, raw, reason)
    fast_ids = {entry_id for entry_id, _ in fast}  # acknowledged and deleted already
    ids = [entry_id for entry_id, _ in taken if entry_id not in fast_ids]
    if ids:
        pipe.xack(intake_key(app_name), GROUP, *ids)
        pipe.xdel(intake_key(app_name), *ids)
    stats_add(pipe, app_name, consumed=done.stored + done.pushed, dead=done.dead, repeated=done.repeated)
    if len(pipe):
        pipe.execute()
    return done
