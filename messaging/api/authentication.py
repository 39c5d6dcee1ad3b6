"""Per-app API keys: `Authorization: Bearer <key>`. A request's app is its key's app and nothing
else: every view reads and writes through `request.user.app` only.

Verified keys are remembered per process for API_KEY_CACHE_SECONDS (5 s), by the SHA-256 digest of
the key (the raw key is never kept), so a busy server costs no query per request; a revoked key
therefore keeps working on a node for at most that long. Unknown keys are not remembered (each
costs one indexed query; a flood of made-up keys cannot push good ones out of the cache).

The push seed's publish (`POST /messages`) alone also takes a request without any Authorization
header, as the app with push open mode when the domain has one (`PushOpenAuthentication`,
apps_registry.models.ClientApp.push_open; never on a production node): the seed's clients send no
key. A request that sends a header is judged by its key, open app or not.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from apps_registry.selectors import AppSnapshot, app_snapshot, push_open_app
from apps_registry.services import api_key_authenticate

CACHE_SIZE = 4096
KEY_TEXT = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII: whatever else a header holds is no key


@dataclass(frozen=True)
class VerifiedKey:
    key_id: int
    prefix: str
    app_pk: int
    app_name: str


@dataclass(frozen=True)
class ApiCaller:
    """`request.user` of an API request: the app a valid key belongs to."""

    app: AppSnapshot
    key: VerifiedKey
    is_authenticated: bool = True


_verified: OrderedDict[str, tuple[float, VerifiedKey]] = OrderedDict()
_lock = threading.Lock()


def _digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode(errors="surrogatepass")).hexdigest()


def verified_key_remembered(raw_key: str) -> VerifiedKey | None:
    """The key's identity if this process verified it in the last API_KEY_CACHE_SECONDS, else None
    (not known: `verified_key` asks the database). No I/O: safe on an event loop."""
    return _remembered(_digest(raw_key))


def _remembered(digest: str) -> VerifiedKey | None:
    with _lock:
        hit = _verified.get(digest)
    if hit is not None and time.monotonic() - hit[0] < settings.API_KEY_CACHE_SECONDS:
        return hit[1]
    return None


def verified_key(raw_key: str) -> VerifiedKey | None:
    """The key's identity if it is active (remembered for API_KEY_CACHE_SECONDS), else None."""
    digest = _digest(raw_key)
    remembered = _remembered(digest)
    if remembered is not None:
        return remembered
    now = time.monotonic()
    key = api_key_authenticate(raw_key=raw_key)
    with _lock:
        if key is None:
            _verified.pop(digest, None)
            return None
        verified = VerifiedKey(key_id=key.pk, prefix=key.prefix, app_pk=key.app_id, app_name=key.app.app_name)
        _verified[digest] = (now, verified)
        _verified.move_to_end(digest)
        while len(_verified) > CACHE_SIZE:
            _verified.popitem(last=False)
    return verified


def verified_keys_forget() -> None:
    """Drop every remembered key (tests; a process that must see a revocation at once)."""
    with _lock:
        _verified.clear()


def bearer_token(request: Request) -> str | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ApiCaller, None] | None:
        raw = bearer_token(request)
        if raw is None:
            if request.META.get("HTTP_AUTHORIZATION"):
                raise exceptions.AuthenticationFailed("use 'Authorization: Bearer <API key>'")
            return None  # NotAuthenticated (401) from the permission check
        if not KEY_TEXT.fullmatch(raw):  # no query for what no key can be (a NUL would fail in Postgres)
            raise exceptions.AuthenticationFailed("invalid API key")
        key = verified_key(raw)
        if key is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        app = app_snapshot(key.app_name)
        if app is None or app.pk != key.app_pk:  # the app was deleted or renamed since
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        return ApiCaller(app=app, key=key), None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'  # makes DRF answer 401 (not 403) to a missing key


class HasApiKey(BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.user, ApiCaller)


@dataclass(frozen=True)
class OpenCaller:
    """`request.user` of a push-compatible request without a key: the domain's push open app."""

    app: AppSnapshot
    is_authenticated: bool = True


class PushOpenAuthentication(BaseAuthentication):
    """After ApiKeyAuthentication: a request with no Authorization header at all is the push open
    app's, when there is one (else the permission check answers 401, as without this class)."""

    def authenticate(self, request: Request) -> tuple[OpenCaller, None] | None:
        if request.META.get("HTTP_AUTHORIZATION"):
            return None  # a key was sent: it alone decides (ApiKeyAuthentication)
        app = push_open_app()
        return (OpenCaller(app=app), None) if app is not None else None


class HasApiKeyOrOpen(BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.user, (ApiCaller, OpenCaller))


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """The schema's security scheme for ApiKeyAuthentication."""

    target_class = ApiKeyAuthentication
    name = "ApiKey"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {"type": "http", "scheme": "bearer",
                "description": "A server API key of your app (`python manage.py apikey create APPNAME`, or the "
                               "admin's API keys page): `Authorization: Bearer sb_….…`"}


class PushOpenScheme(OpenApiAuthenticationExtension):
    """PushOpenAuthentication in the schema: no credentials at all (an empty security requirement),
    beside the API key."""

    target_class = PushOpenAuthentication
    name: list[str] = []  # no security scheme of its own

    def get_security_requirement(self, auto_schema: object) -> dict:
        return {}

    def get_security_definition(self, auto_schema: object) -> list:
        return []
