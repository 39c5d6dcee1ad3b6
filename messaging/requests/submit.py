"""A client's request taken in: stored once per clientMessageId, within its endpoint's cap, and told
to the app's server (docs/protocol.md, "Requests").

A web node gathers the requests its connections send within a few milliseconds and takes them in
with one `requests_submit` call (its requests batcher, as its intake does messages): one transaction
of a handful of statements for the whole batch:

1. the requests seen before (the same user's clientMessageId): answered `duplicate`, told nothing;
   one still waiting that comes again from another session moves to it (its outcome is pushed to
   the session that asked last);
2. a transaction-scoped lock per user with new requests, taken in one sorted statement
   (foundation.locks.in_turn_many), so the cap holds under concurrent sends of one user on several
   nodes, and two batches never deadlock;
3. each user's requests waiting per endpoint, counted; what is over the endpoint's
   `max_in_flight_per_user` is refused (`too_many_requests`);
4. one INSERT of the rest (a clientMessageId committed meanwhile by another node inserts nothing
   and is answered as the duplicate it is), and, in the same transaction, the webhook calls to the
   endpoints with a webhook (messaging.webhooks: signed, retried, dead-lettered);
5. once committed, the entries of the endpoints with a stream, one pipeline to Redis.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

import redis
from django.conf import settings
from django.db import connection, transaction

from apps_registry.selectors import AppSnapshot, EndpointSpec
from foundation.locks import in_turn_many
from foundation.transport.queue_names import REQUESTS_GROUP, queue_client, requests_key
from messaging.requests import metrics
from messaging.requests.models import RequestDirection, RequestState
from messaging.requests.outcome import request_answer_url
from messaging.webhooks.inline import InlineCall
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
    call: InlineCall | None = None  # (`inline`) its webhook's first attempt, for the caller to make once committed


@dataclass(frozen=True)
class Submission:
    app: AppSnapshot
    user_id: str
    endpoint: EndpointSpec
    content: str
    client_message_id: str
    timeout_ms: object = None  # the client's, checked against the endpoint's maximum
    session: str = ""  # the requester's resumable session (messaging.requests.sessions)

    @property
    def key(self) -> tuple[int, str, str]:
        return self.app.pk, self.user_id, self.client_message_id


def timeout_checked(endpoint: EndpointSpec, timeout_ms: object) -> int:
    """The request's timeout in ms: the endpoint's default, or the client's within its maximum."""
    if timeout_ms is None:
        return endpoint.timeout_ms
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
        raise RequestRefused("invalid_timeout", "'timeoutMs' must be a positive integer")
    if timeout_ms > endpoint.max_timeout_ms:
        raise RequestRefused("timeout_too_long", f"'timeoutMs' is at most {endpoint.max_timeout_ms} for endpoint "
                                                 f"{endpoint.name}", limit=endpoint.max_timeout_ms)
    return timeout_ms


def request_submit(*, app: AppSnapshot, user_id: str, endpoint: EndpointSpec, content: str,
                   client_message_id: str, timeout_ms: object = None, session: str = "") -> Submitted:
    """One request (`requests_submit` with a batch of one); RequestRefused raised."""
    [result] = requests_submit(submissions=[Submission(app, user_id, endpoint, content, client_message_id,
                                                       timeout_ms, session)])
    if isinstance(result, RequestRefused):
        raise result
    return result


