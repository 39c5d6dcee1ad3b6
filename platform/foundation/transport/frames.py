"""Frame encoding and close codes shared by every WebSocket and stream endpoint.

Encoding is strict on purpose: `allow_nan=False` (NaN and Infinity are not JSON, and a client's
parser may choke on them), and text that cannot be UTF-8 encoded (a lone surrogate) never reaches
a socket: daphne would raise while writing and kill the connection.
"""

from __future__ import annotations

import json
from typing import Any

# Close codes (docs/protocol.md).
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # auth refused, rate limit, too many connections, origin not allowed
CLOSE_TOO_BIG = 1009  # a frame over the size limit
CLOSE_INTERNAL = 1011
CLOSE_RESTART = 1012  # service restart / drain / this node was declared dead: reconnect, with jitter
CLOSE_TRY_AGAIN = 1013  # the server is overloaded: reconnect later
CLOSE_AUTH_TIMEOUT = 4001  # not authenticated in time
CLOSE_SLOW_READER = 4002  # the client read too slowly: its outgoing buffer overflowed
CLOSE_FRAME_FLOOD = 4003  # the client sent frames (or bytes) faster than the server could take them

CLOSE_REASONS = {
    CLOSE_NORMAL: "normal closure",
    CLOSE_POLICY: "policy violation",
    CLOSE_TOO_BIG: "frame too large",
    CLOSE_INTERNAL: "internal error",
    CLOSE_RESTART: "service restart: reconnect",
    CLOSE_TRY_AGAIN: "overloaded: try again later",
    CLOSE_AUTH_TIMEOUT: "not authenticated in time",
    CLOSE_SLOW_READER: "slow reader: outgoing buffer full",
    CLOSE_FRAME_FLOOD: "too many frames or bytes in flight",
}


# Made once: json.dumps with arguments of its own builds an encoder per call (a fifth of a frame's
# encoding, on the hot path of every frame a node writes).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON text for the wire; raises ValueError on NaN/Infinity."""
    return _ENCODER.encode(value)


def is_wire_safe(text: str) -> bool:
    """False when `text` holds a lone surrogate, which no UTF-8 socket can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode(frame_type: str, data: Any, reference: str | None = None) -> str:
    """A server frame of the client protocol; absent/null fields are omitted."""
    frame: dict[str, Any] = {"type": frame_type, "data": data}
    if reference not in (None, ""):
        frame["reference"] = reference
    return dumps(frame)
