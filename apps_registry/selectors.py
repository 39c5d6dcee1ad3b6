"""Read-side queries of the configuration registry."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db.models import Case, Exists, F, Max, OuterRef, When
from django.utils import timezone

from .models import USER_ID_RE, AuthMode, ClientApp, Domain, RequestEndpoint, Takeover, UserDistribution, UserRange
from .pusher_credentials import PusherCredentials


@dataclass(frozen=True)
class UserId:
    app_name: str
    number: int

    def __str__(self) -> str:
        return f"{self.app_name}-{self.number}"


def user_id_parse(user_id: str) -> UserId | None:
    """`ANZ-123223` -> UserId('ANZ', 123223); None when it is not `<appName>-<digits>` exactly
    (ASCII digits, no leading zero, nothing before or after)."""
    if not isinstance(user_id, str):
        return None
    match = USER_ID_RE.fullmatch(user_id)
    if not match:
        return None
    return UserId(match["app"], int(match["number"]))


def app_names_admitting_anyone() -> list[str]:
    """Apps whose auth mode lets anyone who knows the appId log in as any of their users."""
    return list(ClientApp.objects.filter(auth_mode=AuthMode.NONE).order_by("app_name").values_list("app_name", flat=True))


def app_names_with_auth_url_off() -> list[str]:
    """Apps in auth-URL mode with the URL switched off: every login to them is refused."""
    return list(ClientApp.objects.filter(auth_mode=AuthMode.AUTH_URL, auth_enabled=False)
                .order_by("app_name").values_list("app_name", flat=True))


def client_app_by_name(app_name: str) -> ClientApp | None:
    return ClientApp.objects.filter(app_name=app_name).first()


def user_distribution_for(*, app: ClientApp, number: int) -> UserDistribution | None:
    # Served by the (app_id, range_from) ordering; distributions per app are few.
    return (
        UserDistribution.objects.select_related("domain", "standby")
        .filter(UserRange(number, number).overlapping_q(), app=app)
        .first()
    )


def user_distribution_of(user_id: str) -> UserDistribution | None:
    """The distribution that homes a user (its domain and standby loaded); None if unknown or unassigned."""
    parsed = user_id_parse(user_id)
    if parsed is None:
        return None
    app = client_app_by_name(parsed.app_name)
    if app is None:
        return None
    return user_distribution_for(app=app, number=parsed.number)


def user_home_domain(user_id: str) -> Domain | None:
    """The domain a user lives in, from its app's distributions; None if unknown or unassigned."""
    distribution = user_distribution_of(user_id)
    return distribution.domain if distribution else None


def domain_ws_url(urls: list | None) -> str | None:
    """A domain's WebSocket URL: the first ws:// or wss:// entry of its urls (None: it lists none);
    one without a path (as the linker seed lists them: ws://host:8002) gets the client endpoint's
    path, /ws, so a redirect built from it reaches a WebSocket endpoint whatever the client does."""
    url = next((u for u in urls or () if isinstance(u, str) and u.lower().startswith(("ws://", "wss://"))), None)
    if url is None:
        return None
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/ws")) if parts.path in ("", "/") else url


def domain_call_url(urls: list | None) -> str | None:
    """Where a domain's internal endpoints are (its neighbours' calls, messaging.federation.wire.transport):
    its first http(s) URL, else its first ws(s) URL's origin (ws://host:8002/ws -> http://host:8002)."""
    urls = [u for u in urls or () if isinstance(u, str)]
    for url in urls:
        if url.startswith(("http://", "https://")):
            return url.rstrip("/")
    for url in urls:
        if url.startswith(("ws://", "wss://")):
            scheme, rest = url.split("://", 1)
            return f"{'https' if scheme == 'wss' else 'http'}://{rest.split('/', 1)[0]}"
    return None


def distribution_overlaps(
    *, app: ClientApp, range_from: int, range_to: int | None, exclude_id: int | None = None
) -> UserDistribution | None:
    """The first distribution of `app` that shares a user with [range_from, range_to]."""
    qs = UserDistribution.objects.select_related("domain").filter(UserRange(range_from, range_to).overlapping_q(),
                                                                   app=app)
    if exclude_id is not None:
        qs = qs.exclude(pk=exclude_id)
    return qs.order_by("range_from").first()


