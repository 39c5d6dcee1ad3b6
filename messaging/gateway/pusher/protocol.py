"""The Pusher protocol's frames, names and signatures, and how a Pusher channel and its events map
onto a Switchboard channel and its messages: pure functions (tests/messaging/gateway/pusher/).

**Channels.** Pusher channel `X` of an app is Switchboard channel `pusher.X` of that app: stored
with offsets, fanned out across nodes and flooded to the network like any channel, and readable
by the app's native clients under the native access rule (a grant or a public pattern naming
`pusher.X`). The prefix keeps the two namespaces apart: a Pusher public channel (anyone with the
app's key may read it) can never be a native channel the app guards with grants. A Pusher name is
what the protocol allows: 1 to 200 of `A-Z a-z 0-9 _ - = @ , . ;`. Native names have no `= , ;`
(`,` separates channels in stream URLs), so `@` escapes them in the native name: `@@` is `@`, `@e`
`=`, `@c` `,` and `@s` `;` (`presence-room;1` is `pusher.presence-room@s1`; a name with none of the
four is itself). A native `pusher.` name that is no such escape is no Pusher channel.

**Events.** A Pusher event published on a channel is stored as the message content
`{"event": name, "data": data}` (JSON text; `data` as the publisher gave it, usually a string),
with `"socket_id"` when the publisher excluded a connection (a client event's sender, the HTTP
API's `socket_id`) and `"user_id"` for a client event on a presence channel. Native readers see
that text as the message content. Going the other way, a native publish whose content is such an
object (a string `event` and a `data`) reaches Pusher clients as that event; any other content
reaches them as the event `message` with the content as its data.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from messaging.channels.names import channel_name_valid

PREFIX = "pusher."
# A signed-in user's own channel (pusher:signin): `#server-to-user-<id>` is Switchboard's `pusher-user.<id>`.
USER_CHANNEL = "#server-to-user-"
USER_PREFIX = "pusher-user."
PUSHER_NAME = re.compile(r"[A-Za-z0-9_\-=@,.;]+")
PUSHER_NAME_MAX = 200
DEFAULT_EVENT = "message"  # what a native publish that names no Pusher event is called

# Close codes (the protocol's ranges: 4000-4099 do not reconnect, 4100-4199 reconnect after a backoff,
# 4200-4299 reconnect at once, 4300-4399 other).
CLOSE_UNKNOWN_APP = 4001
CLOSE_APP_DISABLED = 4003
CLOSE_OVER_QUOTA = 4004
CLOSE_UNSUPPORTED_PROTOCOL = 4007
CLOSE_NO_PROTOCOL = 4008
CLOSE_UNAUTHORIZED = 4009
CLOSE_OVER_CAPACITY = 4100
CLOSE_RECONNECT = 4200
CLOSE_PONG_TIMEOUT = 4201
CLOSE_CLIENT_EVENT_RATE = 4301
# pusher:error codes of frames refused without closing (the 4300 range: "any other error").
ERROR_BAD_INPUT = 4300
PROTOCOL_VERSION = 7


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def frame(event: str, data: Any = None, channel: str | None = None, user_id: str | None = None) -> str:
    """A frame to a client. `data` goes as it is when a string, else as its JSON text (the protocol
    carries data as a string; pusher-js parses it)."""
    out: dict[str, Any] = {"event": event}
    if channel is not None:
        out["channel"] = channel
    out["data"] = data if isinstance(data, str) else dumps({} if data is None else data)
    if user_id is not None:
        out["user_id"] = user_id
    return dumps(out)


def error_frame(code: int | None, message: str, channel: str | None = None) -> str:
    """`pusher:error`: its data is an object (`{message, code}`), not a string, as Pusher sends it."""
    out: dict[str, Any] = {"event": "pusher:error", "data": {"code": code, "message": message}}
    if channel is not None:
        out["channel"] = channel
    return dumps(out)


def subscription_error_frame(channel: str, kind: str, error: str, status: int) -> str:
    return dumps({"event": "pusher:subscription_error", "channel": channel,
                  "data": {"type": kind, "error": error, "status": status}})


# --- channels --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelKind:
    private: bool  # needs an authorization signature (private-, private-encrypted-, presence-)
    presence: bool
    encrypted: bool
    cache: bool

    @property
    def client_events(self) -> bool:
        """Whether the protocol allows client events here: private and presence, not encrypted."""
        return self.private and not self.encrypted


def channel_kind(name: str) -> ChannelKind:
    presence = name.startswith("presence-")
    encrypted = name.startswith("private-encrypted-")
    private = presence or name.startswith("private-")
    rest = name.removeprefix("presence-").removeprefix("private-encrypted-").removeprefix("private-")
    return ChannelKind(private=private, presence=presence, encrypted=encrypted, cache=rest.startswith("cache-"))


def channel_name_problem(name: object) -> str | None:
    """Why `name` cannot be a Pusher channel here, or None."""
    if not isinstance(name, str) or not name:
        return "a channel name is required"
    if len(name) > PUSHER_NAME_MAX:
        return f"the channel name is longer than {PUSHER_NAME_MAX} characters"
    if not PUSHER_NAME.fullmatch(name):
        return "the channel name has characters other than A-Z a-z 0-9 _ - = @ , . ;"
    return None


_ESCAPE = str.maketrans({"@": "@@", "=": "@e", ",": "@c", ";": "@s"})
_UNESCAPE = {"@": "@", "e": "=", "c": ",", "s": ";"}


def name_escape(name: str) -> str:
    """A Pusher name as it is in a native name (the module doc); a prefix of a name escapes to a
    prefix of its escape (what filter_by_prefix relies on)."""
    return name.translate(_ESCAPE)


def name_unescape(text: str) -> str | None:
    """The Pusher name `text` escapes, or None when it escapes none (a lone `@`, or `@x`)."""
    if "@" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] != "@":
            out.append(text[i])
            i += 1
            continue
        if (char := _UNESCAPE.get(text[i + 1:i + 2])) is None:
            return None
        out.append(char)
        i += 2
    return "".join(out)


def switchboard_channel(name: str) -> str:
    if name.startswith(USER_CHANNEL):
        return USER_PREFIX + name[len(USER_CHANNEL):]
    return PREFIX + name_escape(name)


@lru_cache(maxsize=4096)
def pusher_channel(switchboard_name: str) -> str | None:
    if switchboard_name.startswith(USER_PREFIX):
        return USER_CHANNEL + switchboard_name[len(USER_PREFIX):]
    if not switchboard_name.startswith(PREFIX):
        return None
    name = name_unescape(switchboard_name[len(PREFIX):])
    return name if name and channel_name_problem(name) is None else None


def user_channel(user_id: str) -> str | None:
    """The Switchboard channel of a signed-in user's `#server-to-user-<id>`; None for an id it cannot name."""
    name = USER_PREFIX + user_id
    return name if channel_name_valid(name) else None


