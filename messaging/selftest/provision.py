"""The platform's side of a selftest run (docs/operations: "Check a live deployment").

`selftest_begin` hands a run what it needs to act as an app's server and its users, and records it
(apps_registry.models.SelftestRun); `selftest_end` removes exactly what the run was given:

- without an app name: a throwaway app `selftest_<hex>` (signed tokens, client subscriptions on),
  with every user homed on this node's domain (settings.DOMAIN_NAME), its master `<app>-1` and
  three users. Ending the run deletes the app, and with it everything it holds.
- with an app name: the operator's app, unchanged; three user numbers of it homed on this domain
  that nothing has used (no mailbox, message, session or subscription), a temporary API key, and
  the app's own master user when it is homed here (else the presence check is skipped, said so).
  Ending the run deletes the key, the throwaway users' messages, deliveries, mailboxes, sessions
  and subscriptions, the test channel and the test webhook endpoint. Presence history stays
  (presence.models.PresenceEvent is append-only by design), and webhooks the app's own endpoints
  were sent about the throwaway users cannot be taken back.

An app in auth-URL mode cannot be tested on: only its own auth service can log its users in.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps_registry.models import ApiKey, AuthMode, ClientApp, Domain, SelftestRun, UserDistribution
from apps_registry.selectors import app_snapshots_clear, user_id_parse
from apps_registry.services import api_key_create
from foundation.backoff import Backoff
from messaging.channels.models import Channel, Subscription
from messaging.channels.names import channel_grant_sign
from messaging.gateway.authentication import token_sign
from messaging.models import Delivery, IdempotencyKey, Mailbox, Message
from messaging.webhooks.models import WebhookEndpoint
from messaging.webhooks.services import webhook_endpoint_create, webhook_endpoint_delete
from presence.models import Session

THROWAWAY_USERS = 3
TOKEN_SECONDS = 3600
WEBHOOK_EVENTS = ["user.connected", "user.disconnected"]
END_ATTEMPTS = 3
END_RETRY = Backoff(base=0.2, cap=0.4, jitter=0.0)  # between a delete that lost the race and the next: 0.2 s, 0.4 s
log = logging.getLogger(__name__)


class SelftestRefused(Exception):
    """The run cannot be set up as asked; `code` is the API's error code."""

    def __init__(self, code: str, detail: str, status: int = 400):
        super().__init__(detail)
        self.code, self.detail, self.status = code, detail, status


@dataclass
class SelftestGrant:
    """What the selftest client is given (the operator API's answer, shown once)."""

    name: str
    app_name: str
    app_id: str
    app_created: bool
    api_key: str
    domain: str
    users: dict[str, str]  # user id -> login token
    master: str | None
    master_token: str | None
    master_skipped: str  # why there is no master to test presence with ("" when there is one)
    channel: str
    channel_token: str | None
    client_subscriptions: bool
    webhook_secret: str | None = None
    notes: list[str] = field(default_factory=list)


def _domain() -> Domain:
    domain = Domain.objects.filter(name=settings.DOMAIN_NAME).first()
    if domain is None:
        raise SelftestRefused("not_configured", f"this node's domain {settings.DOMAIN_NAME!r} is not configured", 409)
    return domain


def _throwaway_app(domain: Domain) -> ClientApp:
    name = f"selftest_{secrets.token_hex(4)}"
    app = ClientApp.objects.create(app_name=name, app_id=f"selftest-{secrets.token_hex(8)}",
                                   master_user_id=f"{name}-1", auth_mode=AuthMode.SIGNED_TOKEN,
                                   client_subscriptions_allowed=True)
    UserDistribution.objects.create(app=app, domain=domain, range_from=0, range_to=None)
    return app


def _unused(app: ClientApp, user_id: str) -> bool:
    return not (Mailbox.objects.filter(app=app, user_id=user_id).exists()
                or Message.objects.filter(app=app, sender=user_id).exists()
                or Session.objects.filter(app=app, user_id=user_id).exists()
                or Subscription.objects.filter(app=app, subscriber=user_id).exists())


def _unused_users(app: ClientApp, domain: Domain) -> list[str]:
    ranges = list(UserDistribution.objects.filter(app=app, domain=domain).order_by("range_from"))
    if not ranges:
        raise SelftestRefused("no_users_here", f"app {app.app_name} has no users homed in domain {domain.name}", 409)
    found: list[str] = []
    for _ in range(50 * THROWAWAY_USERS):
        dist = ranges[secrets.randbelow(len(ranges))]
        high = dist.range_to if dist.range_to is not None else dist.range_from + 10**15
        user_id = f"{app.app_name}-{dist.range_from + secrets.randbelow(high - dist.range_from + 1)}"
        if user_id not in found and user_id != app.master_user_id and _unused(app, user_id):
            found.append(user_id)
            if len(found) == THROWAWAY_USERS:
                return found
    raise SelftestRefused("no_users_here", f"app {app.app_name} has no {THROWAWAY_USERS} unused users in domain "
                                           f"{domain.name}", 409)


def _master_here(app: ClientApp, domain: Domain) -> tuple[str | None, str]:
    parsed = user_id_parse(app.master_user_id or "")
    if parsed is None or parsed.app_name != app.app_name:
        return None, "app has no master"
    homed = UserDistribution.objects.filter(app=app, domain=domain, range_from__lte=parsed.number)
    if not homed.filter(range_to__isnull=True).exists() and not homed.filter(range_to__gte=parsed.number).exists():
        return None, f"the app's master is not homed in domain {domain.name}"
    return app.master_user_id, ""