# --- hot-path snapshots --------------------------------------------------------------------------
# Every frame a client sends needs its app's limits and the recipient's home domain. Reading them
# from Postgres per frame would cost more than the message itself, so each process keeps an
# immutable snapshot per app for a few seconds (admin edits show up within SNAPSHOT_TTL). The cache
# is bounded: unauthenticated clients choose the names looked up, and each miss is remembered too
# (so a flood of made-up names cannot turn into a flood of queries, nor grow memory).

SNAPSHOT_TTL = 5.0
SNAPSHOT_CACHE_SIZE = 1024


@dataclass(frozen=True)
class EndpointSpec:
    """A request endpoint of an app (RequestEndpoint), as the request path needs it."""

    pk: int
    name: str
    webhook: bool
    stream: bool
    timeout_ms: int
    max_timeout_ms: int
    max_in_flight_per_user: int


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
    deliveries_per_second: float
    deliveries_burst: int
    max_connections_per_user: int
    allowed_origins: tuple[str, ...]
    max_token_lifetime_seconds: int
    api_rate_limit_per_second: float
    api_rate_limit_burst: int
    public_channel_patterns: tuple[str, ...]
    distributions: tuple[tuple[UserRange, str], ...]  # (range, domain name)
    # The WebSocket URL of each domain the distributions name (the first ws:// or wss:// of its urls),
    # for the AUTH_CLIENT refusal that redirects a user to its home domain.
    domain_ws_urls: tuple[tuple[str, str], ...] = ()
    # The ranges with a standby domain: (range, home, standby) as configured, whoever serves them now.
    with_standby: tuple[tuple[UserRange, str, str], ...] = ()
    endpoints: tuple[EndpointSpec, ...] = ()  # the enabled request endpoints
    # Pusher credentials (apps_registry.pusher_credentials); "" for an app loaded without a row.
    pusher_app_id: str = ""
    pusher_key: str = ""
    pusher_secret: str = ""
    pusher_client_events: bool = False
    pusher_enabled: bool = False

    def endpoint(self, name: str) -> EndpointSpec | None:
        return next((e for e in self.endpoints if e.name == name), None)

    def home_domain(self, number: int) -> str | None:
        for user_range, domain in self.distributions:
            if user_range.contains(number):
                return domain
        return None

    def home_of(self, user_id: str) -> str | None:
        """The home domain of a user of this app (None: not a user id of this app, or homed nowhere)."""
        parsed = user_id_parse(user_id)
        return self.home_domain(parsed.number) if parsed and parsed.app_name == self.app_name else None

    def has_standby(self, number: int) -> bool:
        return self.home_and_standby(number) is not None

    def home_and_standby(self, number: int) -> tuple[str, str] | None:
        """The user's configured home and standby (None: it has no standby)."""
        return next(((home, standby) for user_range, home, standby in self.with_standby
                     if user_range.contains(number)), None)

    def ws_url_of(self, domain: str | None) -> str | None:
        return next((url for name, url in self.domain_ws_urls if name == domain), None)

    @property
    def uses_auth_url(self) -> bool:
        return self.auth_mode == AuthMode.AUTH_URL and self.auth_enabled


_snapshots: OrderedDict[tuple[str, str], tuple[float, AppSnapshot | None]] = OrderedDict()
_snapshots_lock = threading.Lock()


# Who serves a home's users (Takeover) must not be 5 s stale where messages are routed: a process
# looks at the takeovers' highest epoch at most every TAKEOVER_LOOK_SECONDS on the synchronous path
# (routing, intake; one small query) and forgets every snapshot when it moved.
TAKEOVER_LOOK_SECONDS = 0.5
_takeovers_seen: tuple[float, int | None] = (float("-inf"), None)


def _takeovers_moved(now: float) -> bool:
    global _takeovers_seen
    with _snapshots_lock:
        if now - _takeovers_seen[0] < TAKEOVER_LOOK_SECONDS:
            return False
        seen = _takeovers_seen[1]
        _takeovers_seen = (now, seen)
    latest = Takeover.objects.aggregate(latest=Max("epoch"))["latest"] or 0
    with _snapshots_lock:
        _takeovers_seen = (now, latest)
    return seen is not None and latest != seen


