"""Read-side queries of messaging for the server API (each confined to one app by `app_id`)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from apps_registry.selectors import AppSnapshot, user_id_parse
from messaging.models import Delivery, DeliveryState, Message, Subscription
from presence import cache
from presence.remote import remote_heard_of, remote_online_sync


@dataclass(frozen=True)
class MessageStatus:
    message: Message
    deliveries: list[Delivery]  # one per recipient, by recipient


def message_status(*, app_id: int, message_id: int) -> MessageStatus | None:
    """A message of the app with its per-recipient delivery record (two queries: the message by
    primary key, its deliveries by the message_id index)."""
    message = Message.objects.filter(app_id=app_id, pk=message_id).first()
    if message is None:
        return None
    return MessageStatus(message, list(Delivery.objects.filter(message_id=message.pk).order_by("recipient")))


def dead_letters_of(*, app_id: int) -> QuerySet[Delivery]:
    """The app's dead letters with their messages' sender and kind (one query per page), meant to be
    read newest first: served by the partial index delivery_dead_letters."""
    return (Delivery.objects.filter(app_id=app_id, state=DeliveryState.DEAD.value)
            .select_related("message").only("id", "message_id", "recipient", "seq", "attempts", "last_error",
                                             "created_at", "sent_at", "dead_at", "message__sender",
                                             "message__kind", "message__reference"))


def subscriptions_of_user(*, app_id: int, user_id: str) -> QuerySet[Subscription]:
    """A user's durable subscriptions (the subscription_once index), meant to be read by channel."""
    return Subscription.objects.filter(app_id=app_id, subscriber=user_id)


def subscribers_of_channel(*, app_id: int, channel: str) -> QuerySet[Subscription]:
    """A channel's durable subscribers (the subscription_members index), meant to be read by user."""
    return Subscription.objects.filter(app_id=app_id, channel=channel)


@dataclass(frozen=True)
class UserPresence:
    user_id: str
    domain: str | None  # the user's home domain (from the app's distributions)
    online: bool | None  # None: homed in another domain, whose cluster alone knows
    connections: int | None


def user_presence(*, app: AppSnapshot, user_id: str, this_domain: str) -> UserPresence:
    """Whether a user (already known to be a user of `app`) is connected, from the presence cache
    (for a user homed in another domain, from what that domain last told this one)."""
    parsed = user_id_parse(user_id)
    domain = app.home_domain(parsed.number) if parsed else None
    if domain != this_domain:  # as this domain heard from that one (presence.remote); None: no word of it
        heard = domain is not None and remote_heard_of(app.app_name, domain)
        online = remote_online_sync(app.app_name, domain, user_id) if heard else None
        return UserPresence(user_id=user_id, domain=domain, online=online, connections=None)
    count = connection_counts([user_id])[user_id]
    return UserPresence(user_id=user_id, domain=domain, online=count > 0, connections=count)


def connection_counts(user_ids: list[str]) -> dict[str, int]:
    """How many live connections each user has in this cluster (one Redis round trip)."""
    return {user: len(conns) for user, conns in cache.connections_of_many(user_ids).items()}