_EXISTING_SQL = """
    SELECT r.app_id, r.user_id, r.client_message_id, r.id, r.message_id
      FROM messaging_request r
      JOIN unnest(%s::bigint[], %s::text[], %s::text[]) AS k(app_id, user_id, cmid)
        ON r.app_id = k.app_id AND r.user_id = k.user_id AND r.client_message_id = k.cmid
"""
_WAITING_SQL = f"""
    SELECT r.app_id, r.user_id, r.endpoint, count(*)
      FROM messaging_request r
      JOIN (SELECT DISTINCT * FROM unnest(%s::bigint[], %s::text[], %s::text[])) AS k(app_id, user_id, endpoint)
        ON r.app_id = k.app_id AND r.user_id = k.user_id AND r.endpoint = k.endpoint
     WHERE r.state = '{WAITING}'
     GROUP BY 1, 2, 3
"""
_INSERT_SQL = f"""
    INSERT INTO messaging_request (app_id, direction, user_id, endpoint, content, client_message_id, correlation,
                                   state, outcome, outcome_content, reason, answered_via, domain, session, created_at,
                                   deadline)
    SELECT k.app_id, '{RequestDirection.TO_SERVER.value}', k.user_id, k.endpoint, k.content, k.cmid, '', '{WAITING}',
           '', '', '', '', %s, k.session, now(), now() + make_interval(secs => k.timeout)
      FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::float8[])
           AS k(app_id, user_id, endpoint, content, cmid, session, timeout)
    ON CONFLICT (app_id, user_id, client_message_id) WHERE client_message_id IS NOT NULL DO NOTHING
    RETURNING app_id, user_id, client_message_id, id, deadline
"""


def _existing(cur, keys: list[tuple[int, str, str]]) -> dict[tuple[int, str, str], Submitted]:
    if not keys:
        return {}
    cur.execute(_EXISTING_SQL, [list(column) for column in zip(*keys, strict=True)])
    return {(a, u, c): Submitted(request_id=rid, duplicate=True, outcome_message_id=mid)
            for a, u, c, rid, mid in cur.fetchall()}


def requests_submit(*, submissions: list[Submission], inline: bool = False) -> list[Submitted | RequestRefused]:
    """Take in a batch of requests (see the module docstring); one answer per submission, in order:
    Submitted (maybe `duplicate`) or the RequestRefused to send back. `inline`: the webhook calls are
    not handed over to the workers but returned (Submitted.call) for the caller to make at once
    (messaging.webhooks.inline: a web node on its event loop)."""
    answers: list[Submitted | RequestRefused | None] = [None] * len(submissions)
    timeouts: dict[int, int] = {}
    for i, sub in enumerate(submissions):
        try:
            timeouts[i] = timeout_checked(sub.endpoint, sub.timeout_ms)
        except RequestRefused as refused:
            answers[i] = refused
    told: list[tuple[Submission, dict[str, str]]] = []
    with transaction.atomic(), connection.cursor() as cur:
        found = _existing(cur, sorted({submissions[i].key for i in timeouts}))
        fresh: dict[tuple[int, str, str], int] = {}  # key -> the index that stores it (the first of the batch)
        moved: dict[int, str] = {}  # a request sent again from another session: its outcome follows it
        for i in timeouts:
            key = submissions[i].key
            if key in found:
                answers[i] = found[key]
                if submissions[i].session:
                    moved[found[key].request_id] = submissions[i].session
            elif key not in fresh:
                fresh[key] = i
        if moved:
            cur.execute("UPDATE messaging_request r SET session = k.session "
                        "FROM unnest(%s::bigint[], %s::text[]) AS k(id, session) "
                        f"WHERE r.id = k.id AND r.state = '{WAITING}' AND r.session <> k.session",
                        [list(moved), list(moved.values())])
        if fresh:
            in_turn_many([f"request:{app}:{user}" for app, user, _ in fresh])
            wanted = [(submissions[i].app.pk, submissions[i].user_id, submissions[i].endpoint.name)
                      for i in fresh.values()]
            cur.execute(_WAITING_SQL, [list(column) for column in zip(*wanted, strict=True)])
            waiting = Counter({(a, u, e): n for a, u, e, n in cur.fetchall()})
            storing = []
            for i in fresh.values():
                sub = submissions[i]
                slot = (sub.app.pk, sub.user_id, sub.endpoint.name)
                if waiting[slot] >= sub.endpoint.max_in_flight_per_user:
                    limit = sub.endpoint.max_in_flight_per_user
                    answers[i] = RequestRefused("too_many_requests", f"at most {limit} requests in flight to "
                                                                     f"{sub.endpoint.name} per user", limit=limit)
                    metrics.REQUESTS.labels(sub.endpoint.name, "refused").inc()
                    continue
                waiting[slot] += 1
                storing.append(i)
            stored = _insert(cur, [submissions[i] for i in storing], [timeouts[i] for i in storing])
            late = [submissions[i].key for i in storing if submissions[i].key not in stored]
            found.update(_existing(cur, late))  # (committed by another node since the first look)
            calls, calling = [], []
            for i in storing:
                sub = submissions[i]
                if sub.key not in stored:
                    answers[i] = found[sub.key]
                    continue
                request_id, deadline = stored[sub.key]
                answers[i] = Submitted(request_id=request_id, duplicate=False)
                fields = told_fields(sub, request_id, deadline)
                if sub.endpoint.webhook:
                    calls.append(EndpointCall(request_endpoint_id=sub.endpoint.pk, data=fields))
                    calling.append(i)
                if sub.endpoint.stream:
                    told.append((sub, fields))
                metrics.REQUESTS.labels(sub.endpoint.name, "accepted").inc()
            made = webhook_endpoint_calls_record(calls=calls, inline=inline)
            by_request = {call.call.payload["data"]["requestId"]: call for call in made}
            for i in calling:
                if (call := by_request.get(str(answers[i].request_id))) is not None:
                    answers[i] = Submitted(request_id=answers[i].request_id, duplicate=False, call=call)
        if told:
            transaction.on_commit(lambda: requests_stream_add(entries=[(s.app.app_name, f) for s, f in told]))
    for i, sub in enumerate(submissions):  # a key twice in one batch: the later ones are its duplicates
        if answers[i] is None:
            first = answers[fresh[sub.key]]
            answers[i] = first if isinstance(first, RequestRefused) else Submitted(first.request_id, True)
    return answers  # type: ignore[return-value]


