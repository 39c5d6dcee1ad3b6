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


# --- hot-path snapshots --------------------------------------------------------------------------
# Every frame a client sends needs its app's limits and the recipient's home domain. Reading them
# from Postgres per frame would cost more than the message itself, so each process keeps an
# immutable snapshot per app for a few seconds (admin edits show up within SNAPSHOT_TTL).

SNAPSHOT_TTL = 5.0


@dataclass(frozen=True)
class AppSnapshot:
    pk: int
    app_name: str
    app_id: str
    master_user_id: str
    auth_mode: str
    auth_url: str
    auth_enabled: bool
    auth_timeout_ms: int
    token_secret: str
    confirmation_enabled: bool
    max_content_bytes: int
    max_group_recipients: int
    rate_limit_per_second: float
    rate_limit_burst: int
    retention_days: int
    max_delivery_attempts: int
    client_subscriptions_allowed: bool
    distributions: tuple[tuple[int, int | None, str], ...]  # (from, to or None, domain name)

    def home_domain(self, number: int) -> str | None:
        for low, high, domain in self.distributions:
            if number >= low and (high is None or number <= high):
                return domain
        return None

    @property
    def uses_auth_url(self) -> bool:
        return self.auth_mode == "auth_url" and self.auth_enabled


_snapshots: dict[str, tuple[float, AppSnapshot | None]] = {}


def app_snapshot(app_name: str) -> AppSnapshot | None:
    import time

    now = time.monotonic()
    cached = _snapshots.get(app_name)
    if cached is not None and now - cached[0] < SNAPSHOT_TTL:
        return cached[1]
    app = ClientApp.objects.filter(app_name=app_name).first()
    snapshot = None
    if app is not None:
        dists = tuple(
            UserDistribution.objects.filter(app=app).order_by("range_from").values_list(
                "range_from", "range_to", "domain__name")
        )
        snapshot = AppSnapshot(
            pk=app.pk, app_name=app.app_name, app_id=app.app_id, master_user_id=app.master_user_id,
            auth_mode=app.auth_mode, auth_url=app.auth_url, auth_enabled=app.auth_enabled,
            auth_timeout_ms=app.auth_timeout_ms, token_secret=app.token_secret,
            confirmation_enabled=app.confirmation_enabled, max_content_bytes=app.max_content_bytes,
            max_group_recipients=app.max_group_recipients, rate_limit_per_second=app.rate_limit_per_second,
            rate_limit_burst=app.rate_limit_burst, retention_days=app.retention_days,
            max_delivery_attempts=app.max_delivery_attempts,
            client_subscriptions_allowed=app.client_subscriptions_allowed, distributions=dists,
        )
    _snapshots[app_name] = (now, snapshot)
    return snapshot


def app_snapshots_clear() -> None:
    _snapshots.clear()
