"""Channel names, and who may read a channel.

A channel name is 1 to 128 of `A-Z a-z 0-9 _ . - @`; no ':' or ',' (they separate channels and
offsets in stream URLs and SSE event ids). `@<userId>` is a user's own channel: subscribing to it
is following that user. A Pusher channel's name (`pusher.` and the Pusher name, escaped:
messaging.gateway.pusher.protocol) may be up to CHANNEL_NAME_MAX: Pusher names are up to 200
characters, and each of `@ = , ;` in one takes two.

A client may read a channel when the app allows client subscriptions and the channel matches one
of the app's public patterns (`news.*`), or when the client shows a grant: an HS256 JWT signed
with the app's secret, naming the channels (exact names or patterns) in a `channels` claim, with an
`exp` no further ahead than the app's max token lifetime, and (optionally) `sub`, the only user it
is good for.

A grant is not a login token, though both are signed with the same secret and a grant may name its
user in `sub`: grants travel in URLs (stream query strings) and end up in logs and browser
histories. So a grant carries `"typ": "channel-grant"`, and AUTH_CLIENT's signed-token check
(messaging.gateway.authentication) admits only a login token: `typ` absent or "login", and no `channels`
claim. Grants signed before grants were typed (no `typ`, but a `channels` claim) are refused as
logins too; as grants they still work.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable

import jwt

from apps_registry.selectors import AppSnapshot, user_id_parse

CHANNEL_NAME = re.compile(r"pusher\.[A-Za-z0-9_.@-]{1,400}|[A-Za-z0-9_.@-]{1,128}")
# The `typ` claim of what an app's server signs with its token secret (see the module doc).
CHANNEL_GRANT_TYPE = "channel-grant"
LOGIN_TOKEN_TYPE = "login"


def token_is_login(claims: dict) -> bool:
    """Whether verified claims are a login token: `typ` absent or "login", and no channels claim (a
    grant, typed or from before grants were typed, never lets anyone in)."""
    return claims.get("typ", LOGIN_TOKEN_TYPE) == LOGIN_TOKEN_TYPE and "channels" not in claims


def channel_name_valid(name: object) -> bool:
    return isinstance(name, str) and bool(CHANNEL_NAME.fullmatch(name))


def user_channel(user_id: str) -> str:
    return f"@{user_id}"


def channel_user(name: str) -> str | None:
    """The user whose own channel this is, or None."""
    if not name.startswith("@"):
        return None
    return name[1:] if user_id_parse(name[1:]) is not None else None


def channel_of_app(app: AppSnapshot, name: str) -> bool:
    """A user's channel belongs to that user's app; any other valid name to the app that uses it."""
    user = channel_user(name)
    if name.startswith("@"):
        parsed = user_id_parse(user) if user else None
        return parsed is not None and parsed.app_name == app.app_name
    return channel_name_valid(name)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns if isinstance(p, str))


# Channels only the Pusher door's signatures open (docs/protocol.md, "Pusher protocol"): its private,
# private-encrypted and presence channels and its signed-in users' own. Never public, whatever the
# app's patterns say (a bare `*` would otherwise open them to every native reader and publisher).
PUSHER_SIGNED_PREFIXES = ("pusher.private-", "pusher.presence-", "pusher-user.")


def channel_is_public(app: AppSnapshot, name: str) -> bool:
    return not name.startswith(PUSHER_SIGNED_PREFIXES) and _matches(name, app.public_channel_patterns)


class GrantError(Exception):
    pass


def channel_grant_claims(app: AppSnapshot, token: str) -> dict:
    """The verified claims of a channel grant signed by `app`; GrantError says why not."""
    if not app.token_secret:
        raise GrantError("this app has no token secret, so it cannot grant channels")
    try:
        claims = jwt.decode(token, app.token_secret, algorithms=["HS256"], options={"require": ["exp"]})
    except jwt.ExpiredSignatureError:
        raise GrantError("channel token expired") from None
    except jwt.PyJWTError:
        raise GrantError("invalid channel token") from None
    if claims["exp"] - time.time() > app.max_token_lifetime_seconds:
        raise GrantError("channel token lifetime exceeds the app's maximum")
    if not isinstance(claims.get("channels"), list):
        raise GrantError("the channel token names no channels")
    return claims


def channel_granted(claims: dict, name: str, user_id: str | None = None) -> bool:
    if claims.get("sub") is not None and claims["sub"] != user_id:
        return False
    return _matches(name, claims["channels"])


def channel_grant_sign(*, secret: str, channels: list[str], ttl_seconds: int = 3600, user_id: str | None = None,
                       app_id: str | None = None) -> str:
    """What an app's server does to let a client read channels (tests and the README use it)."""
    claims: dict = {"typ": CHANNEL_GRANT_TYPE, "channels": channels, "exp": int(time.time()) + ttl_seconds}
    if user_id:
        claims["sub"] = user_id
    if app_id:
        claims["app"] = app_id
    return jwt.encode(claims, secret, algorithm="HS256")
