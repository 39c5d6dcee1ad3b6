"""The push seed's publish, `POST /messages` (docs/protocol.md, "Channel streams"): its request and
answer as the seed has them. With an API key it publishes on the key's app; without any
`Authorization` header (the seed's own clients send none), on the public channels of the domain's
push open app, where an operator marked one (apps_registry.models.ClientApp.push_open; never on a
production node)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from foundation.transport.frames import dumps
from messaging.api import metrics
from messaging.api import serializers as s
from messaging.api.authentication import ApiKeyAuthentication, HasApiKeyOrOpen, OpenCaller, PushOpenAuthentication
from messaging.api.base import IDEMPOTENCY, ApiView, errors
from messaging.api.errors import ApiError
from messaging.channels.access import ChannelRefused, channel_open_publish_check
from messaging.core.idempotency import Answer
from messaging.intake.server_sends import server_channel_publish

OPEN_PUBLISHER = "open"  # a channel history's publisher for the push open app's keyless publishes


class PushMessagesView(ApiView):
    """The push seed's publish (the module's doc)."""

    authentication_classes = [ApiKeyAuthentication, PushOpenAuthentication]
    permission_classes = [HasApiKeyOrOpen]

    @extend_schema(
        operation_id="push_publish", tags=["push-compatible"], request=s.PushPublishSerializer,
        parameters=[IDEMPOTENCY], summary="Publish on a channel (push seed compatible)",
        description="`POST /messages` of the push service: answers 202 with the number of live subscribers the "
                    "message went out to. A message that is not a string is delivered as its JSON text. Without "
                    "an `Authorization` header it publishes as the domain's push open app, on its public channels "
                    "only (403 otherwise), when an operator marked one app so; else it is a 401.",
        responses={202: s.PushAcceptedSerializer, **errors(400, 401, 403, 404, 409, 413, 429)},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(s.PushPublishSerializer)
        name = self.channel(data["channel"])
        message = data["message"]
        content = message if isinstance(message, str) else dumps(message)
        if isinstance(request.user, OpenCaller):
            try:
                channel_open_publish_check(self.app, name)
            except ChannelRefused as exc:
                raise ApiError(403, "forbidden", exc.detail) from None
            publisher = OPEN_PUBLISHER
        else:
            publisher = f"api:{request.user.key.prefix}"

        def send() -> Answer:
            published = server_channel_publish(app=self.app, channel=name, content=content, publisher=publisher)
            return Answer(status.HTTP_202_ACCEPTED, {"subscribers": published.subscribers})

        response = self.idempotent(send)
        metrics.API_SENDS.labels("CHANNEL").inc()
        return response
