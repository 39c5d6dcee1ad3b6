"""Socket.IO events and the /ws frames they stand for (docs/protocol.md, "Socket.IO"): pure
translations, both ways, used by messaging.gateway.socketio.consumer."""

from __future__ import annotations

import json
from typing import Any

from foundation.transport.frames import CLOSE_AUTH_TIMEOUT, CLOSE_RESTART, CLOSE_TRY_AGAIN, dumps
from messaging.core.protocol import FEATURE_FAST, FEATURE_RELIABLE, FrameError

# Client events -> /ws frame types.
EVENTS = {
    "message": "MESSAGE",
    "group_message": "GROUP_MESSAGE",
    "fetch_missing": "FETCH_MISSING_MESSAGES_REQUEST",
    "ack": "ACK",
    "subscribe": "SUBSCRIBE",
    "unsubscribe": "UNSUBSCRIBE",
    "close_connection": "CLOSE_CONNECTION",
    "request": "REQUEST",
}
# Fields of an event's object that /ws carries beside `data`.
_FRAME_FIELDS = ("feature", "reference", "confirmationEnabled")

# The answer of a handler that writes none, by frame type.
DONE: dict[str, dict] = {"ACK": {}, "CLOSE_CONNECTION": {}}

# A refused login closed with one of these is not a CONNECT_ERROR: the transport closes, and the
# client comes back by itself (a drain, "try again", a login that never came).
RECONNECT_CODES = {CLOSE_RESTART, CLOSE_TRY_AGAIN, CLOSE_AUTH_TIMEOUT}

# An answer frame written when the event asked for no callback: an event of this name, or nothing.
UNANSWERED = {
    "INVALID_MESSAGE": "invalid_message",
    "GENERAL_ERROR": "invalid_message",
    "FETCH_MISSING_MESSAGES_COMPLETE": "fetch_complete",
    "SUBSCRIBED": "subscribed",
    "UNSUBSCRIBED": "unsubscribed",
    "REQUEST_ACCEPTED": "request_accepted",
}

# Stored frames of the mailbox, each an event of its own: in ACK mode emitted with an acknowledgement
# request, the client's callback being the ACK of the frame's `id`.
STORED = {"MESSAGE": "message", "MESSAGE_CONFIRMATION": "confirmation", "RESOLVE": "resolve", "REJECT": "reject",
          "SERVER_REQUEST": "server_request"}
ANSWER_SHAPE = "a server_request's callback answers {resolve: content} or {reject: content}"

# Server frames that are events of their own (the name, and the payload from the frame's data).
_PUSHED = {
    "CHANNEL_MESSAGE": "channel_message",
    "CHANNEL_MISSED": "channel_missed",
    "USER_CONNECTED": "user_connected",
    "USER_DISCONNECTED": "user_disconnected",
    "ONLINE_USERS": "online_users",
    "EVENT": "event",
}
_GENERAL_ERROR = "internal error: nothing was done; send it again"


def no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


MALFORMED = object()  # plain_event's answer for an EVENT packet whose JSON is not


def plain_event(text: str) -> tuple[Any, int | None] | object | None:
    """An EVENT packet of the default namespace without attachments (`2[...]`, `2<ack id>[...]`),
    read without building a packet object: (data, ack id); MALFORMED; or None for any other packet
    (the full parser's work)."""
    if not text.startswith("2"):
        return None
    i = 1
    while i < len(text) and text[i].isdigit() and i < 20:
        i += 1
    if i >= len(text) or text[i] != "[":
        return None
    try:
        data = json.loads(text[i:], parse_constant=no_constants)
    except (ValueError, RecursionError):
        return MALFORMED
    return data, (int(text[1:i]) if i > 1 else None)


def event_text(name: str, data: Any, ack_id: int | None = None) -> str:
    """An EVENT packet of the default namespace, `2<ack id>["name", data]`."""
    return f"2{'' if ack_id is None else ack_id}{dumps([name, data])}"