def api_channel_problem(name: object) -> str | None:
    """Why the HTTP API cannot publish on `name` (a user's channel too), or None."""
    if isinstance(name, str) and name.startswith(USER_CHANNEL):
        return None if user_channel(name[len(USER_CHANNEL):]) else "the user id is not one this server can name"
    return channel_name_problem(name)


def signin_valid(*, key: str, secret: str, socket_id: str, user_data: object, auth: object) -> bool:
    """Whether `auth` is the app's signature of `<socket_id>::user::<user_data>` (pusher:signin)."""
    if not isinstance(auth, str) or not isinstance(user_data, str):
        return False
    expected = f"{key}:{sign(secret, f'{socket_id}::user::{user_data}')}"
    return hmac.compare_digest(auth.encode(), expected.encode())


# --- signatures ------------------------------------------------------------------------------------


def sign(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def channel_auth_valid(*, key: str, secret: str, socket_id: str, channel: str, auth: object,
                       channel_data: str | None = None) -> bool:
    """Whether `auth` ("<key>:<hex HMAC-SHA256(secret, socket_id:channel[:channel_data])>") is the
    app's authorization of this socket for this channel; compared in constant time."""
    if not isinstance(auth, str):
        return False
    given_key, _, signature = auth.partition(":")
    text = f"{socket_id}:{channel}" if channel_data is None else f"{socket_id}:{channel}:{channel_data}"
    expected = f"{key}:{sign(secret, text)}"
    return hmac.compare_digest(f"{given_key}:{signature}".encode(), expected.encode())


# --- events as channel messages ---------------------------------------------------------------------


def envelope(event: str, data: Any, *, socket_id: str | None = None, user_id: str | None = None) -> str:
    """The channel message content of a Pusher event."""
    out: dict[str, Any] = {"event": event, "data": data}
    if socket_id:
        out["socket_id"] = socket_id
    if user_id is not None:
        out["user_id"] = user_id
    return dumps(out)


@dataclass(frozen=True)
class Event:
    name: str
    data: str  # as it goes to the client
    socket_id: str | None = None  # the connection it must not reach
    user_id: str | None = None


def envelope_read(content: str) -> Event:
    """The Pusher event a channel message stands for (see the module doc)."""
    parsed: Any = None
    if content[:1] == "{":
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("event"), str) and "data" in parsed:
        data = parsed["data"]
        socket_id, user_id = parsed.get("socket_id"), parsed.get("user_id")
        return Event(name=parsed["event"], data=data if isinstance(data, str) else dumps(data),
                     socket_id=socket_id if isinstance(socket_id, str) else None,
                     user_id=str(user_id) if user_id is not None else None)
    return Event(name=DEFAULT_EVENT, data=content)


def event_frame(channel: str, event: Event, offset: int | None = None) -> str:
    """A channel's event as a client reads it; `offset` (an extension) only for clients that opted in."""
    out: dict[str, Any] = {"event": event.name, "channel": channel, "data": event.data}
    if event.user_id is not None:
        out["user_id"] = event.user_id
    if offset is not None:
        out["offset"] = offset
    return dumps(out)
