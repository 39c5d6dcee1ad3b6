"""Who is reading a stream: `?app=<appId>` names the app (public channels only), `?token=<signed
token>` shows a grant, and a stream that gives neither (the push seed's own clients:
`?channels=a,b` alone) reads the public channels of the domain's push open app, where an operator
marked one (apps_registry.models.ClientApp.push_open; never on a production node); which channels
they may read is messaging.channels.access's one rule."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs

import jwt
from django.conf import settings

from apps_registry.selectors import AppSnapshot, app_snapshot_by_app_id, push_open_app
from messaging.channels.access import ChannelRefused, Grant, channel_read_check
from messaging.channels.names import GrantError, channel_name_valid, channel_of_app
from messaging.core.protocol import plain_int

CHANNELS_REQUIRED = "'channels' query parameter required"  # the push seed's exact wording
OFFSET_DIGITS_MAX = 18
OFFSET_MAX = 10**OFFSET_DIGITS_MAX - 1  # any offset of this many digits fits a bigint
APP_ID = re.compile(r"[\x21-\x7e]{1,128}")  # what an appId can be; anything else is no app, and costs no query


class StreamRefused(Exception):
    def __init__(self, status: int, error: str, detail: str = ""):
        super().__init__(detail or error)
        self.status, self.error, self.detail = status, error, detail

    def body(self) -> dict:
        return {"error": self.error} if not self.detail else {"error": self.error, "detail": self.detail}


@dataclass(frozen=True)
class StreamIdentity:
    app: AppSnapshot
    channels: tuple[str, ...]
    user_id: str | None  # a token's `sub`, when it names one


def query_params(query_string: bytes) -> dict[str, str]:
    """The last value of each parameter, percent-decoded as UTF-8 (what cannot be decoded becomes
    U+FFFD, which no parameter accepts)."""
    return {k: v[-1] for k, v in parse_qs(query_string.decode("latin-1")).items()}


def header_text(scope: dict, name: str) -> str | None:
    """A request header as text; StreamRefused (400) when it is not printable ASCII."""
    wanted = name.lower().encode()
    for key, value in scope.get("headers") or ():
        if key.lower() == wanted:
            if not all(0x20 <= b < 0x7F for b in value):
                raise StreamRefused(400, "invalid_request", f"the {name} header must be printable ASCII")
            return value.decode("ascii")
    return None


def _offset(text: str) -> int | None:
    """A channel offset in plain ASCII digits ('²' and '١٢' are digits to str.isdigit and int(),
    not to us), short enough to be a bigint whatever its digits; else None."""
    return plain_int(text, OFFSET_MAX)


def resume_offsets(text: str | None, channels: tuple[str, ...], *, source: str) -> dict[str, int]:
    """`news:12,sport:7` (or a bare `12` for every channel): where each channel resumes after.
    Channels the stream does not read are ignored; anything malformed is StreamRefused (400),
    naming `source` (the header or query parameter it came in)."""
    if not text:
        return {}
    text = text.strip()
    single = _offset(text)
    if single is not None:
        return {name: single for name in channels}
    offsets = {}
    for part in text.split(","):
        name, colon, raw = part.rpartition(":")
        offset = _offset(raw)
        if not colon or offset is None:
            raise StreamRefused(400, "invalid_request", f"{source} must be an offset or channel:offset pairs separated "
                                                        f"by commas, each offset 0 to {OFFSET_DIGITS_MAX} ASCII digits")
        if name in channels:
            offsets[name] = offset
    return offsets


def event_id(positions: dict[str, int]) -> str:
    """The SSE event id: every channel's offset, so Last-Event-ID resumes them all."""
    return ",".join(f"{name}:{offset}" for name, offset in sorted(positions.items()))


def stream_identity(params: dict[str, str]) -> StreamIdentity:
    raw = params.get("channels", "")
    channels = tuple(dict.fromkeys(c.strip() for c in raw.split(",") if c.strip()))
    if not channels:
        raise StreamRefused(400, CHANNELS_REQUIRED)
    if len(channels) > settings.PUSH_MAX_CHANNELS:
        raise StreamRefused(400, "too_many_channels", f"at most {settings.PUSH_MAX_CHANNELS} channels per stream")
    bad = [c for c in channels if not channel_name_valid(c)]
    if bad:
        raise StreamRefused(400, "invalid_channel", f"'{bad[0][:130]}' is not a channel name (A-Z a-z 0-9 _ . - @)")
    token = params.get("token")
    app_id = params.get("app")
    if token:
        if not app_id:
            try:
                app_id = jwt.decode(token, options={"verify_signature": False}).get("app")
            except jwt.PyJWTError:
                raise StreamRefused(401, "unauthorized", "invalid token") from None
        app = app_snapshot_by_app_id(app_id) if isinstance(app_id, str) and APP_ID.fullmatch(app_id) else None
        if app is None:
            raise StreamRefused(401, "unauthorized", "unknown app: name it with ?app= or the token's 'app' claim")
        grant = Grant(app, token)
        try:
            user = grant.claims().get("sub")
        except GrantError as exc:
            raise StreamRefused(401, "unauthorized", str(exc)) from None
    elif app_id:
        app = app_snapshot_by_app_id(app_id) if APP_ID.fullmatch(app_id) else None
        if app is None:
            raise StreamRefused(401, "unauthorized", "unknown app")
        grant, user = None, None
    else:
        app = push_open_app()  # the push seed's bare request: the open app's, when there is one
        if app is None:
            raise StreamRefused(401, "unauthorized", "give ?app=<appId> for public channels, or ?token=<signed token>")
        grant, user = None, None
    refused = [c for c in channels if not _readable(app, c, user, grant)]
    if refused:
        raise StreamRefused(403, "forbidden", f"channel '{refused[0]}' is neither public nor granted")
    return StreamIdentity(app=app, channels=channels, user_id=user)


def _readable(app: AppSnapshot, channel: str, user_id: str | None, grant: Grant | None) -> bool:
    if not channel_of_app(app, channel):
        return False
    try:
        channel_read_check(app, channel, user_id=user_id, grant=grant)
    except ChannelRefused:
        return False
    return True
