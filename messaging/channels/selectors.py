"""Read-side queries of channels."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection

from messaging.channels.models import Subscription


def subscriptions_of(*, app_id: int, user_id: str) -> list[str]:
    """The channels a user is durably subscribed to (the subscription_once index)."""
    return list(Subscription.objects.filter(app_id=app_id, subscriber=user_id).order_by("channel")
                .values_list("channel", flat=True))


def channel_subscribers(*, app_id: int, channel: str) -> list[str]:
    """The users durably subscribed to a channel (the subscription_members index)."""
    return list(Subscription.objects.filter(app_id=app_id, channel=channel).order_by("subscriber")
                .values_list("subscriber", flat=True))


def subscriptions_of_many(*, users: Sequence[tuple[int, str]]) -> dict[tuple[int, str], list[str]]:
    """subscriptions_of for many (app id, user id) pairs in one query (a node's reconnect storm
    authenticates hundreds of users per tick); a user without subscriptions is absent."""
    found: dict[tuple[int, str], list[str]] = {}
    if not users:
        return found
    apps, subscribers = zip(*set(users), strict=True)
    with connection.cursor() as cur:
        # One probe of subscription_once per pair.
        cur.execute(
            """
            SELECT s.app_id, s.subscriber, s.channel
              FROM unnest(%s::bigint[], %s::text[]) AS w(app_id, subscriber)
              JOIN messaging_subscription s ON s.app_id = w.app_id AND s.subscriber = w.subscriber
             ORDER BY s.channel
            """,
            [list(apps), list(subscribers)],
        )
        for app_id, subscriber, channel in cur.fetchall():
            found.setdefault((app_id, subscriber), []).append(channel)
    return found
