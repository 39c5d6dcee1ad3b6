"""The client WebSocket protocol (docs/protocol.md): frame parsing and frame building.

Parsing never raises past this module: a bad frame becomes a `FrameError` whose reason goes back
to the client as INVALID_MESSAGE, and the connection keeps working.

What a frame may carry is checked once, here, before any handler sees it: JSON only (NaN and
Infinity are not JSON), and no string anywhere in it may hold a lone surrogate (no UTF-8 socket can
carry one back, and echoing it killed the connection) or a NUL character (Postgres text cannot
store it). Such a frame is refused without echoing its data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from foundation.transport.frames import encode

FEATURE_RELIABLE = "RELIABLE"
FEATURE_FAST = "FAST"
FETCH_MAX = 2000  # messages per FETCH_MISSING_MESSAGES_REQUEST (the linker protocol's cap)
ACK_MAX_IDS = 2000  # ids per ACK
REFERENCE_MAX = 256
BIGINT_MAX = 2**63 - 1  # ids and offsets are Postgres bigints
ACK_ID_STRING_MAX = 10**18 - 1  # an ACK id written as a string: at most 18 digits
CLIENT_MESSAGE_ID_MAX = 128
# clientMessageIds of this prefix are the queue intake's (`sbq:<domain>:<entry id>`, messaging.intake.stream.consume):
# a client's MESSAGE with one is refused, so no client can take an id a queued send will use first.
QUEUE_CLIENT_MESSAGE_ID_PREFIX = "sbq:"

CLIENT_TYPES = {
    "AUTH_CLIENT", "MESSAGE", "GROUP_MESSAGE", "FETCH_MISSING_MESSAGES_REQUEST", "CLOSE_CONNECTION",
    "ACK", "PING", "PONG", "SUBSCRIBE", "UNSUBSCRIBE", "REQUEST", "CLOSE_SESSION",
    "RESOLVE", "REJECT",
}


class FrameError(Exception):
    """A refused frame: INVALID_MESSAGE with `reason`, the frame's data echoed (or `data` instead),
    unless `echo` is off (the data is large, or holds what no socket can carry back)."""

    def __init__(self, reason: str, data: Any = None, *, echo: bool = True, **extra: Any):
        super().__init__(reason)
        self.reason = reason
        self.data = data
        self.echo = echo
        self.extra = extra


@dataclass(frozen=True)
class Frame:
    type: str
    data: Any
    reference: str | None
    feature: str
    confirmation_enabled: bool
    raw: dict


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once (json.loads with parse_constant builds a decoder per call, on every client frame).
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, depth + 1)


def unsafe_string(raw: Any) -> str | None:
    """Why some string in `raw` (a frame, or a REST API body) cannot be taken, or None."""
    for text in _strings(raw):
        if "\x00" in text:
            return "strings must not contain NUL (\\u0000)"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "strings must be valid Unicode (a lone surrogate such as \\udc00 is not)"
    return None


def parse_frame(text: str | None) -> Frame:
    if text is None:
        raise FrameError("binary frames are not supported; send JSON text")
    try:
        raw = _DECODER.decode(text)
    except (ValueError, RecursionError):
        raise FrameError("malformed JSON") from None
    # Only escapes (\u0000, \udc00) can put these characters into decoded strings: the raw text
    # came off the socket as valid UTF-8, and JSON refuses raw control characters in strings.
    return frame_of(raw, escaped="\\u" in text or "\\U" in text)


def frame_of(raw: Any, *, escaped: bool = True) -> Frame:
    """A client frame from its decoded JSON (`escaped`: its text held \\u escapes, so its strings
    are checked for what no socket can carry). Also how messaging.gateway.socketio turns an event into the
    frame it stands for."""
    if escaped:
        problem = unsafe_string(raw)
        if problem:
            raise FrameError(problem)
    if not isinstance(raw, dict):
        raise FrameError("a frame must be a JSON object with 'type' and 'data'")
    frame_type = raw.get("type")
    if not isinstance(frame_type, str) or not frame_type:
        raise FrameError("missing 'type'", raw.get("data"))
    if frame_type not in CLIENT_TYPES:
        raise FrameError(f"unknown type '{frame_type[:64]}'", raw.get("data"))
    feature = raw.get("feature") or FEATURE_RELIABLE
    if feature not in (FEATURE_RELIABLE, FEATURE_FAST):
        raise FrameError("feature must be RELIABLE or FAST", raw.get("data"))
    reference = raw.get("reference")
    if reference is not None and (isinstance(reference, bool) or not isinstance(reference, (str, int))):
        raise FrameError("reference must be a string", raw.get("data"))
    if isinstance(reference, str) and len(reference) > REFERENCE_MAX:
        raise FrameError(f"reference must be at most {REFERENCE_MAX} characters", raw.get("data"))
    confirmation = raw.get("confirmationEnabled", True)
    return Frame(
        type=frame_type,
        data=raw.get("data"),
        reference=None if reference is None else str(reference)[:REFERENCE_MAX],
        feature=feature,
        confirmation_enabled=confirmation is not False,
        raw=raw,
    )


def plain_int(text: str, high: int) -> int | None:
    """A whole number 0..high written in plain ASCII digits, or None. str.isdigit and int() take
    '²', '١٢' and '１２' too, and int() raises on more than 4300 digits: client input never reaches
    either unchecked."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(high)):
        return None
    number = int(text)
    return number if number <= high else None


