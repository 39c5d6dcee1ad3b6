"""Read-side queries of channels."""

from __future__ import annotations

from messaging.channels.models import Subscription


def subscriptions_of(*, app_id: int, user_id: str) -> list[str]:
    """The channels a user is durably subscribed to (the subscription_once index)."""
    return list(Subscription.objects.filter(app_id=app_id, subscriber=user_id).order_by("channel")
                .values_list("channel", flat=True))


def channel_subscribers(*, app_id: int, channel: str) -> list[str]:
    """The users durably subscribed to a channel (the subscription_members index)."""
    return list(Subscription.objects.filter(app_id=app_id, channel=channel).order_by("subscriber")
                .values_list("subscriber", flat=True))