def _cached(key: tuple[str, str], load) -> AppSnapshot | None:
    now = time.monotonic()
    if _takeovers_moved(now):
        app_snapshots_clear()
    with _snapshots_lock:
        cached = _snapshots.get(key)
        if cached is not None and now - cached[0] < SNAPSHOT_TTL:
            _snapshots.move_to_end(key)
            return cached[1]
    snapshot = load()
    with _snapshots_lock:
        _snapshots[key] = (now, snapshot)
        _snapshots.move_to_end(key)
        while len(_snapshots) > SNAPSHOT_CACHE_SIZE:
            _snapshots.popitem(last=False)
    return snapshot


def app_snapshot_known(app_name: str) -> tuple[bool, AppSnapshot | None]:
    """(True, the app or None) when the cache holds a fresh answer for `app_name`; (False, None)
    when only app_snapshot's query can tell. No I/O: safe on an event loop, so a web node's
    AUTH_CLIENT needs no thread hop for an app it has seen in the last SNAPSHOT_TTL seconds, unless
    the takeovers are due a look (TAKEOVER_LOOK_SECONDS): answered from the cache alone, a web node
    redirected a home's users to their home, or refused them at their new holder, for up to
    SNAPSHOT_TTL after a takeover (4 s of a fault run's 15 s without a login)."""
    now = time.monotonic()
    with _snapshots_lock:
        cached = _snapshots.get(("name", app_name))
        look_due = now - _takeovers_seen[0] >= TAKEOVER_LOOK_SECONDS
    if cached is None or now - cached[0] >= SNAPSHOT_TTL or look_due:
        return False, None
    return True, cached[1]


def app_snapshot(app_name: str) -> AppSnapshot | None:
    """The app whose name (user-id prefix) is `app_name`."""
    return _cached(("name", app_name), lambda: _snapshot_load(ClientApp.objects.filter(app_name=app_name).first()))


def app_snapshot_by_app_id(app_id: str) -> AppSnapshot | None:
    """The app whose appId is `app_id` (stream URLs and tokens name apps this way)."""
    return _cached(("id", app_id), lambda: _snapshot_load(ClientApp.objects.filter(app_id=app_id).first()))


def app_snapshot_by_pusher_key(key: str) -> AppSnapshot | None:
    """The app whose Pusher key is `key` (a Pusher client's `/app/{key}`): cached like the others, a
    miss too, so connections naming made-up keys cost no query each."""
    return _cached(("pusher-key", key), lambda: _snapshot_load(ClientApp.objects.filter(pusher__key=key).first()))


def app_snapshot_by_pusher_app_id(pusher_app_id: str) -> AppSnapshot | None:
    """The app whose Pusher app_id is `pusher_app_id` (the Pusher HTTP API's `/apps/{app_id}/…`)."""
    return _cached(("pusher-id", pusher_app_id),
                   lambda: _snapshot_load(ClientApp.objects.filter(pusher__pusher_app_id=pusher_app_id).first()))


def push_open_app() -> AppSnapshot | None:
    """The app a push-compatible request without a key and without an app belongs to: the one app
    with push open mode (ClientApp.push_open; at most one, a constraint), cached like the other
    snapshots. None when no app has it, and always on a production node: there the mode is never
    served (and `check --deploy` refuses it, switchboard.E033)."""
    if getattr(settings, "PRODUCTION", False):
        return None
    return _cached(("push-open", ""), lambda: _snapshot_load(ClientApp.objects.filter(push_open=True).first()))


def app_names_push_open() -> list[str]:
    """Apps with push open mode (at most one; a list for the deploy check's wording)."""
    return list(ClientApp.objects.filter(push_open=True).order_by("app_name").values_list("app_name", flat=True))


