"""Every error of the server API as `{"error": code, "detail": text}` with the right status.

`code` is stable (clients branch on it), `detail` is for people. DRF's own exceptions, Django's
404 and unexpected failures all come out in this shape: the DRF exception handler covers the API
views, `not_found` the paths under /api/ that match no view, and `server_error` failures outside
any view. Validation errors add `fields` ({field: [messages]}), limits add `limit`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.db import InterfaceError, OperationalError, close_old_connections
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import server_error as django_server_error
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework import exceptions, status
from rest_framework.response import Response

from foundation.transport.frames import is_wire_safe
from messaging.api import metrics
from messaging.core.accept import SendRefused
from messaging.core.idempotency import IdempotencyConflict

log = logging.getLogger(__name__)

# Codes of SendRefused (messaging.core.accept, messaging.channels.access, messaging.intake.server_sends) and the status each answers with.
REFUSAL_STATUS = {
    "unknown_user": status.HTTP_404_NOT_FOUND,
    "unknown_channel": status.HTTP_404_NOT_FOUND,
    "invalid_channel": status.HTTP_400_BAD_REQUEST,
    "invalid_content": status.HTTP_400_BAD_REQUEST,
    "invalid_request": status.HTTP_400_BAD_REQUEST,
    "too_many_recipients": status.HTTP_400_BAD_REQUEST,
    "content_too_large": status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
}

# DRF's exceptions and their codes.
DRF_CODES: list[tuple[type[exceptions.APIException], str]] = [
    (exceptions.NotAuthenticated, "unauthenticated"),
    (exceptions.AuthenticationFailed, "invalid_api_key"),
    (exceptions.PermissionDenied, "forbidden"),
    (exceptions.NotFound, "not_found"),
    (exceptions.MethodNotAllowed, "method_not_allowed"),
    (exceptions.NotAcceptable, "not_acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type"),
    (exceptions.ParseError, "malformed_request"),
    (exceptions.Throttled, "rate_limited"),
    (exceptions.ValidationError, "invalid_request"),
]

UNAVAILABLE = (OperationalError, InterfaceError, RedisConnectionError, RedisTimeoutError)


class ApiError(exceptions.APIException):
    """An error a view raises with its own code."""

    def __init__(self, status_code: int, code: str, detail: str, **extra: Any):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.error_code = code
        self.extra = extra


def _wire_safe(value: Any) -> Any:
    """Error texts may quote what a client sent; a lone surrogate in it could not be encoded (the
    answer would become a 500), so such text is quoted with escapes instead."""
    if isinstance(value, str):
        return value if is_wire_safe(value) else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_wire_safe(k): _wire_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire_safe(v) for v in value]
    return value


def error_body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return _wire_safe({"error": code, "detail": detail, **extra})


def validation_detail(detail: Any) -> str:
    """A serializer's errors as one line of text, as the API's 400 answers word them."""
    return "; ".join(_flatten(detail)) or "invalid request"


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        return [m for k, v in detail.items() for m in _flatten(v, f"{prefix}{k}." if k != "non_field_errors" else prefix)]
    if isinstance(detail, list):
        return [m for v in detail for m in _flatten(v, prefix)]
    return [f"{prefix.rstrip('.')}: {detail}" if prefix else str(detail)]


def _answer(status_code: int, code: str, detail: str, headers: dict[str, str] | None = None,
            **extra: Any) -> Response:
    metrics.API_ERRORS.labels(code).inc()
    return Response(error_body(code, detail, **extra), status=status_code, headers=headers)


def api_exception_handler(exc: Exception, context: dict) -> Response:
    """REST_FRAMEWORK's EXCEPTION_HANDLER: whatever a view raised, in the API's error shape."""
    if isinstance(exc, ApiError):
        headers = {"Retry-After": str(exc.extra["retry_after"])} if "retry_after" in exc.extra else {}
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:  # a 401 names its scheme (the operator API's keys)
            headers["WWW-Authenticate"] = 'Bearer realm="api"'
        extra = {k: v for k, v in exc.extra.items() if k != "retry_after"}
        return _answer(exc.status_code, exc.error_code, str(exc.detail), headers, **extra)
    if isinstance(exc, SendRefused):
        return _answer(REFUSAL_STATUS.get(exc.code, status.HTTP_400_BAD_REQUEST), exc.code, exc.detail, **exc.extra)
    if isinstance(exc, IdempotencyConflict):
        headers = {"Retry-After": "1"} if exc.code == "idempotency_key_in_progress" else None
        return _answer(status.HTTP_409_CONFLICT, exc.code, exc.detail, headers)
    if isinstance(exc, Http404):
        return _answer(status.HTTP_404_NOT_FOUND, "not_found", "not found")
    if isinstance(exc, exceptions.APIException):
        code = next((c for cls, c in DRF_CODES if isinstance(exc, cls)), "error")
        headers: dict[str, str] = {}
        if isinstance(exc, exceptions.Throttled):
            headers["Retry-After"] = str(max(1, math.ceil(exc.wait or 1)))
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            headers["WWW-Authenticate"] = 'Bearer realm="api"'
        if isinstance(exc, exceptions.ValidationError):
            messages = _flatten(exc.detail)
            return _answer(exc.status_code, code, "; ".join(messages) or "invalid request", headers,
                           fields=exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail})
        detail = exc.detail if isinstance(exc.detail, str) else "; ".join(_flatten(exc.detail))
        return _answer(exc.status_code, code, str(detail), headers)
    if isinstance(exc, UNAVAILABLE):
        log.warning("API request failed: a service is unavailable (%r)", exc)
        if isinstance(exc, (OperationalError, InterfaceError)):
            # The views run on the node's database pool, whose threads keep their connections: a
            # broken one must go now (the next request reconnects), or the thread fails forever.
            close_old_connections()
        return _answer(status.HTTP_503_SERVICE_UNAVAILABLE, "unavailable",
                       "a service the platform needs is unavailable; retry later", {"Retry-After": "1"})
    log.exception("API request failed")
    return _answer(status.HTTP_500_INTERNAL_SERVER_ERROR, "internal_error", "internal error; nothing to fix on "
                   "your side (for a send with an Idempotency-Key, retrying with the same key is safe)")


def is_api_path(path: str) -> bool:
    return path.startswith("/api/") or path == "/messages" or path.startswith("/messages/")


def not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Paths under /api/ that match no endpoint."""
    metrics.API_ERRORS.labels("not_found").inc()
    return JsonResponse(error_body("not_found", f"no endpoint at {request.path}"), status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """The project's handler500: the API's shape on API paths, Django's page elsewhere."""
    if is_api_path(request.path):
        metrics.API_ERRORS.labels("internal_error").inc()
        return JsonResponse(error_body("internal_error", "internal error"), status=500)
    return django_server_error(request)
