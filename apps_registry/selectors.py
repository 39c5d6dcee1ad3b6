"""Read-side queries of the configuration registry."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from .models import USER_ID_RE, ClientApp, Domain, UserDistribution


@dataclass(frozen=True)
class UserId:
    app_name: str
    number: int

    def __str__(self) -> str:
        return f"{self.app_name}-{self.number}"


def user_id_parse(user_id: str) -> UserId | None:
    """`ANZ-123223` -> UserId('ANZ', 123223); None when it is not `<appName>-<digits>`."""
    match = USER_ID_RE.match(user_id or "")
    if not match:
        return None
    return UserId(match["app"], int(match["number"]))


def client_app_by_name(app_name: str) -> ClientApp | None:
    return ClientApp.objects.filter(app_name=app_name).first()


def user_distribution_for(*, app: ClientApp, number: int) -> UserDistribution | None:
    # Served by the (app_id, range_from) ordering; distributions per app are few.
    return (
        UserDistribution.objects.select_related("domain")
        .filter(app=app, range_from__lte=number)
        .filter(Q(range_to__isnull=True) | Q(range_to__gte=number))
        .first()
    )


def user_home_domain(user_id: str) -> Domain | None:
    """The domain a user lives in, from its app's distributions; None if unknown or unassigned."""
    parsed = user_id_parse(user_id)
    if parsed is None:
        return None
    app = client_app_by_name(parsed.app_name)
    if app is None:
        return None
    distribution = user_distribution_for(app=app, number=parsed.number)
    return distribution.domain if distribution else None


def distribution_overlaps(
    *, app: ClientApp, range_from: int, range_to: int | None, exclude_id: int | None = None
) -> UserDistribution | None:
    """The first distribution of `app` that shares a user with [range_from, range_to]."""
    qs = UserDistribution.objects.select_related("domain").filter(app=app)
    if exclude_id is not None:
        qs = qs.exclude(pk=exclude_id)
    qs = qs.filter(Q(range_to__isnull=True) | Q(range_to__gte=range_from))
    if range_to is not None:
        qs = qs.filter(range_from__lte=range_to)
    return qs.order_by("range_from").first()
