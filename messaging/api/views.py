"""The server API's views: parse the request, name the caller's app, call one service or selector,
render (what they share is messaging.api.base). Every lookup is confined to `request.user.app` (the
key's app); a name of another app's user, channel, message or dead letter is answered 404 like a
name that does not exist."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from messaging.api import metrics
from messaging.api import serializers as s
from messaging.api.base import (
    AFTER,
    CHANNEL,
    CURSOR,
    IDEMPOTENCY,
    LIMIT,
    MESSAGE_ID,
    TARGET,
    USER,
    ApiView,
    errors,
    fast_answer,
    reliable_answer,
)
from messaging.api.errors import ApiError, validation_detail
from messaging.api.pagination import (
    PAGE_SIZE,
    PAGE_SIZE_MAX,
    ApiCursorPagination,
    query_int,
    user_cursor_decode,
    user_cursor_encode,
)
from messaging.channels.names import user_channel
from messaging.channels.registry import readers_count
from messaging.channels.services import channel_history, subscription_add, subscription_remove
from messaging.core.delivery.dead_letters import dead_letters_discard, dead_letters_requeue
from messaging.core.idempotency import Answer, idempotency_key_valid, request_fingerprint
from messaging.core.protocol import FEATURE_FAST, plain_int
from messaging.core.selectors import (
    connection_counts,
    dead_letters_of,
    message_status,
    subscribers_of_channel,
    subscriptions_of_user,
    user_presence,
)
from messaging.intake.server_batch import BatchItem, server_messages_send_batch
from messaging.intake.server_sends import server_channel_publish, server_message_send
from presence.online import app_online_page
from presence.services import user_disconnect_everywhere_sync

# --- sends ---------------------------------------------------------------------------------------


class MessagesView(ApiView):
    @extend_schema(
        operation_id="messages_send", tags=["send"], request=s.MessageSendSerializer, parameters=[IDEMPOTENCY],
        summary="Send to one user or to several users",
        description="RELIABLE (default): stored, then routed and retried until delivered (201, with the message "
                    "id). FAST: pushed to the recipients' live connections now, never stored (200).",
        responses={201: s.MessageAcceptedSerializer, 200: s.FastSentSerializer, **errors(400, 401, 404, 409, 413,
                                                                                            429)},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(s.MessageSendSerializer)
        group, recipients = data["to"]

        def send() -> Answer:
            result = server_message_send(app=self.app, recipients=recipients, content=data["content"], group=group,
                                         feature=data["feature"], sender=data.get("sender"),
                                         reference=data["reference"], confirmation=data["confirmation"])
            if result.feature == FEATURE_FAST:
                return Answer(status.HTTP_200_OK, fast_answer(result.sender, result.recipients, result.connections))
            return Answer(status.HTTP_201_CREATED, {"id": str(result.message_id),
                                                    **reliable_answer(result.sender, result.recipients)})

        response = self.idempotent(send)
        metrics.API_SENDS.labels(data["feature"]).inc()
        return response


class MessagesBatchView(ApiView):
    @extend_schema(
        operation_id="messages_send_batch", tags=["send"], request=s.MessagesBatchSerializer,
        summary="Send up to 1,000 messages in one call",
        description="Each message is accepted or refused on its own; `results` answers each in order: `{id}` once "
                    "stored (all the batch's RELIABLE messages in one transaction), FAST's answer, or `{error, "
                    "detail}` with the code a single send would answer. A message's `idempotencyKey` sends it once: "
                    "again, its stored answer comes back. The call counts once against the API rate limit.",
        responses={200: s.BatchResultsSerializer, **errors(400, 401, 413, 429)},
    )
    def post(self, request: Request) -> Response:
        reader = s.MessageSendSerializer()  # one for every message: its fields are built once, not per message
        items = [_batch_item(reader, raw) for raw in self.valid(s.MessagesBatchSerializer)["messages"]]
        results = server_messages_send_batch(app=self.app, items=items)
        for result in results:
            if "error" not in result:
                metrics.API_SENDS.labels(result.get("feature", "RELIABLE")).inc()
        return Response({"results": results}, status=status.HTTP_200_OK)


BATCH_ITEM_PATH = "/api/v1/messages/batch#message"  # a batch message's key is never a single send's


def _batch_item(reader: s.MessageSendSerializer, raw: dict) -> BatchItem:
    """One message of a batch, read as a single send's body is (and its idempotencyKey)."""
    body = {k: v for k, v in raw.items() if k != "idempotencyKey"}
    key = raw.get("idempotencyKey")
    if key is not None and (not isinstance(key, str) or not idempotency_key_valid(key)):
        return BatchItem(None, refused={"error": "invalid_request",
                                        "detail": "idempotencyKey must be 1 to 255 printable ASCII characters"})
    try:
        v = reader.run_validation(body)
    except ValidationError as exc:
        return BatchItem(None, refused={"error": "invalid_request", "detail": validation_detail(exc.detail)})
    group, recipients = v["to"]
    return BatchItem({"recipients": recipients, "content": v["content"], "group": group, "feature": v["feature"],
                      "sender": v.get("sender"), "reference": v["reference"], "confirmation": v["confirmation"]},
                     key=key, fingerprint=request_fingerprint(method="POST", path=BATCH_ITEM_PATH, body=body))


