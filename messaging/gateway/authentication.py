"""AUTH_CLIENT: the three app auth modes of docs/protocol.md.

1. appId + user-id prefix + home domain (every mode starts here), and the browser's Origin when the
   app lists allowed origins;
2. an external auth URL asked with {appId, userId, token}: only an explicit
   {appId, userId, isAuthenticated: true} admits; a timeout, an error or anything else refuses;
3. a signed token: HMAC-SHA256 JWT with the app's secret, `sub` = userId, `exp` required and no
   further ahead than the app's max token lifetime.

The auth URL is asked through one HTTP client per event loop: building a client loads the CA
bundle (about 33 ms, on the event loop), so a client per AUTH_CLIENT froze a node in a reconnect
storm. Each call goes through foundation.outgoing: the address filter, one deadline for the whole
exchange (the app's timeout, at most AUTH_URL_MAX_SECONDS) and an answer of at most
AUTH_URL_MAX_ANSWER_BYTES (a longer one refuses). One app has at most AUTH_URL_APP_CONCURRENCY calls
in flight per node; a login that finds them all taken for AUTH_URL_QUEUE_SECONDS is refused ("auth
service busy"), so a slow auth service delays its own app's logins only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass

import jwt
from django.conf import settings

from apps_registry.models import AuthMode
from apps_registry.selectors import AppSnapshot, app_snapshot, app_snapshot_known, user_id_parse
from foundation.asyncdb import run_db
from foundation.http1 import Http1Pool
from foundation.loop_local import loop_local
from foundation.outgoing import OutgoingError, outgoing_client, outgoing_post
from messaging.channels.names import token_is_login
from messaging.federation.takeover.fence import Fence, fence, fence_known

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthOutcome:
    ok: bool
    app: AppSnapshot | None
    reason: str = ""
    redirect: str | None = None  # the user's home domain's WebSocket URL, when it lives elsewhere
    retry: bool = False  # a refusal for now (the user is between domains): try again shortly, here or at home


def _refuse(reason: str, app: AppSnapshot | None = None, redirect: str | None = None, *,
            retry: bool = False) -> AuthOutcome:
    return AuthOutcome(ok=False, app=app, reason=reason, redirect=redirect, retry=retry)


async def client_authenticate(*, app_id: str, user_id: str, token: str, origin: str | None = None) -> AuthOutcome:
    parsed = user_id_parse(user_id)
    if parsed is None:
        return _refuse("userId must be <appName>-<digits> (ASCII digits, no leading zero)")
    known, app = app_snapshot_known(parsed.app_name)
    if not known:
        app = await run_db(app_snapshot, parsed.app_name)
    if app is None or app.app_id != app_id:
        return _refuse("unknown app or appId does not match the user-id prefix")
    if origin is not None and app.allowed_origins and origin not in app.allowed_origins:
        return _refuse(f"origin {origin[:200]} is not allowed for this app", app)
    home = app.home_domain(parsed.number)
    if home != settings.DOMAIN_NAME:
        return _refuse(f"user lives in {home or 'no domain'}; connect to that domain", app, app.ws_url_of(home))
    if (configured := app.home_and_standby(parsed.number)) is not None:
        fenced = await _fence()
        if fenced.cut_off:
            return _refuse(f"{home} is cut off from the network and serves no user with a standby now; retry", app,
                           retry=True)
        if configured[0] in fenced.returning:
            return _refuse(f"{home} is handing this user back to {configured[0]}; retry", app, retry=True)
    if app.auth_mode == AuthMode.AUTH_URL:
        if not app.uses_auth_url:  # switched off: refused, never admitted (issue 16)
            return _refuse("the app's auth URL is switched off; no login is admitted until it is on", app)
        return await _ask_auth_url(app, user_id, token)
    if app.auth_mode == AuthMode.SIGNED_TOKEN:
        return _verify_token(app, user_id, token)
    if app.auth_mode == AuthMode.NONE:
        return AuthOutcome(ok=True, app=app)
    return _refuse("the app's auth mode is unknown", app)


async def _fence() -> Fence:
    known = fence_known()
    return known if known is not None else await run_db(fence)


AUTH_URL_MAX_CONNECTIONS = 200  # per web node, every app together (each app within its own cap)
AUTH_URL_MAX_KEEPALIVE = 50


def _http_client() -> Http1Pool:
    return outgoing_client("auth-url", max_connections=AUTH_URL_MAX_CONNECTIONS, max_keepalive=AUTH_URL_MAX_KEEPALIVE)


def _slots_of(app: AppSnapshot) -> asyncio.Semaphore:
    cap = settings.AUTH_URL_APP_CONCURRENCY
    return loop_local(("auth-url-slots", app.app_id, cap), lambda: asyncio.Semaphore(cap))


async def _ask_auth_url(app: AppSnapshot, user_id: str, token: str) -> AuthOutcome:
    slots = _slots_of(app)
    try:
        async with asyncio.timeout(settings.AUTH_URL_QUEUE_SECONDS):
            await slots.acquire()
    except TimeoutError:
        log.warning("auth URL of app %s: %d calls in flight, a login refused as busy", app.app_id,
                    settings.AUTH_URL_APP_CONCURRENCY)
        return _refuse("auth service busy", app)
    try:
        return await _auth_url_decide(app, user_id, token)
    finally:
        slots.release()


async def _auth_url_decide(app: AppSnapshot, user_id: str, token: str) -> AuthOutcome:
    body = json.dumps({"appId": app.app_id, "userId": user_id, "token": token}).encode()
    deadline = min(app.auth_timeout_ms / 1000, settings.AUTH_URL_MAX_SECONDS)
    try:
        response = await outgoing_post(_http_client(), app.auth_url, content=body,
                                       headers={"Content-Type": "application/json"}, deadline=deadline,
                                       max_bytes=settings.AUTH_URL_MAX_ANSWER_BYTES)
    except OutgoingError as exc:
        log.warning("auth URL %s for %r failed: %s", app.auth_url, user_id, exc)
        return _refuse("auth service unreachable", app)
    if not response.complete:
        log.warning("auth URL %s answered more than %d bytes: refused", app.auth_url,
                    settings.AUTH_URL_MAX_ANSWER_BYTES)
        return _refuse("auth service refused", app)
    try:
        answer = json.loads(response.body) if response.status == 200 else None
    except ValueError:
        answer = None
    if (
        isinstance(answer, dict) and answer.get("isAuthenticated") is True
        and answer.get("userId") == user_id and answer.get("appId") == app.app_id
    ):
        return AuthOutcome(ok=True, app=app)
    return _refuse("auth service refused", app)


# A reconnect storm brings every client back with the token it logged in with minutes ago: its
# signature was checked then, with the same secret. Tokens that passed are remembered (per secret, a
# bounded number, oldest forgotten first) and only their time limits are checked again: PyJWT's
# decode was a twentieth of a node's CPU per AUTH_CLIENT (issue 17). A changed secret misses.
VERIFIED_TOKENS_MAX = 20_000
_verified: dict[tuple[str, str], dict] = {}


def _decode_token(secret: str, token: str) -> dict:
    key = (secret, token)
    claims = _verified.get(key)
    if claims is not None:
        if claims["exp"] <= time.time():
            raise jwt.ExpiredSignatureError("Signature has expired")
        return claims
    claims = jwt.decode(token, secret, algorithms=["HS256"], options={"require": ["exp", "sub"]})
    if isinstance(claims.get("exp"), int | float):
        if len(_verified) >= VERIFIED_TOKENS_MAX:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del _verified[next(iter(_verified))]
        _verified[key] = claims
    return claims


def _verify_token(app: AppSnapshot, user_id: str, token: str) -> AuthOutcome:
    try:
        claims = _decode_token(app.token_secret, token or "")
    except jwt.ExpiredSignatureError:
        return _refuse("token expired", app)
    except jwt.PyJWTError:
        return _refuse("invalid token", app)
    if not token_is_login(claims):  # a channel grant naming this user in `sub` is no login (issue 16)
        return _refuse("a channel grant is not a login token", app)
    if claims.get("sub") != user_id:
        return _refuse("token is for another user", app)
    if claims["exp"] - time.time() > app.max_token_lifetime_seconds:
        return _refuse(f"token lifetime exceeds the app's maximum of {app.max_token_lifetime_seconds} s", app)
    return AuthOutcome(ok=True, app=app)


def token_sign(*, secret: str, user_id: str, ttl_seconds: int = 3600) -> str:
    """What an app's server does to let its user in (used by tests and the README example)."""
    return jwt.encode({"sub": user_id, "exp": int(time.time()) + ttl_seconds}, secret, algorithm="HS256")