def require_dict(frame: Frame) -> dict:
    if not isinstance(frame.data, dict):
        raise FrameError("'data' must be an object", frame.data)
    return frame.data


def require_str(data: dict, key: str, *, max_len: int = 256) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise FrameError(f"missing or invalid '{key}'", data)
    if len(value) > max_len:
        raise FrameError(f"'{key}' is too long", data)
    return value


def message_ids(values: Any, data: Any) -> list[int]:
    """ACK ids: server message ids as strings (as sent) or integers, within a bigint."""
    if not isinstance(values, list) or not values or len(values) > ACK_MAX_IDS:
        raise FrameError(f"'ids' must be a list of 1 to {ACK_MAX_IDS} message ids", data)
    ids = []
    for value in values:
        if isinstance(value, bool):
            raise FrameError("'ids' must hold message ids", data)
        number = value if isinstance(value, int) else plain_int(value, ACK_ID_STRING_MAX) if isinstance(value, str) else None
        if number is None:
            raise FrameError("'ids' must hold message ids (digit strings as received)", data)
        if not 0 < number <= BIGINT_MAX:
            raise FrameError("'ids' must hold message ids", data)
        ids.append(number)
    return ids


def invalid(reason: str, data: Any = None, **extra: Any) -> str:
    payload: dict[str, Any] = {"reason": reason, **extra}
    if data is not None:
        payload["data"] = data
    return encode("INVALID_MESSAGE", payload)


# The stored frames of requests (messaging.requests): their request's ids ride in the message's
# `reference` as compact JSON (at most 256 characters with a clientMessageId of 128), so the frame
# can be built wherever the message is (a fetch, a push, another domain it was forwarded to). The
# session (`s`) is the router's, never the client's frame.
REQUEST_FRAME_TYPES = {"resolve": "RESOLVE", "reject": "REJECT", "server_request": "SERVER_REQUEST"}
REQUEST_META_KEYS = {"r": "requestId", "c": "clientMessageId", "x": "reason"}


def request_meta(*, request_id: int, client_message_id: str | None = None, reason: str = "",
                 session: str = "") -> str:
    """A request frame's ids, as kept in its message's `reference`."""
    meta: dict[str, str] = {"r": str(request_id)}
    if client_message_id is not None:
        meta["c"] = client_message_id
    if reason:
        meta["x"] = reason
    if session:
        meta["s"] = session
    return json.dumps(meta, separators=(",", ":"), ensure_ascii=False)


def request_meta_read(reference: str) -> dict[str, str]:
    try:
        meta = json.loads(reference) if reference else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def delivery_frame(*, kind: str, sender: str, content: str, reference: str, message_id: int, seq: int) -> str:
    """The frame a recipient gets for a stored message (MESSAGE, MESSAGE_CONFIRMATION, or a request's
    RESOLVE, REJECT or SERVER_REQUEST)."""
    if kind == "confirmation":
        return encode("MESSAGE_CONFIRMATION", {"reference": reference, "id": str(message_id), "seq": seq})
    if kind in REQUEST_FRAME_TYPES:
        meta = request_meta_read(reference)
        data: dict[str, Any] = {"id": str(message_id)}
        data.update((name, meta[key]) for key, name in REQUEST_META_KEYS.items() if key in meta)
        data.update(content=content, seq=seq)
        return encode(REQUEST_FRAME_TYPES[kind], data)
    return encode("MESSAGE", {"from": sender, "content": content, "id": str(message_id), "seq": seq}, reference or None)


def fast_frame(*, sender: str, content: str, reference: str | None) -> str:
    """The frame a recipient gets for a FAST message: never stored, so no `id` or `seq`."""
    return encode("MESSAGE", {"from": sender, "content": content}, reference)


def accepted_frame(*, message_id: int, client_message_id: str | None, reference: str | None, duplicate: bool,
                   recipients: int) -> str:
    """MESSAGE_ACCEPTED (ACK-mode senders): the message is stored; resend whatever never got one."""
    data: dict[str, Any] = {"id": str(message_id), "recipients": recipients}
    if client_message_id is not None:
        data["clientMessageId"] = client_message_id
    if duplicate:
        data["duplicate"] = True
    return encode("MESSAGE_ACCEPTED", data, reference)


# An EVENT frame's data: one event of the app's ordered event exchange (messaging.exchange). The
# functional form because `from` is a keyword; `from` and `to` are null where the kind has none.
EventData = TypedDict("EventData", {"seq": int, "kind": str, "from": int | None, "to": int | None})


def event_frame(*, seq: int, kind: str, sender: int | None, to: int | None) -> str:
    """EVENT: `{"type": "EVENT", "data": {"seq": 43, "kind": "P", "from": 32, "to": 56}}`."""
    data: EventData = {"seq": seq, "kind": kind, "from": sender, "to": to}
    return encode("EVENT", data)
