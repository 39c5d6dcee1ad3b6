"""The server API of the ordered event exchange (messaging.exchange): the REST intake of event lines
and the follow graph's reads. The graph is the exchange's own (numeric user ids, as the event
source names them), not the channel-based follows of `users/{user_id}/follows/{target_id}`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from messaging.api import serializers as s
from messaging.api.base import CURSOR, LIMIT, ApiView, errors
from messaging.api.errors import ApiError
from messaging.core.protocol import BIGINT_MAX, plain_int
from messaging.exchange.event_lines import EventLineError, IntakeFull, events_append
from messaging.exchange.selectors import followees_of, followers_of

NUMBER = OpenApiParameter("n", {"type": "string", "pattern": "^(0|[1-9][0-9]{0,18})$", "example": "32"},
                          OpenApiParameter.PATH, description="A user of the event exchange, by number (user 32 "
                                                             "is `<appName>-32` on /ws).")


class EventsView(ApiView):
    @extend_schema(
        operation_id="events_send", tags=["event exchange"], request=s.EventsSendSerializer,
        summary="Send ordered events to the app's exchange",
        description="A batch of event lines for the exchange (`manage.py eventsource`), which puts them in sequence "
                    "order with those of the TCP source: a gap holds later events back until it is filled. A "
                    "sequence number already applied or held is ignored, so a retried call is harmless. One "
                    "malformed line refuses the whole call (400, naming `events[i]`); nothing is appended then. "
                    "The intake is bounded in bytes per app: full, or with no eventsource reading it, a call is "
                    "refused (429 `intake_full`, with Retry-After) and nothing is appended.",
        responses={202: s.EventsAcceptedSerializer, **errors(400, 401, 413, 429)},
    )
    def post(self, request: Request) -> Response:
        lines = self.valid(s.EventsSendSerializer)["events"]
        try:
            appended = events_append(app_id=self.app.pk, lines=lines)
        except EventLineError as exc:
            raise ApiError(400, "invalid_request", str(exc), index=exc.index) from None
        except IntakeFull as exc:
            raise ApiError(429, "intake_full", exc.detail, retry_after=exc.retry_after) from None
        return Response({"accepted": appended.accepted, "stream": appended.entry_id}, status=status.HTTP_202_ACCEPTED)


def _number(n: str) -> int:
    number = plain_int(n, BIGINT_MAX)
    if number is None:
        raise ApiError(400, "invalid_request", "the user must be a number (the event source's user id)")
    return number


class FollowersView(ApiView):
    @extend_schema(
        operation_id="exchange_followers", tags=["event exchange"], summary="Who follows a user in the event exchange",
        description="The durable follow graph as of the last applied event, ordered by user number.",
        parameters=[NUMBER, CURSOR, LIMIT], responses={200: s.FollowerPageSerializer, **errors(400, 401, 429)},
    )
    def get(self, request: Request, n: str) -> Response:
        user = _number(n)
        return self.page(followers_of(app_id=self.app.pk, user=user), "follower", s.FollowerSerializer, user=user)


class FolloweesView(ApiView):
    @extend_schema(
        operation_id="exchange_followees", tags=["event exchange"], summary="Whom a user follows in the event exchange",
        description="The durable follow graph as of the last applied event, ordered by user number.",
        parameters=[NUMBER, CURSOR, LIMIT], responses={200: s.FolloweePageSerializer, **errors(400, 401, 429)},
    )
    def get(self, request: Request, n: str) -> Response:
        user = _number(n)
        return self.page(followees_of(app_id=self.app.pk, user=user), "followee", s.FolloweeSerializer, user=user)