class ChannelMessagesView(ApiView):
    @extend_schema(
        operation_id="channel_publish", tags=["send"], request=s.ChannelPublishSerializer,
        parameters=[CHANNEL, IDEMPOTENCY],
        summary="Publish on a channel",
        description="Appended to the channel's history (the next offset, no gaps), then pushed to every live "
                    "reader in the cluster: durable subscribers' connections and clients that subscribed.",
        responses={201: s.ChannelPublishedSerializer, **errors(400, 401, 404, 409, 413, 429)},
    )
    def post(self, request: Request, channel: str) -> Response:
        name = self.channel(channel)
        content = self.valid(s.ChannelPublishSerializer)["content"]

        def send() -> Answer:
            published = server_channel_publish(app=self.app, channel=name, content=content,
                                               publisher=f"api:{request.user.key.prefix}")
            return Answer(status.HTTP_201_CREATED, {"channel": published.channel, "offset": published.offset,
                                                    "subscribers": published.subscribers})

        response = self.idempotent(send)
        metrics.API_SENDS.labels("CHANNEL").inc()
        return response

    @extend_schema(
        operation_id="channel_history", tags=["channels"], summary="A channel's history after an offset",
        parameters=[CHANNEL, AFTER, LIMIT],
        responses={200: s.HistoryPageSerializer, **errors(400, 401, 404, 429)},
    )
    def get(self, request: Request, channel: str) -> Response:
        name = self.channel(channel)
        after = query_int(request, "after", 0, 0, s.BIGINT_MAX)
        limit = query_int(request, "limit", PAGE_SIZE, 1, PAGE_SIZE_MAX)
        items = channel_history(app_id=self.app.pk, channel=name, after=after, limit=limit)
        following = None
        if len(items) == limit:
            following = request.build_absolute_uri(f"{request.path}?after={items[-1].offset}&limit={limit}")
        return Response({"channel": name, "results": [{"offset": i.offset, "content": i.content} for i in items],
                         "next": following, "previous": None})


# --- message status and dead letters -------------------------------------------------------------


class MessageDetailView(ApiView):
    @extend_schema(
        operation_id="message_status", tags=["messages"], summary="A message and its per-recipient delivery record",
        parameters=[MESSAGE_ID],
        responses={200: s.MessageStatusSerializer, **errors(401, 404, 429)},
    )
    def get(self, request: Request, message_id: str) -> Response:
        found, number = None, plain_int(message_id, s.BIGINT_MAX)
        if number:
            found = message_status(app_id=self.app.pk, message_id=number)
        if found is None:
            raise ApiError(404, "not_found", f"no message {message_id[:32]} in app {self.app.app_name}")
        m = found.message
        return Response({"id": str(m.pk), "kind": m.kind, "from": m.sender, "content": m.content,
                         "reference": m.reference, "created_at": m.created_at,
                         "deliveries": s.DeliverySerializer(found.deliveries, many=True).data})


class DeadLettersView(ApiView):
    @extend_schema(
        operation_id="dead_letters_list", tags=["dead letters"], summary="Dead letters, newest first",
        parameters=[CURSOR, LIMIT], responses={200: s.DeadLetterPageSerializer, **errors(400, 401, 404, 429)},
    )
    def get(self, request: Request) -> Response:
        return self.page(dead_letters_of(app_id=self.app.pk), "-dead_at", s.DeadLetterSerializer)