def _token(app: ClientApp, user_id: str) -> str:
    if not app.token_secret:  # auth mode none without a secret: any token is let in
        return "selftest"
    return token_sign(secret=app.token_secret, user_id=user_id,
                      ttl_seconds=min(TOKEN_SECONDS, app.max_token_lifetime_seconds))


def selftest_begin(*, app_name: str | None = None, webhook_url: str | None = None) -> SelftestGrant:
    """Set up a run (a throwaway app, or throwaway users of `app_name`); SelftestRefused says why not."""
    with transaction.atomic():
        domain = _domain()
        if app_name:
            app = ClientApp.objects.filter(app_name=app_name).first()
            if app is None:
                raise SelftestRefused("not_found", f"no app named {app_name!r}", 404)
            if app.auth_mode == AuthMode.AUTH_URL:
                raise SelftestRefused("auth_url_app", f"app {app_name} logs its users in with its own auth URL: "
                                                      "the selftest cannot; run it without --app", 409)
            users = _unused_users(app, domain)
            master, skipped = _master_here(app, domain)
            name = f"st_{secrets.token_hex(6)}"
        else:
            app = _throwaway_app(domain)
            users = [f"{app.app_name}-{1000 + i}" for i in range(1, THROWAWAY_USERS + 1)]
            master, skipped, name = app.master_user_id, "", app.app_name
        # The run's key lasts as long as its users' tokens: a run nobody ends leaves no key that works.
        key, raw_key = api_key_create(app=app, name=f"selftest {name}",
                                      expires_at=timezone.now() + timedelta(seconds=TOKEN_SECONDS))
        channel = f"selftest.{secrets.token_hex(6)}"
        secret = None
        endpoint_id = None
        if webhook_url:
            try:
                endpoint, secret = webhook_endpoint_create(app_id=app.pk, url=webhook_url, events=WEBHOOK_EVENTS,
                                                           description=f"selftest {name}")
            except Exception as exc:  # ValidationError: the URL this platform will not call
                messages = getattr(exc, "messages", None) or [str(exc)]
                raise SelftestRefused("invalid_webhook_url", "; ".join(messages)) from None
            endpoint_id = endpoint.pk
        SelftestRun.objects.create(name=name, app=app, app_created=not app_name, api_key=key, users=users,
                                   channel=channel, webhook_endpoint_id=endpoint_id)
    app_snapshots_clear()
    grant = None
    if app.token_secret:
        grant = channel_grant_sign(secret=app.token_secret, channels=[channel], app_id=app.app_id,
                                   ttl_seconds=min(TOKEN_SECONDS, app.max_token_lifetime_seconds))
    return SelftestGrant(
        name=name, app_name=app.app_name, app_id=app.app_id, app_created=not app_name, api_key=raw_key,
        domain=domain.name, users={u: _token(app, u) for u in users}, master=master,
        master_token=_token(app, master) if master else None, master_skipped=skipped, channel=channel,
        channel_token=grant, client_subscriptions=app.client_subscriptions_allowed, webhook_secret=secret,
    )


def selftest_end(*, name: str) -> bool:
    """Remove what run `name` was given (see the module's docstring); False if there is no such run.

    The run's last connections have just closed, so their disconnect events may still be being
    recorded (a webhook delivery, a confirmation) as the rows they point at are deleted: a row
    inserted between the delete's cascade and its commit fails the commit's foreign-key check. The
    run's webhook endpoints are switched off first (committed: recording joins enabled endpoints
    only), and a delete that lost such a race is made again, picking up the late rows."""
    run = SelftestRun.objects.filter(name=name).first()
    if run is None:
        return False
    endpoints = WebhookEndpoint.objects.filter(app_id=run.app_id)
    if not run.app_created:
        endpoints = endpoints.filter(pk=run.webhook_endpoint_id)
    endpoints.update(enabled=False)
    for attempt in range(1, END_ATTEMPTS + 1):
        try:
            return _end(name)
        except IntegrityError:
            if attempt == END_ATTEMPTS:
                raise
            log.info("selftest run %s: a row recorded during its cleanup; removing again", name)
            time.sleep(END_RETRY.seconds(attempt))
    return False


def _end(name: str) -> bool:
    with transaction.atomic():
        run = SelftestRun.objects.select_for_update().filter(name=name).select_related("app").first()
        if run is None:
            return False
        app = run.app
        if run.app_created:
            app.delete()  # cascades to the run, its key, messages, mailboxes, sessions, channels, webhooks
        else:
            users = list(run.users)
            if run.webhook_endpoint_id is not None:
                webhook_endpoint_delete(app_id=app.pk, endpoint_id=run.webhook_endpoint_id)
            Delivery.objects.filter(app=app, recipient__in=users).delete()
            Message.objects.filter(app=app, sender__in=users).delete()
            Mailbox.objects.filter(app=app, user_id__in=users).delete()
            Session.objects.filter(app=app, user_id__in=users).delete()
            Subscription.objects.filter(app=app, subscriber__in=users).delete()
            Channel.objects.filter(app=app, name=run.channel).delete()
            IdempotencyKey.objects.filter(app=app, key__startswith=f"{run.name}-").delete()
            if run.api_key_id is not None:
                ApiKey.objects.filter(pk=run.api_key_id).delete()
            run.delete()
    app_snapshots_clear()
    return True
