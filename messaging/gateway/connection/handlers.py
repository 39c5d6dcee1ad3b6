"""What each client frame on /ws does (docs/protocol.md). The consumer (messaging.gateway.consumers) parses
a frame, checks its budget and calls the handler named for its type in `HANDLERS`; a handler checks
what the frame asks for, calls one service, and writes the answer. A refusal is a FrameError (the
client gets INVALID_MESSAGE, and the connection keeps working).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from apps_registry.selectors import AppSnapshot, user_id_parse
from foundation.asyncdb import run_db
from foundation.logs import loggable
from foundation.outbound import claim_token
from foundation.transport.frames import CLOSE_POLICY, CLOSE_TRY_AGAIN, encode
from messaging.channels.access import ChannelRefused, Grant, channel_name_require, channel_read_check
from messaging.core import metrics
from messaging.core.accept import USER_ID_MAX, SendRefused, content_require, recipients_require, user_require
from messaging.core.delivery.delivered import deliveries_mark_delivered
from messaging.core.delivery.fast import message_fast_send_async
from messaging.core.delivery.fetch import missing_fetch
from messaging.core.presence_notices import master_announce
from messaging.core.protocol import (
    FEATURE_FAST,
    FETCH_MAX,
    Frame,
    FrameError,
    accepted_frame,
    message_ids,
    require_dict,
    require_str,
)
from messaging.core.store import OutgoingMessage
from messaging.gateway.connection.admission import FirstReadsFor
from messaging.gateway.connection.frame_tools import (
    NO_ECHO,
    Connection,
    Handler,
    charge,
    client_message_id_of,
    retry_after_ms,
)
from messaging.gateway.connection.life import Refusal
from messaging.gateway.connection.request_frames import (
    WrongUser,
    on_answer,
    on_close_session,
    on_request,
    session_for_login,
)
from messaging.intake.batching import BatcherFull
from messaging.models import MessageKind
from presence.master_view import MasterView
from presence.services import master_snapshot, user_disconnect_everywhere

log = logging.getLogger(__name__)


# --- authentication ------------------------------------------------------------------------------


async def on_auth_client(conn: Connection, frame: Frame) -> None:
    data = require_dict(frame)
    app_id, user_id = require_str(data, "appId"), require_str(data, "userId", max_len=USER_ID_MAX)
    token = data.get("token") if isinstance(data.get("token"), str) else ""
    headers = dict(conn.scope.get("headers") or [])
    client = conn.scope.get("client") or ("", 0)
    life = conn.life
    try:
        session = await session_for_login(app_id=app_id, user_id=user_id, presented=data.get("sessionId"))
    except WrongUser:
        admitted: Refusal | bool = Refusal("wrong_user: the sessionId is not this user's", CLOSE_POLICY)
    else:
        admitted = await life.admit(
            app_id=app_id, user_id=user_id, token=token, acks=data.get("acks") is True,
            origin=headers.get(b"origin", b"").decode("latin-1") or None, remote_addr=str(client[0] or ""),
            user_agent=headers.get(b"user-agent", b"").decode(errors="replace"), client_session=session)
    if isinstance(admitted, Refusal):
        # The linker reply (strict clients compare it); the reason travels in the close frame. A user
        # homed in another domain also gets that domain's WebSocket URL (the extension `redirect`).
        metrics.AUTH.labels("refused").inc()
        log.info("refused %s: %s", loggable(user_id), loggable(admitted.reason))  # client input: one line
        reply = {"appId": app_id, "userId": user_id, "isAuthenticated": False}
        if admitted.redirect:
            reply["redirect"] = admitted.redirect
        await conn.write(encode("AUTH_CLIENT_REPLY", reply))
        await conn.close_with(admitted.code, admitted.reason)
        return
    conn.admitted()
    metrics.AUTH.labels("admitted").inc()
    await conn.write(encode("AUTH_CLIENT_REPLY", {"appId": app_id, "userId": user_id, "isAuthenticated": True,
                                                  "sessionId": session}))
    app, node = life.app, life.node
    if user_id == app.master_user_id and not await _master_catch_up(conn, app):
        return
    if admitted:  # the user's first connection: its user.connected webhook was committed with its session
        await master_announce(app=app, user_id=user_id, connected=True, lookup=node.master_lookups.submit)
    # Read for a whole batch of connections at once (messaging.gateway.connection.admission).
    reads = await node.first_reads.submit(FirstReadsFor(app_id=app.pk, user_id=user_id, acks=life.acks))
    # ACK mode: left behind by a connection that could not give them back (its node crashed): they
    # come again, with the same ids.
    node.routing.add(reads.unacked)
    # The user's server-managed subscriptions: read live from now (SUBSCRIBE with `since` replays
    # what was missed).
    conn.durable.update(reads.channels)
    for name in sorted(conn.durable):
        await conn.channels.join(name)


async def _master_catch_up(conn: Connection, app: AppSnapshot) -> bool:
    """The master user's snapshot of who is online, written before any announcement.

    admit registered this connection in presence, so every USER_CONNECTED / USER_DISCONNECTED made
    from then on is queued for it on the channel layer; the snapshot is read after that, and the
    consumer handles one event at a time (messaging.gateway.connection.inbox: its one loop dispatches a
    channel-layer event only once this frame's handler returns), so the snapshot
    frames go out before any of them. An announcement made before the read that arrives after it
    agrees with the snapshot: the client applies the snapshot, then the events in order. Without
    a snapshot the master's view could not be trusted: the connection closes with 1013 instead.
    """
    try:
        users, frames = await master_snapshot(app_name=app.app_name, master_user_id=app.master_user_id)
    except Exception:
        log.exception("reading the online users of %s for its master failed", app.app_name)
        await conn.close_with(CLOSE_TRY_AGAIN, "presence unavailable; reconnect later")
        return False
    for frame in frames:
        await conn.write(frame)
    conn.master_watch(MasterView(set(users)))
    return True


async def on_reauth(conn: Connection, frame: Frame) -> None:
    raise FrameError("already authenticated; open a new connection to change user", frame.data)


# --- sending -------------------------------------------------------------------------------------

# How /ws words a refusal of messaging.core.accept's rules (its clients know these reasons).
_REASONS = {
    "not_text": "missing or invalid recipient in 'to' (a user id string)",
    "not_user_id": "recipient '{subject}' is not a user id (<appName>-<digits>, no leading zero)",
    "other_app": "recipient '{subject}' belongs to another app",
    "not_distributed": "unknown recipient '{subject}' (no user distribution covers it)",
    "no_recipients": "'to' must be a non-empty list of user ids",
    "too_many_recipients": "at most {limit} recipients per group message",
    "content_not_text": "missing or invalid 'content' (a string)",
}


def _refused(exc: SendRefused, data: Any) -> FrameError:
    template = _REASONS.get(exc.problem)
    subject = exc.subject[:USER_ID_MAX] if isinstance(exc.subject, str) else exc.subject
    reason = template.format(subject=subject, **exc.extra) if template else exc.detail
    return FrameError(reason, data, echo=exc.problem not in NO_ECHO, **exc.extra)


async def on_message(conn: Connection, frame: Frame) -> None:
    app = await conn.life.current_app()
    data = require_dict(frame)
    try:
        to = user_require(app, data.get("to"), role="recipient")
        content = content_require(app, data.get("content"))
    except SendRefused as exc:
        raise _refused(exc, data) from None
    client_message_id = client_message_id_of(data)
    charge(conn, 1, data)
    if frame.feature == FEATURE_FAST:
        await message_fast_send_async(app=app, sender=conn.life.user_id, recipients=[to], content=content,
                                      reference=frame.reference, lookup=conn.life.node.fast_lookups.submit)
        return
    await _store(conn, frame, data, OutgoingMessage(
        app_id=app.pk, sender=conn.life.user_id, recipients=(to,), content=content, reference=frame.reference or "",
        client_message_id=client_message_id, confirmation_requested=bool(frame.reference) and frame.confirmation_enabled,
    ))


async def on_group_message(conn: Connection, frame: Frame) -> None:
    app = await conn.life.current_app()
    data = require_dict(frame)
    to = data.get("to")
    try:
        recipients = recipients_require(app, to if isinstance(to, list) else ())
        content = content_require(app, data.get("content"))
    except SendRefused as exc:
        raise _refused(exc, data) from None
    client_message_id = client_message_id_of(data)
    charge(conn, len(recipients), data)
    if frame.feature == FEATURE_FAST:
        await message_fast_send_async(app=app, sender=conn.life.user_id, recipients=recipients, content=content,
                                      reference=frame.reference, lookup=conn.life.node.fast_lookups.submit)
        return
    # One message row with a delivery per recipient: its clientMessageId is held to the same
    # (app, sender, clientMessageId) constraint as MESSAGE's, so a resend stores and routes nothing.
    await _store(conn, frame, data, OutgoingMessage(
        app_id=app.pk, sender=conn.life.user_id, recipients=tuple(recipients), content=content,
        kind=MessageKind.GROUP, reference=frame.reference or "", client_message_id=client_message_id,
    ))


async def _store(conn: Connection, frame: Frame, data: dict, message: OutgoingMessage) -> None:
    """RELIABLE: through the node's intake (group commit); answered once committed."""
    try:
        result = await conn.life.node.intake.submit(message)
    except BatcherFull as exc:
        metrics.INTAKE_REFUSED.inc()
        raise FrameError("server busy: the message was not stored; send it again later", data,
                         retryAfterMs=retry_after_ms(exc.retry_after)) from None
    if conn.life.acks or conn.answers_sends:
        await conn.write(accepted_frame(message_id=result.message_id, client_message_id=message.client_message_id,
                                        reference=frame.reference, duplicate=result.duplicate,
                                        recipients=len(message.recipients)))


# --- the mailbox ---------------------------------------------------------------------------------


async def on_fetch(conn: Connection, frame: Frame) -> None:
    data = require_dict(frame)
    count = data.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise FrameError("'count' must be a positive integer", data)
    life, ledger = conn.life, conn.ledger
    claim = claim_token() if life.acks else None  # ACK mode: what is fetched waits for its ACK
    result = await run_db(missing_fetch, app_id=life.app.pk, user_id=life.user_id,
                          count=ledger.fetch_room(min(count, FETCH_MAX)), skip_ids=ledger.skip_ids(), claim=claim)
    written = 0  # (a twin of a message the connection holds is not written, and counts as handed over)
    for item in result.items:
        if not ledger.twin(item.delivery_id, item.message_id, claim):
            if not await conn.write(item.frame):
                break
            ledger.wrote(item.delivery_id, item.message_id, claim)
        written += 1
    for item in result.items[written:]:
        ledger.not_written(item.delivery_id, claim)
    life.settle(ledger.batch_end(conn.write_position()))
    await conn.write(encode("FETCH_MISSING_MESSAGES_COMPLETE",
                            {"leftMissingCount": result.left + len(result.items) - written}))


async def on_ack(conn: Connection, frame: Frame) -> None:
    data = require_dict(frame)
    delivered, strays = conn.ledger.acked(message_ids(data.get("ids"), data))
    life = conn.life
    if delivered:
        life.node.delivered.add(delivered)
    if strays:
        # Not in flight here (an ACK after a reconnect, say): looked up in the database, so it
        # costs work like a send.
        charge(conn, 1, data)
        await run_db(deliveries_mark_delivered, message_ids=strays, recipient=life.user_id, route=life.node.route)


# --- the master user, and keeping the connection alive --------------------------------------------


async def on_close_connection(conn: Connection, frame: Frame) -> None:
    app = conn.life.app
    if conn.life.user_id != app.master_user_id:
        raise FrameError("only the app's master user may close connections", frame.data)
    data = require_dict(frame)
    target = require_str(data, "userId", max_len=USER_ID_MAX)
    parsed = user_id_parse(target)
    if parsed is None or parsed.app_name != app.app_name:
        raise FrameError(f"'{target}' is not a user of this app", data)
    await user_disconnect_everywhere(user_id=target, reason="closed by the master user")


async def on_ping(conn: Connection, frame: Frame) -> None:
    await conn.write(encode("PONG", {}))


async def on_pong(conn: Connection, frame: Frame) -> None:
    return None


# --- channels --------------------------------------------------------------------------------------

_CHANNEL_NAME = ("'channel' must be a channel name of this app (A-Z a-z 0-9 _ . - @, at most 128; "
                 "pusher.<name>, at most 407)")


def _channel_name(app: AppSnapshot, data: dict) -> str:
    try:
        return channel_name_require(app, data.get("channel"))
    except SendRefused:
        raise FrameError(_CHANNEL_NAME, data) from None


async def on_subscribe(conn: Connection, frame: Frame) -> None:
    app = await conn.life.current_app()
    data = require_dict(frame)
    name = _channel_name(app, data)
    since = data.get("since")
    if since is not None and (isinstance(since, bool) or not isinstance(since, int) or since < 0):
        raise FrameError("'since' must be an offset (an integer, 0 or more)", data)
    durable = name in conn.durable  # the app's server subscribed this user
    if not durable and not app.client_subscriptions_allowed:
        raise FrameError("client subscriptions are not allowed for this app", data)
    token = data.get("token")
    grant = Grant(app, token) if isinstance(token, str) and token else None
    try:
        channel_read_check(app, name, user_id=conn.life.user_id, grant=grant, durable=durable)
    except ChannelRefused as exc:
        raise FrameError(exc.detail, data) from None
    channels = conn.channels
    if name not in channels and len(channels) >= settings.WS_MAX_CHANNELS:
        raise FrameError(f"at most {settings.WS_MAX_CHANNELS} channels per connection", data,
                         limit=settings.WS_MAX_CHANNELS)
    offset = await channels.join(name, since=since)
    await conn.write(encode("SUBSCRIBED", {"channel": name, "offset": offset}))


async def on_unsubscribe(conn: Connection, frame: Frame) -> None:
    data = require_dict(frame)
    name = _channel_name(conn.life.app, data)
    await conn.channels.leave(name)
    await conn.write(encode("UNSUBSCRIBED", {"channel": name}))


HANDLERS: dict[str, Handler] = {
    "MESSAGE": on_message,
    "REQUEST": on_request,
    "CLOSE_SESSION": on_close_session,
    "RESOLVE": on_answer,
    "REJECT": on_answer,
    "GROUP_MESSAGE": on_group_message,
    "FETCH_MISSING_MESSAGES_REQUEST": on_fetch,
    "ACK": on_ack,
    "CLOSE_CONNECTION": on_close_connection,
    "PING": on_ping,
    "PONG": on_pong,
    "SUBSCRIBE": on_subscribe,
    "UNSUBSCRIBE": on_unsubscribe,
    "AUTH_CLIENT": on_reauth,
}
