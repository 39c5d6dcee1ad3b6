"""AUTH_CLIENT: the three app auth modes of docs/protocol.md.

1. appId + user-id prefix + home domain (every mode starts here), and the browser's Origin when the
   app lists allowed origins;
2. an external auth URL asked with {appId, userId, token}: only an explicit
   {appId, userId, isAuthenticated: true} admits; a timeout, an error or anything else refuses;
3. a signed token: HMAC-SHA256 JWT with the app's secret, `sub` = userId, `exp` required and no
   further ahead than the app's max token lifetime.

The auth URL is asked through one HTTP client per event loop: building a client loads the CA
bundle (about 33 ms, on the event loop), so a client per AUTH_CLIENT froze a node in a reconnect
storm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx
import jwt
from django.conf import settings

from apps_registry.selectors import AppSnapshot, app_snapshot, user_id_parse
from messaging.asyncdb import run_db

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthOutcome:
    ok: bool
    app: AppSnapshot | None
    reason: str = ""


def _refuse(reason: str, app: AppSnapshot | None = None) -> AuthOutcome:
    return AuthOutcome(ok=False, app=app, reason=reason)


async def client_authenticate(*, app_id: str, user_id: str, token: str, origin: str | None = None) -> AuthOutcome:
    parsed = user_id_parse(user_id)
    if parsed is None:
        return _refuse("userId must be <appName>-<digits> (ASCII digits, no leading zero)")
    app = await run_db(app_snapshot, parsed.app_name)
    if app is None or app.app_id != app_id:
        return _refuse("unknown app or appId does not match the user-id prefix")
    if origin is not None and app.allowed_origins and origin not in app.allowed_origins:
        return _refuse(f"origin {origin[:200]} is not allowed for this app", app)
    home = app.home_domain(parsed.number)
    if home != settings.DOMAIN_NAME:
        return _refuse(f"user lives in {home or 'no domain'}; connect to that domain", app)
    if app.uses_auth_url:
        return await _ask_auth_url(app, user_id, token)
    if app.auth_mode == "signed_token":
        return _verify_token(app, user_id, token)
    return AuthOutcome(ok=True, app=app)


_http_clients: dict[int, httpx.AsyncClient] = {}


def _http_client() -> httpx.AsyncClient:
    loop_id = id(asyncio.get_running_loop())
    client = _http_clients.get(loop_id)
    if client is None:
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=200, max_keepalive_connections=50))
        _http_clients[loop_id] = client
    return client


async def _ask_auth_url(app: AppSnapshot, user_id: str, token: str) -> AuthOutcome:
    body = {"appId": app.app_id, "userId": user_id, "token": token}
    try:
        response = await _http_client().post(app.auth_url, json=body, timeout=app.auth_timeout_ms / 1000)
        answer = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("auth URL %s for %s failed: %r", app.auth_url, user_id, exc)
        return _refuse("auth service unreachable", app)
    if (
        isinstance(answer, dict) and answer.get("isAuthenticated") is True
        and answer.get("userId") == user_id and answer.get("appId") == app.app_id
    ):
        return AuthOutcome(ok=True, app=app)
    return _refuse("auth service refused", app)


def _verify_token(app: AppSnapshot, user_id: str, token: str) -> AuthOutcome:
    try:
        claims = jwt.decode(token or "", app.token_secret, algorithms=["HS256"],
                            options={"require": ["exp", "sub"]})
    except jwt.ExpiredSignatureError:
        return _refuse("token expired", app)
    except jwt.PyJWTError:
        return _refuse("invalid token", app)
    if claims.get("sub") != user_id:
        return _refuse("token is for another user", app)
    if claims["exp"] - time.time() > app.max_token_lifetime_seconds:
        return _refuse(f"token lifetime exceeds the app's maximum of {app.max_token_lifetime_seconds} s", app)
    return AuthOutcome(ok=True, app=app)


def token_sign(*, secret: str, user_id: str, ttl_seconds: int = 3600) -> str:
    """What an app's server does to let its user in (used by tests and the README example)."""
    return jwt.encode({"sub": user_id, "exp": int(time.time()) + ttl_seconds}, secret, algorithm="HS256")