class DeadLettersRequeueView(ApiView):
    @extend_schema(
        operation_id="dead_letters_requeue", tags=["dead letters"], request=s.DeliveryIdsSerializer,
        summary="Re-queue dead letters", description="Each gets a fresh set of attempts and is routed again. Ids "
                                                     "that are not dead letters of your app are left alone.",
        responses={200: s.RequeuedSerializer, **errors(400, 401, 429)},
    )
    def post(self, request: Request) -> Response:
        ids = self.valid(s.DeliveryIdsSerializer)["ids"]
        return Response({"requeued": dead_letters_requeue(delivery_ids=ids, app_id=self.app.pk)})


class DeadLettersDiscardView(ApiView):
    @extend_schema(
        operation_id="dead_letters_discard", tags=["dead letters"], request=s.DeliveryIdsSerializer,
        summary="Discard dead letters", description="They leave the queue as expired (kept for the record). Ids that "
                                                    "are not dead letters of your app are left alone.",
        responses={200: s.DiscardedSerializer, **errors(400, 401, 429)},
    )
    def post(self, request: Request) -> Response:
        ids = self.valid(s.DeliveryIdsSerializer)["ids"]
        return Response({"discarded": dead_letters_discard(delivery_ids=ids, app_id=self.app.pk)})


# --- subscriptions --------------------------------------------------------------------------------


