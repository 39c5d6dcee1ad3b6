"""Request bodies (checked for shape here; the send rules themselves live in
messaging.core.accept and messaging.intake.server_sends) and answer bodies (what the schema documents)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from messaging.channels.models import CHANNEL_NAME_MAX
from messaging.core.accept import USER_ID_MAX
from messaging.core.protocol import BIGINT_MAX, FEATURE_FAST, FEATURE_RELIABLE, REFERENCE_MAX
from messaging.federation.whereabouts import delivery_where
from messaging.models import DeliveryState, MessageKind

RECIPIENTS_MAX = 10_000  # a shape bound only: the app's recipient limit applies after
IDS_MAX = 1000


@extend_schema_field({
    "oneOf": [
        {"type": "string", "maxLength": USER_ID_MAX, "description": "one user: a MESSAGE", "example": "ANZ-1002"},
        {"type": "array", "minItems": 1, "maxItems": RECIPIENTS_MAX, "items": {"type": "string", "maxLength":
         USER_ID_MAX}, "description": "several users: a GROUP_MESSAGE (duplicates count once)",
         "example": ["ANZ-1002", "ANZ-1003"]},
    ],
})
class RecipientsField(serializers.Field):
    """A user id (one recipient) or a list of user ids (a group send): `(group, [ids])`."""

    default_error_messages = {
        "invalid": "'to' must be a user id or a non-empty list of user ids",
        "too_many": f"'to' may list at most {RECIPIENTS_MAX} users",
    }

    def to_internal_value(self, data: Any) -> tuple[bool, list[str]]:
        if isinstance(data, str) and 0 < len(data) <= USER_ID_MAX:
            return False, [data]
        if isinstance(data, list) and data and all(isinstance(u, str) and 0 < len(u) <= USER_ID_MAX for u in data):
            if len(data) > RECIPIENTS_MAX:
                self.fail("too_many")
            return True, list(data)
        self.fail("invalid")

    def to_representation(self, value: Any) -> Any:
        return value


def _content_field(help_text: str) -> serializers.CharField:
    return serializers.CharField(allow_blank=True, trim_whitespace=False, help_text=help_text)


@extend_schema_serializer(examples=[
    OpenApiExample("to one user, stored and routed", request_only=True,
                   value={"to": "ANZ-1002", "content": "your order shipped", "reference": "order-7781"}),
    OpenApiExample("to several users, FAST (never stored)", request_only=True,
                   value={"to": ["ANZ-1002", "ANZ-1003"], "content": "typing…", "feature": "FAST"}),
])
class MessageSendSerializer(serializers.Serializer):
    to = RecipientsField()
    content = _content_field("Text, at most the app's content limit (64 KiB by default) in UTF-8.")
    feature = serializers.ChoiceField(choices=[FEATURE_RELIABLE, FEATURE_FAST], default=FEATURE_RELIABLE,
                                      help_text="RELIABLE: stored, routed, retried until delivered. FAST: pushed "
                                                "to live connections now, never stored.")
    sender = serializers.CharField(source="sender", required=False, max_length=USER_ID_MAX,
                                   help_text="Sent as `from`: a user of your app; the app's master user if left out.")
    reference = serializers.CharField(required=False, default="", allow_blank=True, max_length=REFERENCE_MAX,
                                      trim_whitespace=False, help_text="Echoed on the recipient's MESSAGE.")
    confirmation = serializers.BooleanField(
        default=False, help_text="One recipient with a reference, RELIABLE: a MESSAGE_CONFIRMATION goes to the "
                                 "sender once it is delivered.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("sender")  # `from` is a Python keyword: declared as `sender`
        return fields


BATCH_MAX = 1000  # messages per POST /api/v1/messages/batch


class MessagesBatchSerializer(serializers.Serializer):
    messages = serializers.ListField(
        child=serializers.DictField(), min_length=1, max_length=BATCH_MAX,
        help_text=f"1 to {BATCH_MAX} messages, each as the body of POST /api/v1/messages (`to`, `content`, "
                  "`feature`, `from`, `reference`, `confirmation`), plus an optional `idempotencyKey` (the app's, as "
                  "the Idempotency-Key header of a single send).")


class BatchResultSerializer(serializers.Serializer):
    id = serializers.CharField(required=False, allow_null=True, help_text="The stored message's id (null for FAST).")
    feature = serializers.CharField(required=False, help_text="FAST, for a FAST message.")
    connections = serializers.IntegerField(required=False, help_text="FAST: the live connections that took it.")
    duplicate = serializers.BooleanField(required=False)
    error = serializers.CharField(required=False, help_text="This message was refused: the code a single send "
                                                            "would answer with.")
    detail = serializers.CharField(required=False)


class BatchResultsSerializer(serializers.Serializer):
    results = BatchResultSerializer(many=True, help_text="One per message, in the order sent.")


class ChannelPublishSerializer(serializers.Serializer):
    content = _content_field("Text, at most the app's content limit in UTF-8.")


@extend_schema_serializer(examples=[
    OpenApiExample("a text message", request_only=True, value={"channel": "qwerty", "message": "hello"}),
    OpenApiExample("a JSON message (delivered as its JSON text)", request_only=True,
                   value={"channel": "prices", "message": {"sku": 7, "price": 9.5}}),
])
class PushPublishSerializer(serializers.Serializer):
    channel = serializers.CharField(max_length=CHANNEL_NAME_MAX, trim_whitespace=False)
    message = serializers.JSONField(help_text="Any JSON value; anything but a string is delivered as its JSON text.")


class DeliveryIdsSerializer(serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX), min_length=1,
                                max_length=IDS_MAX, help_text="Dead-letter ids (the `id` of a dead letter).")


# --- answers ------------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="A stable code: unauthenticated, invalid_api_key, invalid_request, "
                                            "malformed_request, unknown_user, unknown_channel, invalid_channel, "
                                            "invalid_content, content_too_large, too_many_recipients, not_found, "
                                            "method_not_allowed, not_acceptable, unsupported_media_type, "
                                            "request_too_large, idempotency_key_reused, "
                                            "idempotency_key_in_progress, rate_limited, unavailable, "
                                            "internal_error")
    detail = serializers.CharField(help_text="What went wrong, for people.")
    fields = serializers.DictField(required=False, help_text="invalid_request: the messages per field.")
    limit = serializers.IntegerField(required=False, help_text="content_too_large, too_many_recipients: the limit.")


class MessageAcceptedSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The message id (digits, as on the recipients' MESSAGE frames).")
    feature = serializers.CharField()
    sender = serializers.CharField()
    recipients = serializers.ListField(child=serializers.CharField())
    deliveries = serializers.IntegerField(help_text="Delivery rows made: one per recipient.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("sender")
        return fields


class FastSentSerializer(serializers.Serializer):
    feature = serializers.CharField()
    sender = serializers.CharField()
    recipients = serializers.ListField(child=serializers.CharField())
    connections = serializers.IntegerField(help_text="Live connections that took it.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("sender")
        return fields


class ChannelPublishedSerializer(serializers.Serializer):
    channel = serializers.CharField()
    offset = serializers.IntegerField(help_text="The publish's place in the channel's history (1, 2, 3, … no gaps).")
    subscribers = serializers.IntegerField(help_text="Live readers of the channel in the cluster it went out to.")


class PushAcceptedSerializer(serializers.Serializer):
    subscribers = serializers.IntegerField()


class DeliverySerializer(serializers.Serializer):
    recipient = serializers.CharField()
    seq = serializers.IntegerField(help_text="The message's place in the recipient's mailbox.")
    state = serializers.ChoiceField(choices=DeliveryState.values)
    attempts = serializers.IntegerField(help_text="Failed attempts so far.")
    created_at = serializers.DateTimeField()
    sent_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)
    dead_at = serializers.DateTimeField(allow_null=True)
    expired_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)
    forwarded_to = serializers.CharField(
        source="forward_to", allow_blank=True,
        help_text="For a recipient homed in another domain: the neighbouring domain the message was handed to "
                  "(state `forwarding`: waiting on that link; `forwarded`: stored there, on its way; then "
                  "`delivered` or `dead` once the recipient's home domain reports back). Empty otherwise.")
    where = serializers.SerializerMethodField(
        help_text='Where the message is, in words ("forwarded to domain-02, delivered in domain-03"); empty for a '
                  "recipient of this domain.")

    @extend_schema_field(serializers.CharField())
    def get_where(self, obj) -> str:
        return delivery_where(obj)


class MessageStatusSerializer(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.ChoiceField(choices=MessageKind.values)
    sender = serializers.CharField()
    content = serializers.CharField(allow_blank=True)
    reference = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    deliveries = DeliverySerializer(many=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("sender")
        return fields


class SubscriptionSerializer(serializers.Serializer):
    user_id = serializers.CharField(source="subscriber")
    channel = serializers.CharField()
    created_at = serializers.DateTimeField()


class SubscribedSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    channel = serializers.CharField()
    created = serializers.BooleanField(help_text="False when the user was subscribed already.")


class UserPresenceSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    domain = serializers.CharField(allow_null=True, help_text="The user's home domain (where it connects).")
    online = serializers.BooleanField(allow_null=True, help_text="For a user homed in another domain, as that domain "
                                                                 "last told this one (a few seconds late); null while "
                                                                 "this domain has not heard from it.")
    connections = serializers.IntegerField(allow_null=True)


class ChannelMemberSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    connections = serializers.IntegerField()


class HistoryItemSerializer(serializers.Serializer):
    offset = serializers.IntegerField()
    content = serializers.CharField(allow_blank=True)


class DeadLetterSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The dead letter's id: what re-queue and discard take.")
    message_id = serializers.CharField()
    sender = serializers.CharField(source="message.sender")
    kind = serializers.CharField(source="message.kind")
    reference = serializers.CharField(source="message.reference", allow_blank=True)
    recipient = serializers.CharField()
    seq = serializers.IntegerField()
    attempts = serializers.IntegerField()
    last_error = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    sent_at = serializers.DateTimeField(allow_null=True)
    dead_at = serializers.DateTimeField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("sender")
        return fields


class RequeuedSerializer(serializers.Serializer):
    requeued = serializers.IntegerField(help_text="Dead letters of your app among `ids` that were re-queued.")


class DiscardedSerializer(serializers.Serializer):
    discarded = serializers.IntegerField(help_text="Dead letters of your app among `ids` that were discarded.")


class DisconnectedSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    closed = serializers.IntegerField(help_text="Connections told to close (with 1000).")


class EventsSendSerializer(serializers.Serializer):
    events = serializers.ListField(
        child=serializers.CharField(max_length=64, trim_whitespace=False),
        min_length=1, max_length=settings.EXCHANGE_INTAKE_MAX_EVENTS,
        help_text="Event lines `seq|kind|from|to` without their line end, e.g. `666|F|60|50`, `1|U|12|9`, `542532|B`, "
                  "`43|P|32|56`, `634|S|32`. Any order: the exchange restores sequence order.")


class EventsAcceptedSerializer(serializers.Serializer):
    accepted = serializers.IntegerField(help_text="Event lines appended for the exchange.")
    stream = serializers.CharField(help_text="The batch's entry id in the app's intake stream.")


class FollowerSerializer(serializers.Serializer):
    user = serializers.IntegerField(source="follower")
    since = serializers.DateTimeField(source="created_at")


class FolloweeSerializer(serializers.Serializer):
    user = serializers.IntegerField(source="followee")
    since = serializers.DateTimeField(source="created_at")


def page_of(name: str, item: type[serializers.Serializer], **extra: serializers.Field) -> type[serializers.Serializer]:
    """The documented shape of a page of `item`s (messaging.api.pagination)."""
    fields: dict[str, Any] = {
        **extra,
        "results": item(many=True),
        "next": serializers.URLField(allow_null=True, help_text="The next page; null on the last."),
        "previous": serializers.URLField(allow_null=True),
    }
    return type(name, (serializers.Serializer,), fields)


FollowerPageSerializer = page_of("FollowerPage", FollowerSerializer, user=serializers.IntegerField())
FolloweePageSerializer = page_of("FolloweePage", FolloweeSerializer, user=serializers.IntegerField())
SubscriptionPageSerializer = page_of("SubscriptionPage", SubscriptionSerializer)
DeadLetterPageSerializer = page_of("DeadLetterPage", DeadLetterSerializer)
ChannelMembersPageSerializer = page_of(
    "ChannelMembersPage", ChannelMemberSerializer, channel=serializers.CharField(),
    readers=serializers.IntegerField(help_text="Live readers of the channel in the cluster (any transport, durable "
                                               "or not)."))
HistoryPageSerializer = page_of("HistoryPage", HistoryItemSerializer, channel=serializers.CharField())
OnlineUsersPageSerializer = type("OnlineUsersPage", (serializers.Serializer,), {
    "count": serializers.IntegerField(help_text="Users of the app online when this page was read."),
    "results": serializers.ListField(child=serializers.CharField(), help_text="User ids, in byte-wise order."),
    "next": serializers.URLField(allow_null=True, help_text="The next page; null on the last."),
    "previous": serializers.URLField(allow_null=True, help_text="Always null: pages go forward only."),
})
