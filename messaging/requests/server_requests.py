"""The app's server asking a client (docs/protocol.md, "Requests": server to client): the request is
stored with a SERVER_REQUEST message in the user's mailbox (pushed, fetched, ACK mode, like any
message), the client answers with RESOLVE or REJECT naming the request, and the server learns the
answer by the webhook `request.answered` (with its `correlation`), or `request.timed_out`, and from
GET /api/v1/requests/{id}.

A user answers only its own requests (the statement names the user the request asked), once; a
request past its deadline takes no answer: beat times it out, tells the server, and withdraws the
SERVER_REQUEST where the client has not received it yet (its delivery expires).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from apps_registry.selectors import AppSnapshot
from messaging.core.protocol import request_meta
from messaging.core.store import OutgoingMessage, messages_store
from messaging.models import UNDELIVERED_STATES, DeliveryState, MessageKind, states_sql
from messaging.requests import metrics
from messaging.requests.models import Outcome, Request, RequestDirection, RequestState
from messaging.webhooks.models import WebhookEvent
from messaging.webhooks.services import WebhookNotice, webhooks_record

WAITING = RequestState.WAITING.value
TO_CLIENT = RequestDirection.TO_CLIENT.value
WITHDRAWN_ERROR = "withdrawn: the server's request timed out"


def server_request_create(*, app: AppSnapshot, user_id: str, content: str, correlation: str = "",
                          timeout_seconds: float | None = None) -> int:
    """Ask `user_id` (a user homed here): the request and its SERVER_REQUEST, stored together.
    Returns the request id."""
    timeout = settings.SERVER_REQUEST_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(
                f"""
                INSERT INTO messaging_request (app_id, direction, user_id, endpoint, content, client_message_id,
                                               correlation, state, outcome, outcome_content, reason, answered_via,
                                               domain, session, created_at, deadline, message_id)
                VALUES (%s, '{TO_CLIENT}', %s, '', %s, NULL, %s, '{WAITING}', '', '', '', '', %s, '', now(),
                        now() + make_interval(secs => %s), nextval('messaging_message_id_seq'::regclass))
                RETURNING id, message_id
                """, [app.pk, user_id, content, correlation, settings.DOMAIN_NAME, timeout])
            request_id, message_id = cur.fetchone()
            messages_store(messages=[OutgoingMessage(
                app_id=app.pk, sender=app.master_user_id, recipients=(user_id,), content=content,
                kind=MessageKind.SERVER_REQUEST, reference=request_meta(request_id=request_id), message_id=message_id)])
    metrics.REQUESTS.labels("", "server_request").inc()
    return request_id


class AnswerRefused(Exception):
    """A client's answer that cannot be taken: `code` request_closed or not_found."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class ClientAnswered:
    request_id: int
    replay: bool


def server_request_answer(*, app: AppSnapshot, user_id: str, request_id: int, outcome: str,
                          content: str) -> ClientAnswered:
    """A client's answer to a request its server made of it: the first closes it and tells the
    server (`request.answered`, recorded with the change); the same answer again is a replay."""
    outcome = Outcome(outcome).value
    state = RequestState.RESOLVED.value if outcome == Outcome.RESOLVE else RequestState.REJECTED.value
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_request SET state = %s, outcome = %s, outcome_content = %s, answered_via = 'client',
                   answered_at = now()
             WHERE id = %s AND app_id = %s AND user_id = %s AND direction = '{TO_CLIENT}' AND state = '{WAITING}'
               AND deadline > now()
            RETURNING correlation
            """, [state, outcome, content, request_id, app.pk, user_id])
        row = cur.fetchone()
        if row is not None:
            webhooks_record(notices=[WebhookNotice(app_id=app.pk, event=WebhookEvent.REQUEST_ANSWERED.value, data={
                "requestId": str(request_id), "correlation": row[0], "user": user_id, "outcome": outcome,
                "content": content, "domain": settings.DOMAIN_NAME})])
            metrics.REQUESTS.labels("", f"client_{outcome}").inc()
            return ClientAnswered(request_id=request_id, replay=False)
    found = (Request.objects.filter(pk=request_id, app_id=app.pk, user_id=user_id, direction=TO_CLIENT)
             .values_list("state", "outcome", "outcome_content").first())
    if found is None:
        raise AnswerRefused("not_found", f"no request {request_id} was made of you")
    if found == (state, outcome, content):
        return ClientAnswered(request_id=request_id, replay=True)
    closed = found[0] if found[0] != WAITING else RequestState.TIMED_OUT.value
    raise AnswerRefused("request_closed", f"request {request_id} is {closed}: it takes no other answer")


def server_requests_time_out(*, ids: list[int]) -> int:
    """Time out the server requests among `ids` that still wait past their deadline (the caller's
    transaction: beat's sweep): the server is told (`request.timed_out`), and a SERVER_REQUEST the
    client has not received yet is withdrawn."""
    if not ids:
        return 0
    with connection.cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_request SET state = '{RequestState.TIMED_OUT.value}', outcome = '{Outcome.REJECT.value}',
                   reason = 'timeout', answered_via = 'timeout', answered_at = now()
             WHERE id = ANY(%s) AND direction = '{TO_CLIENT}' AND state = '{WAITING}' AND deadline <= now()
            RETURNING id, app_id, user_id, correlation, message_id
            """, [ids])
        rows = cur.fetchall()
        if not rows:
            return 0
        cur.execute(
            f"""
            UPDATE messaging_delivery SET state = {states_sql(DeliveryState.EXPIRED)}, expired_at = now(),
                   next_attempt_at = NULL, claim = NULL, last_error = %s
             WHERE message_id = ANY(%s) AND state IN {states_sql(UNDELIVERED_STATES)}
            """, [WITHDRAWN_ERROR, [row[4] for row in rows if row[4] is not None]])
    webhooks_record(notices=[WebhookNotice(app_id=app_id, event=WebhookEvent.REQUEST_TIMED_OUT.value, data={
        "requestId": str(request_id), "correlation": correlation, "user": user_id, "domain": settings.DOMAIN_NAME})
        for request_id, app_id, user_id, correlation, _ in rows])
    metrics.REQUESTS.labels("", "client_timed_out").inc(len(rows))
    return len(rows)
