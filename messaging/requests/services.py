"""Requests to an app's server: taken from a client, told to the server, answered once, and the
outcome stored in the requester's mailbox (docs/protocol.md, "Requests").

- a client's request is taken in by messaging.requests.submit (stored once per clientMessageId,
  told to the server by webhook and stream);
- `request_answer` closes a waiting request with the server's outcome (from the REST API, the queue
  intake's `replyTo` entries, or the webhook's own answer) and stores the outcome message
  (RESOLVE/REJECT) to the requester in the same transaction: routed like any RELIABLE message
  (pushed, fetched, ACK mode; forwarded to the requester's home where that is another domain).
- `requests_time_out` (beat) rejects what waited past its deadline (`reason: "timeout"`);
  `request_endpoint_failed` what its dead-lettered call could not tell (`reason: "endpoint_failed"`).
Every close is one conditional statement on `state = 'waiting'`: the first answer wins, and a
second one (or one after the close) is told apart as a replay of the same answer or a conflict.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import connection, transaction

from apps_registry.selectors import AppSnapshot
from foundation.handoff import Route, routing_enqueue
from messaging.core.store import messages_store
from messaging.requests import metrics
from messaging.requests.models import (
    REASON_ENDPOINT_FAILED,
    REASON_TIMEOUT,
    Outcome,
    Request,
    RequestDirection,
    RequestState,
)
from messaging.requests.outcome import outcome_message
from messaging.requests.server_requests import server_requests_time_out

log = logging.getLogger(__name__)

WAITING = RequestState.WAITING.value


# --- answers -------------------------------------------------------------------------------------


class RequestClosed(Exception):
    """An answer to a request that is closed already with another outcome, or timed out."""

    def __init__(self, state: str):
        super().__init__(f"the request is {state}")
        self.state = state


class RequestUnknown(Exception):
    """No such request of this app."""


@dataclass(frozen=True)
class Answered:
    request_id: int
    replay: bool  # the same answer again: nothing changed


_CLOSE_SQL = f"""
    UPDATE messaging_request r SET state = k.state, outcome = k.outcome, outcome_content = k.content,
           reason = %(reason)s, answered_via = %(via)s, answered_at = now(),
           -- the outcome message's id, drawn here (one write of the row), unless its session ended
           message_id = CASE WHEN r.session <> '' AND EXISTS (SELECT 1 FROM messaging_closedsession c
                                                                WHERE c.session = r.session)
                             THEN NULL ELSE nextval('messaging_message_id_seq'::regclass) END
      FROM apps_registry_clientapp a,
           unnest(%(ids)s::bigint[], %(states)s::text[], %(outcomes)s::text[], %(contents)s::text[])
           AS k(id, state, outcome, content)
     WHERE r.id = k.id AND r.state = '{WAITING}' AND r.direction = '{RequestDirection.TO_SERVER.value}'
       AND (%(app)s::bigint IS NULL OR r.app_id = %(app)s) AND a.id = r.app_id {{deadline}}
    RETURNING r.app_id, r.id, r.user_id, r.client_message_id, r.created_at, r.endpoint, a.master_user_id, r.session,
              k.outcome, k.content, r.message_id
