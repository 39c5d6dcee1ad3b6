"""The client WebSocket protocol (PROTOCOL.md section 1): frame parsing and frame building.

Parsing never raises past this module: a bad frame becomes a `FrameError` whose reason goes back
to the client as INVALID_MESSAGE, and the connection keeps working.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FEATURE_RELIABLE = "RELIABLE"
FEATURE_FAST = "FAST"
FETCH_MAX = 2000

CLIENT_TYPES = {
    "AUTH_CLIENT", "MESSAGE", "GROUP_MESSAGE", "FETCH_MISSING_MESSAGES_REQUEST", "CLOSE_CONNECTION",
    "ACK", "PING", "PONG", "SUBSCRIBE", "UNSUBSCRIBE",
}

# Close codes (PROTOCOL.md).
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_RESTART = 1012
CLOSE_AUTH_TIMEOUT = 4001


class FrameError(Exception):
    def __init__(self, reason: str, data: Any = None, **extra: Any):
        super().__init__(reason)
        self.reason = reason
        self.data = data
        self.extra = extra


@dataclass(frozen=True)
class Frame:
    type: str
    data: Any
    reference: str | None
    feature: str
    confirmation_enabled: bool
    raw: dict


def parse_frame(text: str | None) -> Frame:
    if text is None:
        raise FrameError("binary frames are not supported; send JSON text")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise FrameError("malformed JSON") from None
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
    if reference is not None and not isinstance(reference, (str, int)):
        raise FrameError("reference must be a string", raw.get("data"))
    confirmation = raw.get("confirmationEnabled", True)
    return Frame(
        type=frame_type,
        data=raw.get("data"),
        reference=None if reference is None else str(reference)[:256],
        feature=feature,
        confirmation_enabled=confirmation is not False,
        raw=raw,
    )


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


def encode(frame_type: str, data: Any, reference: str | None = None) -> str:
    """A server frame; absent/null fields are omitted (PROTOCOL.md)."""
    frame: dict[str, Any] = {"type": frame_type, "data": data}
    if reference not in (None, ""):
        frame["reference"] = reference
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def invalid(reason: str, data: Any = None, **extra: Any) -> str:
    payload: dict[str, Any] = {"reason": reason, **extra}
    if data is not None:
        payload["data"] = data
    return encode("INVALID_MESSAGE", payload)


def delivery_frame(*, kind: str, sender: str, content: str, reference: str, message_id: int, seq: int) -> str:
    """The frame a recipient gets for a stored message (MESSAGE or MESSAGE_CONFIRMATION)."""
    if kind == "confirmation":
        return encode("MESSAGE_CONFIRMATION", {"reference": reference, "id": str(message_id), "seq": seq})
    return encode("MESSAGE", {"from": sender, "content": content, "id": str(message_id), "seq": seq}, reference or None)
