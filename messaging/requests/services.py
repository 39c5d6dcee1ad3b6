"""Requests to an app's server: taken from a client, told to the server, answered once, and the
outcome stored in the requester's mailbox (docs/protocol.md, "Requests").

- `request_submit` stores a client's request (once per clientMessageId), and, in the same
  transaction, the webhook call to its endpoint (messaging.webhooks); once committed, the entry on
  the app's request stream. A resend finds the stored request: the server is not told again.
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
from dataclasses import dataclass
from datetime import datetime

import redis
from django.conf import settings
from django.db import connection, transaction

from apps_registry.selectors import AppSnapshot, EndpointSpec
from foundation.locks import in_turn
from foundation.transport.queue_names import REQUESTS_GROUP, queue_client, requests_key
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
from messaging.requests.outcome import outcome_message, request_answer_url
from messaging.requests.server_requests import server_requests_time_out
from messaging.webhooks.services import EndpointCall, webhook_endpoint_calls_record

log = logging.getLogger(__name__)

WAITING = RequestState.WAITING.value


class RequestRefused(Exception):
    """A request the endpoint's limits refuse: `code` is the protocol's (docs/protocol.md)."""

    def __init__(self, code: str, detail: str, **extra: object):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.extra = extra


@dataclass(frozen=True)
class Submitted:
    request_id: int
    duplicate: bool
    outcome_message_id: int | None = None  # a duplicate whose outcome exists: sent again


def _deadline_ms(endpoint: EndpointSpec, timeout_ms: object) -> int:
    if timeout_ms is None:
        return endpoint.timeout_ms
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
        raise RequestRefused("invalid_timeout", "'timeoutMs' must be a positive integer")
    if timeout_ms > endpoint.max_timeout_ms:
        raise RequestRefused("timeout_too_long", f"'timeoutMs' is at most {endpoint.max_timeout_ms} for endpoint "
                                                 f"{endpoint.name}", limit=endpoint.max_timeout_ms)
    return timeout_ms


_INSERT_SQL = """
    INSERT INTO messaging_request (app_id, direction, user_id, endpoint, content, client_message_id, correlation,
                                   state, outcome, outcome_content, reason, answered_via, domain, session, created_at,
                                   deadline)
    VALUES (%(app)s, %(direction)s, %(user)s, %(endpoint)s, %(content)s, %(cmid)s, '', %(waiting)s, '', '', '', '',
            %(domain)s, %(session)s, now(), now() + make_interval(secs => %(timeout)s))
    ON CONFLICT (app_id, user_id, client_message_id) WHERE client_message_id IS NOT NULL DO NOTHING
    RETURNING id, created_at, deadline
"""


def request_submit(*, app: AppSnapshot, user_id: str, endpoint: EndpointSpec, content: str,
                   client_message_id: str, timeout_ms: object = None, session: str = "") -> Submitted:
    """Store a client's request and tell its server (once committed). A clientMessageId seen before
    from this user: that request, `duplicate`, and nothing told again. RequestRefused when the user
    already has the endpoint's maximum in flight, or asks for too long a timeout."""
    timeout = _deadline_ms(endpoint, timeout_ms) / 1000
    with transaction.atomic(), connection.cursor() as cur:
        found = _existing(cur, app.pk, user_id, client_message_id)
        if found is not None:
            return found
        # One user's requests are counted and stored one at a time, so the cap holds under
        # concurrent sends (a transaction-scoped lock on the user: other users never wait on it).
        in_turn(f"request:{app.pk}:{user_id}")
        cur.execute("SELECT count(*) FROM messaging_request WHERE app_id = %s AND user_id = %s AND endpoint = %s "
                    f"AND state = '{WAITING}'", [app.pk, user_id, endpoint.name])
        if cur.fetchone()[0] >= endpoint.max_in_flight_per_user:
            metrics.REQUESTS.labels(endpoint.name, "refused").inc()
            raise RequestRefused("too_many_requests", f"at most {endpoint.max_in_flight_per_user} requests in flight "
                                                      f"to {endpoint.name} per user", limit=endpoint.max_in_flight_per_user)
        cur.execute(_INSERT_SQL, {"app": app.pk, "direction": RequestDirection.TO_SERVER.value, "user": user_id,
                                  "endpoint": endpoint.name, "content": content, "cmid": client_message_id,
                                  "waiting": WAITING, "domain": settings.DOMAIN_NAME, "session": session,
                                  "timeout": timeout})
        row = cur.fetchone()
        if row is None:  # the same clientMessageId, committed since the look above
            found = _existing(cur, app.pk, user_id, client_message_id)
            if found is None:
                raise RuntimeError(f"request {client_message_id!r} of {user_id} was neither stored nor found")
            return found
        request_id, created_at, deadline = row
        told = _told(app=app, request_id=request_id, user_id=user_id, endpoint=endpoint, content=content,
                     deadline=deadline)
        if endpoint.webhook:
            webhook_endpoint_calls_record(calls=[EndpointCall(request_endpoint_id=endpoint.pk, data=told)])
        if endpoint.stream:
            transaction.on_commit(lambda: request_stream_add(app_name=app.app_name, fields=told))
    metrics.REQUESTS.labels(endpoint.name, "accepted").inc()
    return Submitted(request_id=request_id, duplicate=False)


