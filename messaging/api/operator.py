"""The operator API (`/api/v1/operator/…`): what an operator does from outside, with an operator
key (apps_registry.models.OperatorKey, `manage.py operator_key create NAME`) rather than an app's
API key. Each table answers only to its own kind of key: an app key here is 401, an operator key
on the app API is 401 too.

- `POST /api/v1/operator/selftest` sets up a selftest run (messaging.selftest.provision) and
  answers, once, with the credentials it needs; `DELETE /api/v1/operator/selftest/{name}` removes
  it again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import BaseAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps_registry.models import APP_NAME_PATTERN
from apps_registry.services import operator_key_authenticate
from messaging.api.authentication import KEY_TEXT, bearer_token
from messaging.api.errors import ApiError
from messaging.api.serializers import ErrorSerializer
from messaging.selftest.provision import SelftestRefused, selftest_begin, selftest_end


@dataclass(frozen=True)
class OperatorCaller:
    """`request.user` of an operator API request."""

    key_id: int
    prefix: str
    is_authenticated: bool = True


class OperatorKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[OperatorCaller, None] | None:
        raw = bearer_token(request)
        if raw is None:
            return None  # NotAuthenticated (401) from the permission check
        key = operator_key_authenticate(raw_key=raw) if KEY_TEXT.fullmatch(raw) else None
        if key is None:  # unknown, revoked, or an app's API key
            raise ApiError(status.HTTP_401_UNAUTHORIZED, "invalid_operator_key", "invalid or revoked operator key")
        return OperatorCaller(key_id=key.pk, prefix=key.prefix), None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="operator"'


class HasOperatorKey(BasePermission):
    def has_permission(self, request: Request, view: object) -> bool:
        return isinstance(request.user, OperatorCaller)


class OperatorKeyScheme(OpenApiAuthenticationExtension):
    target_class = OperatorKeyAuthentication
    name = "OperatorKey"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {"type": "http", "scheme": "bearer",
                "description": "An operator key (`python manage.py operator_key create NAME`): "
                               "`Authorization: Bearer sbop_….…`. App API keys are refused here."}


class SelftestStartSerializer(serializers.Serializer):
    app = serializers.RegexField(f"^{APP_NAME_PATTERN}$", required=False, allow_blank=True,
                                 help_text="Run on this existing app (throwaway users of it); empty: on a "
                                           "throwaway app created for the run.")
    webhook_url = serializers.CharField(required=False, allow_blank=True, max_length=500, help_text="Register a test webhook endpoint (user.connected and "
                                        "user.disconnected) at this URL for the run.")


class SelftestGrantSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The run's name: DELETE /api/v1/operator/selftest/{name} ends it.")
    app_name = serializers.CharField()
    app_id = serializers.CharField()
    app_created = serializers.BooleanField()
    api_key = serializers.CharField(help_text="A temporary API key of the app, removed when the run ends.")
    domain = serializers.CharField(help_text="The domain every user of the run is homed in: this node's.")
    users = serializers.DictField(child=serializers.CharField(), help_text="Throwaway user id -> login token.")
    master = serializers.CharField(allow_null=True)
    master_token = serializers.CharField(allow_null=True)
    master_skipped = serializers.CharField(help_text="Why presence cannot be checked (empty when it can).")
    channel = serializers.CharField()
    channel_token = serializers.CharField(allow_null=True, help_text="A grant to read `channel`.")
    client_subscriptions = serializers.BooleanField()
    webhook_secret = serializers.CharField(allow_null=True)
    notes = serializers.ListField(child=serializers.CharField())


class OperatorView(APIView):
    authentication_classes = [OperatorKeyAuthentication]
    permission_classes = [HasOperatorKey]
    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]


REFUSALS = {code: OpenApiResponse(ErrorSerializer, description=text) for code, text in {
    400: "invalid request, or a webhook URL the platform will not call (`invalid_webhook_url`)",
    401: "no operator key, or a wrong or revoked one (`invalid_operator_key`); an app's API key is refused too",
    404: "no app or run of that name",
    409: "the app cannot be tested here (auth-URL app, no users homed on this domain)",
}.items()}


class SelftestView(OperatorView):
    @extend_schema(
        operation_id="operator_selftest_start", tags=["operator"], request=SelftestStartSerializer,
        summary="Start a selftest run", responses={201: SelftestGrantSerializer, **REFUSALS},
        description="Creates a throwaway app `selftest_<hex>` (or, with `app`, throwaway users of that app), a "
                    "temporary API key, login tokens for three users and the master, a channel and its grant. "
                    "The answer is shown once.",
    )
    def post(self, request: Request) -> Response:
        body = SelftestStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            grant = selftest_begin(app_name=body.validated_data.get("app") or None,
                                   webhook_url=body.validated_data.get("webhook_url") or None)
        except SelftestRefused as exc:
            raise ApiError(exc.status, exc.code, exc.detail) from None
        return Response(asdict(grant), status=status.HTTP_201_CREATED)


class SelftestRunView(OperatorView):
    @extend_schema(
        operation_id="operator_selftest_end", tags=["operator"], summary="End a selftest run",
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH, description="The run's name.")],
        responses={204: None, 401: REFUSALS[401], 404: REFUSALS[404]},
        description="Removes what the run was given: the throwaway app with everything in it, or on an existing "
                    "app the temporary key, the throwaway users' messages, sessions and subscriptions, the test "
                    "channel and webhook endpoint.",
    )
    def delete(self, request: Request, name: str) -> Response:
        if not selftest_end(name=name):
            raise ApiError(status.HTTP_404_NOT_FOUND, "not_found", f"no selftest run named {name!r}")
        return Response(status=status.HTTP_204_NO_CONTENT)
