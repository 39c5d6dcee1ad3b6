"""Reads of the exchange's durable follow graph (the REST API, the /ws bridge)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet

from messaging.exchange.models import Follow


def followers_of(*, app_id: int, user: int) -> QuerySet[Follow]:
    """Who follows `user` (one row per follower)."""
    return Follow.objects.filter(app_id=app_id, followee=user)


def followees_of(*, app_id: int, user: int) -> QuerySet[Follow]:
    """Whom `user` follows (one row per followee)."""
    return Follow.objects.filter(app_id=app_id, follower=user)


def follow_edges_among(*, app_id: int, followees: Iterable[int], followers: Iterable[int]) -> set[tuple[int, int]]:
    """The (follower, followee) edges from `followers` to `followees`: one query for a whole batch."""
    followees, followers = list(followees), list(followers)
    if not followees or not followers:
        return set()
    rows = Follow.objects.filter(app_id=app_id, followee__in=followees, follower__in=followers)
    return set(rows.values_list("follower", "followee"))
