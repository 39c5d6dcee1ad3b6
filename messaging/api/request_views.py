"""The server API for requests (docs/protocol.md, "Requests"): a request's state, and the server's
answer to it. Confined to the key's app: another app's request is answered 404."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps_registry.selectors import AppSnapshot
from messaging.api.base import USER, ApiView, errors
from messaging.api.errors import ApiError
from messaging.core.accept import SendRefused, content_require
from messaging.core.protocol import BIGINT_MAX, plain_int
from messaging.requests.models import Outcome
from messaging.requests.selectors import request_of_app
from messaging.requests.server_requests import server_request_create
from messaging.requests.services import RequestClosed, RequestUnknown, request_answer

REQUEST_ID = OpenApiParameter("request_id", {"type": "string", "pattern": "^[1-9][0-9]{0,18}$", "example": "311"},
                              OpenApiParameter.PATH, description="A request id, as the webhook or stream entry named it.")


class ServerRequestSerializer(serializers.Serializer):
    content = serializers.CharField(allow_blank=True, trim_whitespace=False, help_text="What the client is asked.")
    correlation = serializers.CharField(required=False, allow_blank=True, max_length=256, default="",
                                        help_text="Yours: given back in the request.answered / request.timed_out webhook.")
    timeoutSeconds = serializers.FloatField(required=False, min_value=0.1, max_value=7 * 24 * 3600,  # noqa: N815
                                            help_text="Default SERVER_REQUEST_TIMEOUT_SECONDS (300).")


class ServerRequestCreatedSerializer(serializers.Serializer):
    id = serializers.CharField()


class AnswerSerializer(serializers.Serializer):
    content = serializers.CharField(allow_blank=True, trim_whitespace=False,
                                    help_text="The outcome's content, as the client receives it.")


class AnsweredSerializer(serializers.Serializer):
    id = serializers.CharField()
    state = serializers.CharField(help_text="resolved or rejected")
    replay = serializers.BooleanField(help_text="true: the same answer was given before; nothing changed")


class RequestStateSerializer(serializers.Serializer):
    id = serializers.CharField()
    direction = serializers.CharField(help_text="to_server (a client's request) or to_client (yours)")
    endpoint = serializers.CharField()
    user = serializers.CharField(help_text="The client: the requester, or the user asked")
    state = serializers.CharField(help_text="waiting, resolved, rejected, timed_out or failed")
    outcome = serializers.CharField(help_text="resolve, reject, or empty while waiting")
    content = serializers.CharField()
    outcome_content = serializers.CharField()
    reason = serializers.CharField(help_text="timeout or endpoint_failed where the platform rejected")
    answered_via = serializers.CharField(help_text="api, stream, webhook or timeout")
    domain = serializers.CharField()
    created_at = serializers.DateTimeField()
    deadline = serializers.DateTimeField()
    answered_at = serializers.DateTimeField(allow_null=True)


def _content(app: AppSnapshot, content: str) -> str:
    """Content as every send's is checked: 413 over the app's limit, 400 for what is not text."""
    try:
        return content_require(app, content)
    except SendRefused as exc:
        raise ApiError(413 if exc.code == "content_too_large" else 400, exc.code, exc.detail) from None


def _number(request_id: str, app_name: str) -> int:
    number = plain_int(request_id, BIGINT_MAX)
    if not number:
        raise ApiError(404, "not_found", f"no request {request_id[:32]} in app {app_name}")
    return number


class RequestDetailView(ApiView):
    @extend_schema(operation_id="request_status", tags=["requests"], summary="A request: its state and times",
                   parameters=[REQUEST_ID], responses={200: RequestStateSerializer, **errors(401, 404, 429)})
    def get(self, request: Request, request_id: str) -> Response:
        found = request_of_app(app_pk=self.app.pk, request_id=_number(request_id, self.app.app_name))
        if found is None:
            raise ApiError(404, "not_found", f"no request {request_id[:32]} in app {self.app.app_name}")
        return Response(RequestStateSerializer({
            "id": str(found.pk), "direction": found.direction, "endpoint": found.endpoint, "user": found.user_id,
            "state": found.state, "outcome": found.outcome, "content": found.content,
            "outcome_content": found.outcome_content, "reason": found.reason, "answered_via": found.answered_via,
            "domain": found.domain, "created_at": found.created_at, "deadline": found.deadline,
            "answered_at": found.answered_at}).data)


class _AnswerView(ApiView):
    outcome: str

    def post(self, request: Request, request_id: str) -> Response:
        number = _number(request_id, self.app.app_name)
        content = self.valid(AnswerSerializer)["content"]
        try:
            answered = request_answer(app=self.app, request_id=number, outcome=self.outcome,
                                      content=_content(self.app, content), via="api")
        except RequestUnknown:
            raise ApiError(404, "not_found", f"no request {request_id[:32]} in app {self.app.app_name}") from None
        except RequestClosed as closed:
            raise ApiError(409, "request_closed", f"request {number} is {closed.state}: it takes no other answer") from None
        state = "resolved" if self.outcome == Outcome.RESOLVE else "rejected"
        return Response({"id": str(number), "state": state, "replay": answered.replay})


_ANSWER_DOC = ("The first answer closes the request and stores its outcome for the client, which gets it "
               "wherever it reconnects; the same answer again is a replay (200, nothing changes); another answer, "
               "or any after the request timed out, is 409 `request_closed`.")


def _answer_view(outcome: str) -> type[_AnswerView]:
    """The view that answers a request with `outcome` (resolve or reject)."""
    view = type(f"Request{outcome.capitalize()}View", (_AnswerView,), {"outcome": outcome})
    return extend_schema_view(post=extend_schema(
        operation_id=f"request_{outcome}", tags=["requests"], summary=f"{outcome.capitalize()} a request",
        description=_ANSWER_DOC, parameters=[REQUEST_ID], request=AnswerSerializer,
        responses={200: AnsweredSerializer, **errors(400, 401, 404, 409, 413, 429)}))(view)


RequestResolveView = _answer_view(Outcome.RESOLVE.value)
RequestRejectView = _answer_view(Outcome.REJECT.value)


class UserRequestsView(ApiView):
    @extend_schema(operation_id="server_request_create", tags=["requests"], summary="Ask a client",
                   description="The user gets `SERVER_REQUEST {id, requestId, content, seq}` (stored: pushed, fetched, ACK "
                               "mode) and answers `RESOLVE` or `REJECT {requestId, content}`; you learn it by the webhook "
                               "`request.answered` (with your `correlation`), or `request.timed_out`, and here: "
                               "`GET /api/v1/requests/{id}`.",
                   parameters=[USER], request=ServerRequestSerializer,
                   responses={201: ServerRequestCreatedSerializer, **errors(400, 401, 404, 413, 421, 429)})
    def post(self, request: Request, user_id: str) -> Response:
        user = self.home_user(user_id)
        given = self.valid(ServerRequestSerializer)
        request_id = server_request_create(app=self.app, user_id=user, content=_content(self.app, given["content"]),
                                           correlation=given.get("correlation", ""),
                                           timeout_seconds=given.get("timeoutSeconds"))
        return Response({"id": str(request_id)}, status=201)