def _snapshot_load(app: ClientApp | None) -> AppSnapshot | None:
    snapshot = None
    if app is not None:
        # Where a range's users live now: their home, or while its standby holds it (a Takeover of
        # the range's home by the range's standby), that standby. Another standby's takeover of the
        # home is of its own ranges, not this one.
        held = Exists(Takeover.objects.filter(home=OuterRef("domain"), holder=OuterRef("standby"), held=True))
        rows = list(UserDistribution.objects.filter(app=app).order_by("range_from").annotate(
            serving=Case(When(held, then=F("standby__name")), default=F("domain__name")),
            serving_urls=Case(When(held, then=F("standby__urls")), default=F("domain__urls"))).values_list(
                "range_from", "range_to", "serving", "serving_urls", "standby__name", "domain__name"))
        dists = tuple((UserRange(low, high), domain) for low, high, domain, *_ in rows)
        ws_urls = {domain: domain_ws_url(urls) for _, _, domain, urls, *_ in rows}
        snapshot = AppSnapshot(
            pk=app.pk, app_name=app.app_name, app_id=app.app_id, master_user_id=app.master_user_id,
            auth_mode=app.auth_mode, auth_url=app.auth_url, auth_enabled=app.auth_enabled,
            auth_timeout_ms=app.auth_timeout_ms, token_secret=app.token_secret,
            confirmation_enabled=app.confirmation_enabled, max_content_bytes=app.max_content_bytes,
            max_group_recipients=app.max_group_recipients, rate_limit_per_second=app.rate_limit_per_second,
            rate_limit_burst=app.rate_limit_burst, retention_days=app.retention_days,
            max_delivery_attempts=app.max_delivery_attempts,
            client_subscriptions_allowed=app.client_subscriptions_allowed,
            deliveries_per_second=app.deliveries_per_second, deliveries_burst=app.deliveries_burst,
            max_connections_per_user=app.max_connections_per_user,
            allowed_origins=tuple(app.allowed_origins or ()),
            max_token_lifetime_seconds=app.max_token_lifetime_seconds,
            api_rate_limit_per_second=app.api_rate_limit_per_second, api_rate_limit_burst=app.api_rate_limit_burst,
            public_channel_patterns=tuple(app.public_channel_patterns or ()), distributions=dists,
            domain_ws_urls=tuple((domain, url) for domain, url in ws_urls.items() if url),
            with_standby=tuple((UserRange(low, high), home, standby) for low, high, _, _, standby, home in rows
                               if standby is not None),
            endpoints=tuple(EndpointSpec(pk=e.pk, name=e.name, webhook=bool(e.webhook_url), stream=e.stream,
                                         timeout_ms=e.timeout_ms, max_timeout_ms=e.max_timeout_ms,
                                         max_in_flight_per_user=e.max_in_flight_per_user)
                            for e in RequestEndpoint.objects.filter(app=app, enabled=True).order_by("name")),
            **_pusher_fields(app),
        )
    return snapshot


def _pusher_fields(app: ClientApp) -> dict:
    creds = PusherCredentials.objects.filter(app=app).first()
    if creds is None:
        return {}
    return {"pusher_app_id": creds.pusher_app_id, "pusher_key": creds.key, "pusher_secret": creds.secret,
            "pusher_client_events": creds.client_events, "pusher_enabled": creds.enabled}


def app_snapshots_clear() -> None:
    with _snapshots_lock:
        _snapshots.clear()


MAX_TAKEOVERS = 1000


def takeover_records(*, changed_within: float | None = None) -> list[dict]:
    """The takeover records as the network's gossip tells them (messaging.federation.takeover.take), by home
    and holder; `changed_within`: only those this domain wrote or learned in the last so many seconds."""
    rows = Takeover.objects.select_related("home", "holder").order_by("home__name", "holder__name")
    if changed_within is not None:
        rows = rows.filter(learned_at__gte=timezone.now() - timedelta(seconds=changed_within))
    return [{"home": t.home.name, "holder": t.holder.name, "held": t.held, "epoch": t.epoch,
             "taken_at": t.taken_at.isoformat(), "returned_at": t.returned_at.isoformat() if t.returned_at else None,
             "manual": t.manual, "reason": t.reason, "returning": t.held and t.returning_since is not None}
            for t in rows[:MAX_TAKEOVERS]]