def frame_for_event(name: str, arg: Any) -> dict:
    """The /ws frame (as decoded JSON) a client event stands for; FrameError for an unknown event."""
    frame_type = EVENTS.get(name)
    if frame_type is None:
        raise FrameError(f"unknown event '{name[:64]}' (known: {', '.join(EVENTS)})")
    data = arg if isinstance(arg, dict) else {}
    raw: dict = {"type": frame_type, "data": {k: v for k, v in data.items() if k not in _FRAME_FIELDS}}
    for field in _FRAME_FIELDS:
        if field in data:
            raw[field] = data[field]
    return raw


def message_of(kind: str, data: dict, reference: str | None) -> dict:
    """`message` {id, from, content, reference?, seq, feature}, `confirmation` {reference, id}, or a
    request's outcome, `resolve` / `reject`, as the frame has it ({id, requestId, clientMessageId,
    content, seq, reason?})."""
    if kind in ("RESOLVE", "REJECT", "SERVER_REQUEST"):
        return data
    if kind == "MESSAGE_CONFIRMATION":
        return {"reference": data.get("reference"), "id": data.get("id")}
    message = {"id": data.get("id"), "from": data.get("from"), "content": data.get("content"),
               "seq": data.get("seq"), "feature": FEATURE_RELIABLE if "id" in data else FEATURE_FAST}
    if reference is not None:
        message["reference"] = reference
    return message


def answer_frame(request_id: str, args: Any) -> dict | None:
    """The RESOLVE or REJECT frame a `server_request`'s callback stands for (its first argument,
    `{resolve: content}` or `{reject: content}`; content that is not text is kept as its JSON), or
    None for any other shape."""
    answer = args[0] if isinstance(args, list) and args else None
    given = [k for k in ("resolve", "reject") if isinstance(answer, dict) and k in answer]
    if len(given) != 1:
        return None
    content = answer[given[0]]
    if not isinstance(content, str):
        content = dumps(content)
    return {"type": given[0].upper(), "data": {"requestId": request_id, "content": content}}


def error_of(kind: str, data: Any) -> dict:
    """An acknowledgement's refusal: {error: <code>, detail: <text>} (and the limit's figures)."""
    if kind == "INVALID_MESSAGE" and isinstance(data, dict):
        extra = {k: v for k, v in data.items() if k in ("retryAfterMs", "limit", "code")}
        return {"error": "INVALID_MESSAGE", "detail": str(data.get("reason", "")), **extra}
    if kind == "AUTH_REQUIRED":
        return {"error": "AUTH_REQUIRED", "detail": "not connected: send CONNECT with auth first"}
    return {"error": "GENERAL_ERROR", "detail": _GENERAL_ERROR}


def answer_of(kind: str, data: Any, collected: list[dict] | None) -> dict | None:
    """The acknowledgement a frame answers with, or None when the frame is not an answer."""
    if kind in ("INVALID_MESSAGE", "GENERAL_ERROR", "AUTH_REQUIRED"):
        return error_of(kind, data)
    if kind in ("MESSAGE_ACCEPTED", "REQUEST_ACCEPTED"):  # (a request's `id` is the request's)
        answer = {"id": data["id"]}
        answer.update({k: data[k] for k in ("clientMessageId", "duplicate") if k in data})
        return answer
    if kind == "FETCH_MISSING_MESSAGES_COMPLETE":
        left = data.get("leftMissingCount", 0)
        return {"messages": collected, "leftMissingCount": left} if collected is not None else {"leftMissingCount": left}
    if kind == "SUBSCRIBED":
        return {"channel": data["channel"], "offset": data["offset"]}
    if kind == "UNSUBSCRIBED":
        return {}
    return None


def event_of(kind: str, data: Any) -> tuple[str, Any] | None:
    """A pushed frame as a Socket.IO event (name, payload); None for what Socket.IO has no use for
    (PONG: Engine.IO keeps the connection alive itself)."""
    if kind == "CHANNEL_MESSAGE":
        return "channel_message", {"channel": data["channel"], "offset": data["offset"], "message": data["content"]}
    name = _PUSHED.get(kind)
    if name is not None:
        return name, data
    if kind == "PONG":
        return None
    return kind.lower(), data
