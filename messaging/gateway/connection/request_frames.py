"""The /ws frames of requests and sessions (docs/protocol.md, "Requests"): REQUEST to an endpoint
of the app's server (messaging.requests), RESOLVE/REJECT answering a request the server made of the
client, and CLOSE_SESSION. The login's session id is given out and checked in `session_for_login`."""

from __future__ import annotations

from apps_registry.selectors import AppSnapshot
from foundation.asyncdb import run_db
from foundation.transport.frames import CLOSE_NORMAL, encode
from messaging.core.accept import SendRefused, content_require
from messaging.core.protocol import BIGINT_MAX, Frame, FrameError, plain_int, require_dict
from messaging.gateway.connection.frame_tools import NO_ECHO, Connection, charge, client_message_id_of, retry_after_ms
from messaging.intake.batching import BatcherFull
from messaging.requests.selectors import outcome_stored
from messaging.requests.server_requests import AnswerRefused, server_request_answer
from messaging.requests.sessions import (
    client_session_belongs,
    client_session_end,
    client_session_ended,
    client_session_new,
)
from messaging.requests.submit import RequestRefused, Submission
from messaging.webhooks.inline import webhook_call_inline


def _content(app: AppSnapshot, data: dict, missing: str | None = None) -> str:
    """The frame's content (`missing` where it has none), as every send's is checked; refused with the rule's code."""
    try:
        return content_require(app, data.get("content", missing))
    except SendRefused as exc:
        raise FrameError(exc.detail, data, echo=exc.problem not in NO_ECHO, code=exc.code, **exc.extra) from None


async def on_request(conn: Connection, frame: Frame) -> None:
    app = await conn.life.current_app()
    data = require_dict(frame)
    name = data.get("endpoint")
    endpoint = app.endpoint(name) if isinstance(name, str) else None
    if endpoint is None:
        raise FrameError("unknown endpoint", data, code="unknown_endpoint")
    content = _content(app, data)
    if (client_message_id := client_message_id_of(data)) is None:
        raise FrameError("a REQUEST needs a clientMessageId", data, code="invalid_request")
    charge(conn, 1, data)
    try:
        submitted = await conn.life.node.requests.submit(Submission(
            app=app, user_id=conn.life.user_id, endpoint=endpoint, content=content,
            client_message_id=client_message_id, timeout_ms=data.get("timeoutMs"), session=conn.life.client_session))
    except BatcherFull as exc:
        raise FrameError("server busy: the request was not stored; send it again later", data, code="server_busy",
                         retryAfterMs=retry_after_ms(exc.retry_after)) from None
    if isinstance(submitted, RequestRefused):
        raise FrameError(submitted.detail, data, code=submitted.code, **submitted.extra)
    if submitted.call is not None:  # its webhook's first attempt: made now, on this loop
        node = conn.life.node
        node.background(webhook_call_inline(submitted.call, node.request_readers.get(submitted.call.call.event),
                                            node.calls_settled.submit))
    await conn.write(encode("REQUEST_ACCEPTED", {"id": str(submitted.request_id), "clientMessageId": client_message_id,
                                                 **({"duplicate": True} if submitted.duplicate else {})}))
    if submitted.outcome_message_id is not None:  # asked again after its outcome: the outcome again
        stored = await run_db(outcome_stored, message_id=submitted.outcome_message_id, user_id=conn.life.user_id)
        if stored is not None:
            await conn.write(stored.frame)


async def on_answer(conn: Connection, frame: Frame) -> None:
    """RESOLVE or REJECT from a client: its answer to a request its app's server made of it."""
    app = await conn.life.current_app()
    data = require_dict(frame)
    request_id = plain_int(str(data.get("requestId", "")), BIGINT_MAX)
    if not request_id:
        raise FrameError("'requestId' must be the id of a request made of you", data, code="invalid_request")
    content = _content(app, data, missing="")
    charge(conn, 1, data)
    try:
        answered = await run_db(server_request_answer, app=app, user_id=conn.life.user_id, request_id=request_id,
                                outcome=frame.type.lower(), content=content)
    except AnswerRefused as exc:
        raise FrameError(exc.detail, data, code=exc.code) from None
    await conn.write(encode("ANSWER_ACCEPTED", {"requestId": str(request_id),
                                                **({"replay": True} if answered.replay else {})}))


async def on_close_session(conn: Connection, frame: Frame) -> None:
    """The client ends its session: what waits for it is discarded, and the connection closes."""
    life = conn.life
    discarded = await run_db(client_session_end, app_pk=life.app.pk, user_id=life.user_id,
                             session=life.client_session, reason="closed")
    await conn.write(encode("SESSION_CLOSED", {"sessionId": life.client_session, "discarded": discarded}))
    await conn.close_with(CLOSE_NORMAL, "session closed")


class WrongUser(Exception):
    """A presented sessionId that was not issued to this user of this app."""


async def session_for_login(*, app_id: str, user_id: str, presented: object) -> str:
    """The session a login belongs to: the one presented (resumed), or a new one when none was
    presented or it ended. WrongUser when it is another user's or app's (or made up)."""
    if presented is None:
        return client_session_new(app_id=app_id, user_id=user_id)
    if not isinstance(presented, str) or not client_session_belongs(presented, app_id=app_id, user_id=user_id):
        raise WrongUser
    if await run_db(client_session_ended, presented):
        return client_session_new(app_id=app_id, user_id=user_id)
    return presented
