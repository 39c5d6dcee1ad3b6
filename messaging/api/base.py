"""What every server API view shares (messaging.api.views): key authentication, the app's rate
limit, JSON in and out, Idempotency-Keys on sends, cursor pages; and the OpenAPI parameters and
error answers the views declare."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps_registry.models import APP_NAME_PATTERN
from apps_registry.selectors import AppSnapshot
from messaging.api import serializers as s
from messaging.api.authentication import ApiKeyAuthentication, HasApiKey
from messaging.api.errors import ApiError
from messaging.api.pagination import ApiCursorPagination
from messaging.channels.access import channel_name_require
from messaging.channels.names import CHANNEL_NAME
from messaging.core.accept import user_require
from messaging.core.idempotency import HEADER, Answer, idempotency_key_valid, idempotent_send, request_fingerprint
from messaging.core.protocol import plain_int
from messaging.intake.throttling import AppRateThrottle

ERRORS = {code: OpenApiResponse(s.ErrorSerializer, description=text) for code, text in {
    400: "invalid request (`invalid_request`, `malformed_request`, …)",
    401: "no key, or a wrong or revoked one",
    403: "without a key (the push open app's publish): a channel that is not public, or a user's own",
    404: "not found, or not your app's",
    409: "the Idempotency-Key was used for another request; or (`request_closed`) the request takes no other answer",
    413: "content over the app's limit, or a body over the server's",
    421: "the user lives in another domain (`homed_elsewhere`): `domain` names it; send this there",
    429: "the app's rate limit: retry after `Retry-After` seconds",
}.items()}
IDEMPOTENCY = OpenApiParameter(
    HEADER, str, OpenApiParameter.HEADER, required=False,
    description="Up to 255 printable ASCII characters. A retry with the same key and body gets the same answer "
                "and sends nothing again; the same key with another body is refused (409). Kept 24 hours.")
LIMIT = OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": 1000},
                         description="Page size, 1 to 1000 (default 100).")
CURSOR = OpenApiParameter("cursor", str, description="From a page's `next` or `previous` link.")
AFTER = OpenApiParameter("after", {"type": "integer", "minimum": 0, "maximum": s.BIGINT_MAX},
                         description="Messages after this offset (default 0: from the oldest kept).")
USER_PATTERN = f"^{APP_NAME_PATTERN}-(0|[1-9][0-9]{{0,17}})$"
USER = OpenApiParameter("user_id", {"type": "string", "pattern": USER_PATTERN, "example": "ANZ-1002"},
                        OpenApiParameter.PATH, description="A user of your app: `<appName>-<number>`.")
TARGET = OpenApiParameter("target_id", {"type": "string", "pattern": USER_PATTERN, "example": "ANZ-1003"},
                          OpenApiParameter.PATH, description="The user to follow.")
CHANNEL = OpenApiParameter("channel", {"type": "string", "pattern": f"^(?:{CHANNEL_NAME.pattern})$", "example": "news"},
                           OpenApiParameter.PATH, description="A channel of your app: 1 to 128 of `A-Z a-z 0-9 _ . "
                                                              "- @`; `@<userId>` is a user's own channel; "
                                                              "`pusher.<name>` a Pusher channel's (up to 407).")
MESSAGE_ID = OpenApiParameter("message_id", {"type": "string", "pattern": "^[1-9][0-9]{0,18}$", "example": "8812"},
                              OpenApiParameter.PATH, description="A message id, as a send answered it.")


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: ERRORS[code] for code in codes}


def declared_too_large(length: str) -> bool:
    """A Content-Length past DATA_UPLOAD_MAX_MEMORY_SIZE (however many digits: int() raises past
    4300); a length that is no number at all is left to the body parser."""
    return length.isascii() and length.isdigit() and plain_int(length, settings.DATA_UPLOAD_MAX_MEMORY_SIZE) is None


def reliable_answer(sender: str, recipients: Sequence[str]) -> dict[str, Any]:
    """A stored send's answer (201), but for its leading `id`."""
    return {"feature": "RELIABLE", "from": sender, "recipients": list(recipients), "deliveries": len(recipients)}


def fast_answer(sender: str, recipients: Sequence[str], connections: int | None) -> dict[str, Any]:
    """A FAST send's answer (200)."""
    return {"feature": "FAST", "from": sender, "recipients": list(recipients), "connections": connections}


class ApiView(APIView):
    """What every server API view shares: key authentication, the app's rate limit, JSON in and out."""

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [HasApiKey]
    throttle_classes = [AppRateThrottle]
    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if declared_too_large(request.META.get("CONTENT_LENGTH") or "0"):
            raise ApiError(413, "request_too_large", f"request bodies are limited to "
                                                     f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")

    @property
    def app(self) -> AppSnapshot:
        return self.request.user.app

    def valid(self, serializer_class: type[s.serializers.Serializer]) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def idempotent(self, send: Callable[[], Answer]) -> Response:
        """Run a send under the request's Idempotency-Key (if any); render its answer."""
        key = self.request.headers.get(HEADER)
        if key is not None and not idempotency_key_valid(key):
            raise ApiError(400, "invalid_request", f"{HEADER} must be 1 to 255 printable ASCII characters")
        fingerprint = request_fingerprint(method=self.request.method, path=self.request.path,
                                          body=self.request.data) if key is not None else ""
        answer = idempotent_send(app_id=self.app.pk, key=key, fingerprint=fingerprint, send=send)
        headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
        return Response(answer.body, status=answer.status, headers=headers)

    def user(self, user_id: str) -> str:
        return user_require(self.app, user_id)

    def home_user(self, user_id: str) -> str:
        """A user of the app whose home is this domain: what is kept for a user (its durable
        subscriptions, whom it follows) lives at its home, so asking another domain would change
        nothing there; refused (421) naming the home instead of answering as if it had."""
        user = self.user(user_id)
        home = self.app.home_of(user)
        if home != settings.DOMAIN_NAME:
            raise ApiError(421, "homed_elsewhere", f"{user} lives in {home}: send this to that domain's API", domain=home)
        return user

    def channel(self, name: str) -> str:
        return channel_name_require(self.app, name)

    def page(self, queryset, ordering: str, serializer_class: type[s.serializers.Serializer],
             **extra: Any) -> Response:
        paginator = ApiCursorPagination(ordering, extra)
        rows = paginator.paginate_queryset(queryset, self.request, view=self)
        return paginator.get_paginated_response(serializer_class(rows, many=True).data)