def _existing(cur, app_pk: int, user_id: str, client_message_id: str) -> Submitted | None:
    cur.execute("SELECT id, message_id FROM messaging_request WHERE app_id = %s AND user_id = %s "
                "AND client_message_id = %s", [app_pk, user_id, client_message_id])
    row = cur.fetchone()
    return None if row is None else Submitted(request_id=row[0], duplicate=True, outcome_message_id=row[1])


def _told(*, app: AppSnapshot, request_id: int, user_id: str, endpoint: EndpointSpec, content: str,
          deadline: datetime) -> dict[str, str]:
    """What the server is told of a request: the webhook's `data` and the stream entry's fields."""
    return {"requestId": str(request_id), "endpoint": endpoint.name, "from": user_id, "content": content,
            "domain": settings.DOMAIN_NAME, "answerUrl": request_answer_url(request_id),
            "deadline": deadline.isoformat()}


def request_stream_add(*, app_name: str, fields: dict[str, str]) -> None:
    """Append a request to the app's request stream, creating the stream and its group `app` on first
    use. Redis away: logged; the request times out unless the webhook (or a retry of the client)
    gets through. (MAXLEN keeps an app whose server never reads from growing Redis without end.)"""
    client = queue_client()
    key = requests_key(app_name)
    try:
        try:
            client.xadd(key, fields, maxlen=settings.REQUEST_STREAM_MAX_ENTRIES, approximate=True)
        finally:
            try:
                client.xgroup_create(key, REQUESTS_GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
    except redis.RedisError:
        log.warning("request %s of %s not added to %s", fields.get("requestId"), app_name, key, exc_info=True)


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
    UPDATE messaging_request r SET state = %(state)s, outcome = %(outcome)s, outcome_content = %(content)s,
           reason = %(reason)s, answered_via = %(via)s, answered_at = now()
      FROM apps_registry_clientapp a
     WHERE r.id = ANY(%(ids)s) AND r.state = '{WAITING}' AND r.direction = '{RequestDirection.TO_SERVER.value}'
       AND (%(app)s::bigint IS NULL OR r.app_id = %(app)s) AND a.id = r.app_id {{deadline}}
    RETURNING r.app_id, r.id, r.user_id, r.client_message_id, r.created_at, r.endpoint, a.master_user_id, r.session
"""
BEFORE_DEADLINE = "AND r.deadline > now()"
PAST_DEADLINE = "AND r.deadline <= now()"


def request_answer(*, app: AppSnapshot, request_id: int, outcome: str, content: str, via: str) -> Answered:
    """The server's answer to a waiting request of `app`: the first one closes it and stores its
    outcome for the requester; the same answer again is a replay; another one, or any after the
    deadline, is RequestClosed; an unknown id (or another app's) RequestUnknown."""
    outcome = Outcome(outcome).value
    state = RequestState.RESOLVED if outcome == Outcome.RESOLVE else RequestState.REJECTED
    with transaction.atomic():
        closed = _close(ids=[request_id], app_pk=app.pk, state=state, outcome=outcome, content=content, reason="",
                        via=via, deadline=BEFORE_DEADLINE)
    if closed:
        metrics.REQUESTS.labels(closed[0].endpoint, outcome).inc()
        return Answered(request_id=request_id, replay=False)
    row = (Request.objects.filter(pk=request_id, app_id=app.pk, direction=RequestDirection.TO_SERVER)
           .values_list("state", "outcome", "outcome_content").first())
    if row is None:
        raise RequestUnknown(request_id)
    if row[0] == state and row[1] == outcome and row[2] == content:
        return Answered(request_id=request_id, replay=True)
    raise RequestClosed(row[0] if row[0] != WAITING else RequestState.TIMED_OUT.value)


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


def _close(*, ids: list[int], app_pk: int | None, state: str, outcome: str, content: str, reason: str, via: str,
           deadline: str = "") -> list[_Closed]:
    """Close those of `ids` that still wait (of app `app_pk`, if given; `deadline`: a further
    condition on it) and store their outcomes for their requesters, in the caller's transaction."""
    with connection.cursor() as cur:
        cur.execute(_CLOSE_SQL.format(deadline=deadline), {
            "state": str(state), "outcome": str(outcome), "content": content, "reason": reason, "via": via,
            "ids": ids, "app": app_pk})
        closed = [_Closed(*row) for row in cur.fetchall()]
        sessions = sorted({c.session for c in closed if c.session})
        ended: set[str] = set()
        if sessions:  # a session that ended takes no outcome any more
            cur.execute("SELECT session FROM messaging_closedsession WHERE session = ANY(%s)", [sessions])
            ended = {row[0] for row in cur.fetchall()}
        stored = [c for c in closed if c.session not in ended]
        if len(stored) < len(closed):
            metrics.SESSION_OUTCOMES_DROPPED.inc(len(closed) - len(stored))
        if not stored:
            return closed
        results = messages_store(messages=[
            outcome_message(app_id=c.app_id, master_user_id=c.master_user_id, request_id=c.request_id, user_id=c.user_id,
                            client_message_id=c.client_message_id, outcome=str(outcome), content=content, reason=reason,
                            session=c.session)
            for c in stored])
        cur.execute("UPDATE messaging_request r SET message_id = m.message_id "
                    "FROM unnest(%s::bigint[], %s::bigint[]) AS m(id, message_id) WHERE r.id = m.id",
                    [[c.request_id for c in stored], [r.message_id for r in results]])
    return closed


def requests_time_out(*, limit: int = 1000) -> int:
    """Reject every waiting request past its deadline with `reason: "timeout"` (beat). Served by
    request_waiting_deadline; SKIP LOCKED keeps two sweeps (and an answer in flight) off one row."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"SELECT id FROM messaging_request WHERE state = '{WAITING}' AND deadline <= now() "
                        "ORDER BY deadline LIMIT %s FOR UPDATE SKIP LOCKED", [limit])
            due = [row[0] for row in cur.fetchall()]
        closed = _close(ids=due, app_pk=None, state=RequestState.TIMED_OUT, outcome=Outcome.REJECT, content="",
                        reason=REASON_TIMEOUT, via="timeout", deadline=PAST_DEADLINE) if due else []
        asked = server_requests_time_out(ids=due)  # (the server's own requests of its clients among them)
    for c in closed:
        metrics.REQUESTS.labels(c.endpoint, "timed_out").inc()
    return len(closed) + asked


def request_endpoint_failed(*, request_id: int, error: str) -> bool:
    """Its call to the server was dead-lettered: a waiting request is rejected with
    `reason: "endpoint_failed"` (in the caller's transaction: the webhook's record of the dead call)."""
    closed = _close(ids=[request_id], app_pk=None, state=RequestState.FAILED, outcome=Outcome.REJECT, content="",
                    reason=REASON_ENDPOINT_FAILED, via="webhook")
    for c in closed:
        metrics.REQUESTS.labels(c.endpoint, "endpoint_failed").inc()
        log.warning("request %s rejected: the call to its endpoint %s is dead (%s)", request_id, c.endpoint,
                    error[:200])
    return bool(closed)