def _subscribed(user_id: str, channel: str, created: bool) -> Response:
    return Response({"user_id": user_id, "channel": channel, "created": created},
                    status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class ChannelSubscribersView(ApiView):
    @extend_schema(
        operation_id="channel_subscribers", tags=["subscriptions"], summary="A channel's durable subscribers",
        parameters=[CHANNEL, CURSOR, LIMIT], responses={200: s.SubscriptionPageSerializer, **errors(400, 401, 404, 429)},
    )
    def get(self, request: Request, channel: str) -> Response:
        name = self.channel(channel)
        return self.page(subscribers_of_channel(app_id=self.app.pk, channel=name), "subscriber",
                         s.SubscriptionSerializer)


class ChannelSubscriberView(ApiView):
    @extend_schema(
        operation_id="channel_subscribe", tags=["subscriptions"], request=None,
        summary="Subscribe a user to a channel", parameters=[CHANNEL, USER],
        description="Durable: the user's connections read the channel now and whenever they connect.",
        responses={201: s.SubscribedSerializer, 200: s.SubscribedSerializer, **errors(400, 401, 404, 421, 429)},
    )
    def put(self, request: Request, channel: str, user_id: str) -> Response:
        name, user = self.channel(channel), self.home_user(user_id)
        return _subscribed(user, name, subscription_add(app_id=self.app.pk, subscriber=user, channel=name))

    @extend_schema(
        operation_id="channel_unsubscribe", tags=["subscriptions"], summary="Unsubscribe a user from a channel",
        parameters=[CHANNEL, USER],
        responses={204: None, **errors(400, 401, 404, 421, 429)},
    )
    def delete(self, request: Request, channel: str, user_id: str) -> Response:
        name, user = self.channel(channel), self.home_user(user_id)
        if not subscription_remove(app_id=self.app.pk, subscriber=user, channel=name):
            raise ApiError(404, "not_found", f"{user} is not subscribed to {name}")
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserSubscriptionsView(ApiView):
    @extend_schema(
        operation_id="user_subscriptions", tags=["subscriptions"],
        summary="A user's durable subscriptions (`@<userId>` channels are the users it follows)",
        parameters=[USER, CURSOR, LIMIT],
        responses={200: s.SubscriptionPageSerializer, **errors(400, 401, 404, 421, 429)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        user = self.home_user(user_id)
        return self.page(subscriptions_of_user(app_id=self.app.pk, user_id=user), "channel", s.SubscriptionSerializer)


class UserFollowView(ApiView):
    @extend_schema(
        operation_id="user_follow", tags=["subscriptions"], request=None, summary="Make a user follow another",
        parameters=[USER, TARGET],
        description="User to user: `user_id` is subscribed to channel `@<target_id>`, where whatever is published "
                    "for the target goes.",
        responses={201: s.SubscribedSerializer, 200: s.SubscribedSerializer, **errors(401, 404, 421, 429)},
    )
    def put(self, request: Request, user_id: str, target_id: str) -> Response:
        user, target = self.home_user(user_id), self.user(target_id)
        name = user_channel(target)
        return _subscribed(user, name, subscription_add(app_id=self.app.pk, subscriber=user, channel=name))

    @extend_schema(
        operation_id="user_unfollow", tags=["subscriptions"], summary="Make a user stop following another",
        parameters=[USER, TARGET],
        responses={204: None, **errors(401, 404, 421, 429)},
    )
    def delete(self, request: Request, user_id: str, target_id: str) -> Response:
        user, target = self.home_user(user_id), self.user(target_id)
        if not subscription_remove(app_id=self.app.pk, subscriber=user, channel=user_channel(target)):
            raise ApiError(404, "not_found", f"{user} does not follow {target}")
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- presence and connections ---------------------------------------------------------------------


class UserPresenceView(ApiView):
    @extend_schema(
        operation_id="user_presence", tags=["presence"], summary="Is a user online, and where",
        parameters=[USER],
        responses={200: s.UserPresenceSerializer, **errors(401, 404, 429)},
    )
    def get(self, request: Request, user_id: str) -> Response:
        presence = user_presence(app=self.app, user_id=self.user(user_id), this_domain=settings.DOMAIN_NAME)
        return Response({"user_id": presence.user_id, "domain": presence.domain, "online": presence.online,
                         "connections": presence.connections})


class OnlineUsersView(ApiView):
    @extend_schema(
        operation_id="users_online", tags=["presence"], summary="The app's users who are connected now",
        description="In user id order (byte-wise: `ANZ-10` before `ANZ-9`). Each page, and its `count`, is one "
                    "point-in-time view of the cluster's presence; a walk through the pages is not: a user "
                    "connected throughout it is listed exactly once, one who connected or left meanwhile may or "
                    "may not be. To follow changes as they happen, connect as the master user (ONLINE_USERS, then "
                    "USER_CONNECTED / USER_DISCONNECTED).",
        parameters=[CURSOR, LIMIT], responses={200: s.OnlineUsersPageSerializer, **errors(400, 401, 429)},
    )
    def get(self, request: Request) -> Response:
        after = user_cursor_decode(request, self.app.app_name)
        limit = query_int(request, "limit", PAGE_SIZE, 1, PAGE_SIZE_MAX)
        page = app_online_page(self.app.app_name, after=after, limit=limit)
        following = None
        if page.more:
            following = request.build_absolute_uri(
                f"{request.path}?cursor={user_cursor_encode(page.users[-1])}&limit={limit}")
        return Response({"count": page.count, "results": page.users, "next": following, "previous": None})


class ChannelMembersView(ApiView):
    @extend_schema(
        operation_id="channel_members", tags=["presence"], summary="A channel's subscribers who are connected",
        description="Pages go through the durable subscribers in order and list those connected now, so a page may "
                    "hold fewer than `limit` (even none) while `next` is set. `readers` counts every live reader of "
                    "the channel in the cluster (durable subscribers' connections and clients that subscribed).",
        parameters=[CHANNEL, CURSOR, LIMIT], responses={200: s.ChannelMembersPageSerializer, **errors(400, 401, 404, 429)},
    )
    def get(self, request: Request, channel: str) -> Response:
        name = self.channel(channel)
        paginator = ApiCursorPagination("subscriber", {"channel": name, "readers": readers_count(self.app.pk, name)})
        rows = paginator.paginate_queryset(subscribers_of_channel(app_id=self.app.pk, channel=name), request, self)
        counts = connection_counts([row.subscriber for row in rows])
        return paginator.get_paginated_response([{"user_id": user, "connections": n}
                                                 for user, n in counts.items() if n])


class UserDisconnectView(ApiView):
    @extend_schema(
        operation_id="user_disconnect", tags=["presence"], request=None,
        summary="Disconnect a user everywhere", parameters=[USER], description="Every connection of the user in the cluster is closed "
                                                            "with 1000 (the client should not reconnect on its own).",
        responses={200: s.DisconnectedSerializer, **errors(401, 404, 429)},
    )
    def post(self, request: Request, user_id: str) -> Response:
        user = self.user(user_id)
        closed = user_disconnect_everywhere_sync(user_id=user, reason="closed by the app's server")
        return Response({"user_id": user, "closed": closed})

