"""Liveness and readiness: /healthz says the process serves, /readyz that its services answer."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok", "node": settings.NODE_ID})


def _postgres_error() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("select 1")
        return None
    except Exception as exc:  # any failure means "not ready"; the text goes to the operator
        connection.close_if_unusable_or_obsolete()
        return f"{type(exc).__name__}: {exc}".strip()[:300]


def _redis_error() -> str | None:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        client.close()
        return None
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]


def readyz(request: HttpRequest) -> JsonResponse:
    failures = {name: err for name, err in (("postgres", _postgres_error()), ("redis", _redis_error())) if err}
    if failures:
        return JsonResponse({"status": "unavailable", "failing": failures}, status=503)
    return JsonResponse({"status": "ready", "node": settings.NODE_ID, "domain": settings.DOMAIN_NAME})