def _insert(cur, subs: list[Submission], timeouts: list[int]) -> dict[tuple[int, str, str], tuple[int, datetime]]:
    if not subs:
        return {}
    cur.execute(_INSERT_SQL, [settings.DOMAIN_NAME, [s.app.pk for s in subs], [s.user_id for s in subs],
                              [s.endpoint.name for s in subs], [s.content for s in subs],
                              [s.client_message_id for s in subs], [s.session for s in subs],
                              [t / 1000 for t in timeouts]])
    return {(a, u, c): (rid, deadline) for a, u, c, rid, deadline in cur.fetchall()}


def told_fields(sub: Submission, request_id: int, deadline: datetime) -> dict[str, str]:
    """What the server is told of a request: the webhook's `data` and the stream entry's fields."""
    return {"requestId": str(request_id), "endpoint": sub.endpoint.name, "from": sub.user_id, "content": sub.content,
            "domain": settings.DOMAIN_NAME, "answerUrl": request_answer_url(request_id),
            "deadline": deadline.isoformat()}


# XADD to a request stream, making the stream and its group `app` first if the stream is not there:
# in one script, so a stream never exists without its group (a Redis restarted empty included).
_ADD = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM') end
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
"""


def requests_stream_add(*, entries: list[tuple[str, dict[str, str]]]) -> None:
    """Append requests to their apps' request streams, one pipeline (each stream made with its group
    `app` when it is not there). Redis away: logged; those requests time out unless the webhook (or
    the client's resend) gets through. (MAXLEN keeps an app whose server never reads from growing
    Redis without end.)"""
    client = queue_client()
    add = client.register_script(_ADD)
    try:
        pipe = client.pipeline(transaction=False)
        for app_name, fields in entries:
            flat = [part for pair in fields.items() for part in pair]
            add(keys=[requests_key(app_name)], args=[REQUESTS_GROUP, settings.REQUEST_STREAM_MAX_ENTRIES, *flat],
                client=pipe)
        pipe.execute()
    except redis.RedisError:
        log.warning("%d requests not added to their streams", len(entries), exc_info=True)