"""
BEFORE_DEADLINE = "AND r.deadline > now()"
PAST_DEADLINE = "AND r.deadline <= now()"


@dataclass(frozen=True)
class Answer:
    """A server's answer to one of its app's requests."""

    request_id: int
    outcome: str  # resolve or reject
    content: str

    @property
    def state(self) -> str:
        return RequestState.RESOLVED.value if self.outcome == Outcome.RESOLVE else RequestState.REJECTED.value


def request_answer(*, app: AppSnapshot, request_id: int, outcome: str, content: str, via: str,
                   route: Route = routing_enqueue) -> Answered:
    """The server's answer to a waiting request of `app`: the first one closes it and stores its
    outcome for the requester; the same answer again is a replay; another one, or any after the
    deadline, is RequestClosed; an unknown id (or another app's) RequestUnknown."""
    [result] = requests_answer(app=app, answers=[Answer(request_id, Outcome(outcome).value, content)], via=via,
                               route=route)
    if isinstance(result, Exception):
        raise result
    return result


def requests_answer(*, app: AppSnapshot, answers: list[Answer], via: str, route: Route = routing_enqueue
                    ) -> list[Answered | RequestClosed | RequestUnknown]:
    """A batch of a server's answers (the queue intake's), in one transaction: each answer's result,
    in order, as request_answer has it (the first of two answers to one request in the batch wins).
    The outcomes' deliveries go to `route` once committed (a web node's: its routing batcher)."""
    first: dict[int, Answer] = {}
    for answer in answers:
        first.setdefault(answer.request_id, answer)
    with transaction.atomic():
        closed = {c.request_id for c in _close(rows=list(first.values()), app_pk=app.pk, reason="", via=via,
                                               deadline=BEFORE_DEADLINE, route=route)}
    others = sorted({a.request_id for a in answers} - closed)
    known = {rid: (state, outcome, content) for rid, state, outcome, content in Request.objects.filter(
        pk__in=others, app_id=app.pk, direction=RequestDirection.TO_SERVER).values_list(
        "pk", "state", "outcome", "outcome_content")} if others else {}
    results: list[Answered | RequestClosed | RequestUnknown] = []
    taken: set[int] = set()
    for answer in answers:
        if answer.request_id in closed and answer.request_id not in taken:
            taken.add(answer.request_id)
            results.append(Answered(request_id=answer.request_id, replay=False))
        elif answer.request_id in closed:  # (answered a moment ago in this very batch)
            same = first[answer.request_id] == answer
            results.append(Answered(answer.request_id, True) if same else RequestClosed(answer.state))
        elif answer.request_id not in known:
            results.append(RequestUnknown(answer.request_id))
        elif known[answer.request_id] == (answer.state, answer.outcome, answer.content):
            results.append(Answered(request_id=answer.request_id, replay=True))
        else:
            state = known[answer.request_id][0]
            results.append(RequestClosed(state if state != WAITING else RequestState.TIMED_OUT.value))
    return results


@dataclass(frozen=True)
class _Closed:
    app_id: int
    request_id: int
    user_id: str
    client_message_id: str | None
    created_at: datetime
    endpoint: str
    master_user_id: str
    session: str
    outcome: str
    content: str
    message_id: int | None  # drawn for its outcome (None: its session ended, no outcome is stored)


def _close(*, rows: list[Answer], app_pk: int | None, reason: str, via: str, deadline: str = "",
           state: str | None = None, route: Route = routing_enqueue) -> list[_Closed]:
    """Close those of `rows`' requests that still wait (of app `app_pk`, if given; `deadline`: a
    further condition on it) with each row's outcome (`state`: the state all take, else each row's
    own), and store the outcomes for their requesters, in the caller's transaction."""
    if not rows:
        return []
    with connection.cursor() as cur:
        cur.execute(_CLOSE_SQL.format(deadline=deadline), {
            "ids": [r.request_id for r in rows], "states": [str(state or r.state) for r in rows],
            "outcomes": [r.outcome for r in rows], "contents": [r.content for r in rows], "reason": reason,
            "via": via, "app": app_pk})
        closed = [_Closed(*row) for row in cur.fetchall()]
    stored = [c for c in closed if c.message_id is not None]
    if len(stored) < len(closed):  # a session that ended takes no outcome any more
        metrics.SESSION_OUTCOMES_DROPPED.inc(len(closed) - len(stored))
    messages_store(messages=[
        replace(outcome_message(app_id=c.app_id, master_user_id=c.master_user_id, request_id=c.request_id,
                                user_id=c.user_id, client_message_id=c.client_message_id, outcome=c.outcome,
                                content=c.content, reason=reason, session=c.session), message_id=c.message_id)
        for c in stored], route=route)
    for c in closed:
        metrics.REQUESTS.labels(c.endpoint, reason or c.outcome).inc()
    return closed


def requests_time_out(*, limit: int = 1000) -> int:
    """Reject every waiting request past its deadline with `reason: "timeout"` (beat). Served by
    request_waiting_deadline; SKIP LOCKED keeps two sweeps (and an answer in flight) off one row."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"SELECT id FROM messaging_request WHERE state = '{WAITING}' AND deadline <= now() "
                        "ORDER BY deadline LIMIT %s FOR UPDATE SKIP LOCKED", [limit])
            due = [row[0] for row in cur.fetchall()]
        closed = _close(rows=[Answer(rid, Outcome.REJECT.value, "") for rid in due], app_pk=None,
                        state=RequestState.TIMED_OUT, reason=REASON_TIMEOUT, via="timeout", deadline=PAST_DEADLINE)
        asked = server_requests_time_out(ids=due)  # (the server's own requests of its clients among them)
    return len(closed) + asked


def request_endpoint_failed(*, request_id: int, error: str) -> bool:
    """Its call to the server was dead-lettered: a waiting request is rejected with
    `reason: "endpoint_failed"` (in the caller's transaction: the webhook's record of the dead call)."""
    closed = _close(rows=[Answer(request_id, Outcome.REJECT.value, "")], app_pk=None, state=RequestState.FAILED,
                    reason=REASON_ENDPOINT_FAILED, via="webhook")
    for c in closed:
        log.warning("request %s rejected: the call to its endpoint %s is dead (%s)", request_id, c.endpoint,
                    error[:200])
    return bool(closed)
