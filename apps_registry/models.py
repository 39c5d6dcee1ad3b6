r"""The configuration registry: client apps, their API keys, domains, links and user distributions.

What the database guarantees (not just the forms):
- an app name (the user-id prefix) and an appId belong to one app;
- an API key is stored only as a SHA-256 digest; its short prefix is unique and shown;
- a domain link joins two different domains, and a pair is linked at most once in either order;
- a domain's number (its block of message ids) belongs to one domain and lies in 1..DOMAIN_NUMBER_MAX;
- within one app, user distributions never overlap: a trigger (migration 0002) locks the app row and
  refuses an overlapping range, so two concurrent admins cannot both win. (An exclusion constraint
  would need btree_gist, which the embedded Postgres and many managed ones lack.)

An app admits anyone only where an operator chose auth mode `none` (a new app gets signed tokens
with a generated secret); an app in auth-URL mode with the URL switched off refuses every login
(`clean` refuses saving it, messaging.gateway.authentication refuses logins to rows saved before).

A user id is `<appName>-<number>`, ASCII digits without a leading zero: one id per user (`ANZ-0123`,
full-width or Arabic-Indic digits are not ids; Python's `\d` would accept the last two).
"""

from __future__ import annotations

import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from apps_registry.id_blocks import DOMAIN_NUMBER_MAX, MESSAGE_ID_BLOCK_BITS, MESSAGE_ID_BLOCK_SIZE  # noqa: F401
from apps_registry.pusher_credentials import PusherCredentials  # (a model of this app, in its own module)
from apps_registry.ranges import UserRange
from apps_registry.takeover import Takeover  # noqa: F401  (a model of this app, in its own module)
from foundation.names import DOMAIN_NAME_PATTERN

APP_NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_.]{0,63}"
APP_NAME_RE = rf"^{APP_NAME_PATTERN}\Z"
DOMAIN_NAME_RE = rf"^{DOMAIN_NAME_PATTERN}\Z"
# ASCII digits only, no leading zero, at most 18 digits (fits a bigint); use with fullmatch.
USER_ID_RE = re.compile(rf"(?P<app>{APP_NAME_PATTERN})-(?P<number>0|[1-9][0-9]{{0,17}})", re.ASCII)


class AuthMode(models.TextChoices):
    NONE = "none", "none: appId and user-id prefix only (anyone may log in)"
    AUTH_URL = "auth_url", "external auth URL"
    SIGNED_TOKEN = "signed_token", "signed token (HMAC-SHA256)"


# What auth mode `none` and push open mode mean, said once: the admin's help texts and warnings, the deploy check.
OPEN_APP_MEANING = "anyone who knows the appId can log in as any user of this app, including its master user"
PUSH_OPEN_MEANING = ("the push service's endpoints serve requests without credentials as this app's: anyone may "
                     "publish on its public channels with POST /messages without an API key, and read them on "
                     "/sse/messages and /ws/messages without ?app= or a token")
AUTH_URL_DISABLED_REFUSAL = ("The external auth URL mode needs the auth URL enabled: while it is off, every login is "
                             "refused. Enable it, or choose another auth mode.")


def new_token_secret() -> str:
    """A new app's signed-token secret: the app works (and admits nobody without a token) until the
    operator sets the secret their own server signs with."""
    return secrets.token_urlsafe(32)


class ClientApp(models.Model):
    """A tenant. Its end users are `<app_name>-<digits>`; its master user sees their presence."""

    app_name = models.CharField(
        "app name", max_length=64, unique=True, validators=[RegexValidator(APP_NAME_RE)],
        help_text="Also the user-id prefix: users of this app are APPNAME-<digits>.",
    )
    app_id = models.CharField("appId", max_length=128, unique=True)
    master_user_id = models.CharField("master user id", max_length=96)

    # Authentication unless an operator chooses `none` (migration 0005 changed the default only).
    auth_mode = models.CharField(
        max_length=16, choices=AuthMode.choices, default=AuthMode.SIGNED_TOKEN,
        help_text=f"With 'none', {OPEN_APP_MEANING}. Use it for demos only.",
    )
    auth_url = models.URLField("auth URL", blank=True)
    auth_enabled = models.BooleanField(
        "auth URL enabled", default=False,
        help_text="Must be on with auth mode 'external auth URL'; while it is off, that mode refuses every login.",
    )
    auth_timeout_ms = models.PositiveIntegerField("auth URL timeout (ms)", default=3000)
    token_secret = models.CharField(
        max_length=128, blank=True, default=new_token_secret,
        help_text="HMAC-SHA256 secret for signed tokens (sub = userId, exp). Keep it out of client code.",
    )
    confirmation_enabled = models.BooleanField(default=True)

    max_content_bytes = models.PositiveIntegerField(default=64 * 1024, validators=[MinValueValidator(1)])
    max_group_recipients = models.PositiveIntegerField(default=100, validators=[MinValueValidator(1)])
    rate_limit_per_second = models.FloatField(
        "messages per second per connection", default=50.0, validators=[MinValueValidator(0.1)]
    )
    rate_limit_burst = models.PositiveIntegerField("rate limit burst", default=100, validators=[MinValueValidator(1)])
    deliveries_per_second = models.FloatField(
        "deliveries per second per user", default=200.0, validators=[MinValueValidator(0.1)],
        help_text="Work a user's connections on one node may create: a MESSAGE costs 1, a GROUP_MESSAGE one per "
                  "recipient. Beyond it, sends are refused with INVALID_MESSAGE and a retryAfterMs.",
    )
    deliveries_burst = models.PositiveIntegerField("deliveries burst", default=400, validators=[MinValueValidator(1)])
    max_connections_per_user = models.PositiveIntegerField(
        "connections per user", default=10, validators=[MinValueValidator(1)],
        help_text="Beyond it, AUTH_CLIENT is refused (isAuthenticated false, close 1008).",
    )
    allowed_origins = models.JSONField(
        "allowed origins", default=list, blank=True,
        help_text='Browser origins that may open WebSockets for this app, e.g. ["https://app.example.com"]. '
                  "Empty: any origin (and clients without an Origin header, such as servers).",
    )
    max_token_lifetime_seconds = models.PositiveIntegerField(
        "max token lifetime (s)", default=24 * 3600, validators=[MinValueValidator(1)],
        help_text="Signed tokens whose exp lies further ahead than this are refused.",
    )
    api_rate_limit_per_second = models.FloatField(
        "API requests per second", default=200.0, validators=[MinValueValidator(0.1)],
        help_text="Server REST API requests of all this app's keys together, on every web node together. "
                  "Beyond it, requests are answered 429 with Retry-After.",
    )
    api_rate_limit_burst = models.PositiveIntegerField("API burst", default=400, validators=[MinValueValidator(1)])
    retention_days = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    max_delivery_attempts = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)])

    public_channel_patterns = models.JSONField(
        default=list, blank=True, help_text='Glob patterns of channels anyone may read with ?app=appId, e.g. ["news.*"].'
    )
    client_subscriptions_allowed = models.BooleanField(default=False)
    # The push seed's clients send no key and name no app (`curl -X POST /messages`, `GET
    # /sse/messages?channels=a`): a request like that is this app's, on its public channels. At most
    # one app (the constraint below); never on a production node (messaging.api.authentication,
    # apps_registry.selectors.push_open_app), and `check --deploy` refuses it there (switchboard.E033).
    push_open = models.BooleanField(
        "push open mode", default=False,
        help_text=f"When on, {PUSH_OPEN_MEANING}. For running the push service's clients unchanged in "
                  "development and demos; at most one app; never served in production.",
    )

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["app_name"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(auth_mode=AuthMode.AUTH_URL) | ~Q(auth_url=""), name="auth_url_mode_needs_url"
            ),
            models.CheckConstraint(
                condition=~Q(auth_mode=AuthMode.SIGNED_TOKEN) | ~Q(token_secret=""),
                name="signed_token_mode_needs_secret",
            ),
            # A request without a key or an app belongs to the one open app: never two to choose from.
            models.UniqueConstraint(
                fields=["push_open"], condition=Q(push_open=True), name="one_push_open_app",
                violation_error_message="Another app already has push open mode: at most one app may.",
            ),
        ]

    def __str__(self) -> str:
        return self.app_name

    def save(self, *args, **kwargs) -> None:  # a new app gets its Pusher credentials in its transaction
        with transaction.atomic():
            created = self._state.adding
            super().save(*args, **kwargs)
            if created:
                PusherCredentials.objects.get_or_create(app=self)

    def clean(self) -> None:
        # Not a database constraint: rows saved before it may break the rule; login refuses them
        # (messaging.gateway.authentication) and `check --deploy` names them.
        if self.auth_mode == AuthMode.AUTH_URL and not self.auth_enabled:
            raise ValidationError({"auth_enabled": AUTH_URL_DISABLED_REFUSAL})

    @property
    def uses_auth_url(self) -> bool:
        return self.auth_mode == AuthMode.AUTH_URL and self.auth_enabled

    @property
    def admits_anyone(self) -> bool:
        return self.auth_mode == AuthMode.NONE


class HashedKey(models.Model):
    """A credential shown once and never stored: a unique shown prefix (the lookup, indexed) and a
    SHA-256 digest of the whole key (compared in constant time)."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # A key made for one job (a selftest run) stops working when the job would be over, whether or
    # not anyone ends it; None: until revoked.
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.expired

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expired:
            return "expired"
        return "active" if self.expires_at is None else f"active until {self.expires_at:%Y-%m-%d %H:%M}"

    @property
    def usage(self) -> str:
        """Its state and last use, as the key commands list them."""
        state = f"revoked {self.revoked_at:%Y-%m-%d %H:%M}" if self.revoked_at else self.state
        used = f"{self.last_used_at:%Y-%m-%d %H:%M}" if self.last_used_at else "never"
        return f"{state:24} last used {used}"


class ApiKey(HashedKey):
    """A server-side credential of one app."""

    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="api_keys")

    class Meta(HashedKey.Meta):
        verbose_name = "API key"


class Domain(models.Model):
    """One cluster (its own Postgres and Redis). This node's domain is settings.DOMAIN_NAME."""

    name = models.CharField(max_length=64, unique=True, validators=[RegexValidator(DOMAIN_NAME_RE)])
    urls = models.JSONField(default=list, blank=True, help_text="e.g. ws://host:8000/ws, http://host:8000")
    # Given once and never changed or reused: the domain's database moves its message id sequence
    # into the block when it learns its own number (a trigger, messaging migration 0029).
    number = models.PositiveIntegerField(
        null=True, blank=True, unique=True,
        validators=[MinValueValidator(1), MaxValueValidator(DOMAIN_NUMBER_MAX)],
        help_text=f"1 to {DOMAIN_NUMBER_MAX}, unique in the network, given once and never changed: the domain's "
                  f"messages take their ids from block N (N × 2^{MESSAGE_ID_BLOCK_BITS} upward), and keep them in "
                  "every domain that holds a copy. Empty: block 0, ids as a lone domain has them.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(number__gte=1) & Q(number__lte=DOMAIN_NUMBER_MAX),
                                   name="domain_number_in_range"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_this_node(self) -> bool:
        return self.name == settings.DOMAIN_NAME


def new_link_secret() -> str:
    return secrets.token_urlsafe(32)


class DomainLink(models.Model):
    """An undirected, weighted edge of the domain graph; only enabled links carry traffic, and a
    `liveness_only` link carries only the network's liveness (no route takes it).

    Its shared secret signs the calls between the two domains. A new secret takes effect at the two
    ends up to a configuration pull apart, so for LINK_SECRET_OVERLAP_SECONDS after a change the old
    one stays valid (`previous_secret`): calls are signed with both and either is accepted, and a
    rotation fails no call."""

    n1 = models.ForeignKey(Domain, on_delete=models.CASCADE, related_name="+")
    n2 = models.ForeignKey(Domain, on_delete=models.CASCADE, related_name="+")
    weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    enabled = models.BooleanField(default=True)
    # No message, receipt, publish or standby copy, no route: a way for two domains to hear each
    # other (docs/architecture.md, "How long logins are refused": a pair of lost domains).
    liveness_only = models.BooleanField(
        default=False, db_default=False,
        help_text="Carries only the network's liveness (gossip, link probes, the takeover witness's question), "
                  "never a message; no route takes it.")
    shared_secret = models.CharField(max_length=128, default=new_link_secret)
    previous_secret = models.CharField(max_length=128, blank=True, default="", editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["n1__name", "n2__name"]
        constraints = [
            models.CheckConstraint(condition=~Q(n1=F("n2")), name="domain_link_joins_two_domains"),
            # n1-n2 and n2-n1 are the same undirected link.
            models.UniqueConstraint(Least("n1", "n2"), Greatest("n1", "n2"), name="domain_link_unique_pair"),
        ]

    def __str__(self) -> str:
        return f"{self.n1.name} — {self.n2.name}"

    def save(self, *args, **kwargs) -> None:
        """A changed secret keeps the one it replaces valid for the overlap window."""
        if self.pk is not None:
            before = DomainLink.objects.filter(pk=self.pk).values_list("shared_secret", flat=True).first()
            if before and before != self.shared_secret:
                self.previous_secret = before
                self.previous_secret_until = timezone.now() + timedelta(seconds=settings.LINK_SECRET_OVERLAP_SECONDS)
                if kwargs.get("update_fields") is not None:
                    kwargs["update_fields"] = {*kwargs["update_fields"], "previous_secret", "previous_secret_until"}
        super().save(*args, **kwargs)

    def secrets_valid(self) -> list[str]:
        """The secrets a call over this link may be signed with now: the current one first, then
        the one it replaced while the overlap window lasts."""
        if self.previous_secret and self.previous_secret_until and self.previous_secret_until > timezone.now():
            return [self.shared_secret, self.previous_secret]
        return [self.shared_secret]


class UserDistribution(models.Model):
    """Users `<app>-<from>` … `<app>-<to>` (inclusive; no `to` = no upper end) live in `domain`.

    `standby` (optional, never the home itself) is the domain that keeps a copy of their mailboxes
    and takes them over while their home is lost (docs/architecture.md, "Standby domains")."""

    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="distributions")
    domain = models.ForeignKey(Domain, on_delete=models.PROTECT, related_name="distributions")
    range_from = models.BigIntegerField("from", validators=[MinValueValidator(0)])
    range_to = models.BigIntegerField("to", null=True, blank=True, help_text="Empty means no upper end.")
    standby = models.ForeignKey(
        Domain, on_delete=models.PROTECT, related_name="standby_distributions", null=True, blank=True,
        help_text="The domain that keeps a copy of these users' mailboxes and takes them over while their home "
                  "is lost. Empty: none (the users wait for their home).")

    class Meta:
        ordering = ["app__app_name", "range_from"]
        constraints = [
            models.CheckConstraint(condition=Q(range_from__gte=0), name="distribution_from_not_negative"),
            models.CheckConstraint(
                condition=Q(range_to__isnull=True) | Q(range_to__gte=F("range_from")), name="distribution_to_after_from"
            ),
            models.CheckConstraint(condition=Q(standby__isnull=True) | ~Q(standby=F("domain")),
                                   name="distribution_standby_not_home"),
        ]

    def __str__(self) -> str:
        upper = "" if self.range_to is None else self.range_to
        standby = f" (standby {self.standby.name})" if self.standby_id else ""
        return f"{self.app.app_name} {self.range_from}–{upper} @ {self.domain.name}{standby}"

    @property
    def user_range(self) -> UserRange:
        return UserRange(self.range_from, self.range_to)


class OperatorKey(HashedKey):
    """An operator's credential for the operator API (`/api/v1/operator/…`, e.g. the selftest). It
    reaches every app, so it is created only from the shell (`manage.py operator_key create NAME`),
    shown once, and stored like an ApiKey: a unique shown prefix and a SHA-256 digest of the rest.
    App API keys and operator keys are separate tables with separate prefixes (`sb_` / `sbop_`):
    neither is ever accepted where the other is expected."""

    class Meta(HashedKey.Meta):
        verbose_name = "operator key"


class MetaState(models.Model):
    """The meta role on a domain that pulls its configuration (settings.META_URL): one row, what the
    last pull applied and what went wrong since. The digests are of exported YAML, so an unchanged
    configuration (here and on the meta) is recognised before anything is parsed, and changes nothing."""

    meta_url = models.CharField(max_length=500, blank=True)
    digest = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the configuration last applied.")
    # SHA-256 of this domain's own export right after that: a local edit since then changes it, and
    # the next pull puts the meta's configuration back even though the meta's has not changed.
    local_digest = models.CharField(max_length=64, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True, help_text="The last pull, whatever its outcome.")
    last_error = models.TextField(blank=True)
    notice = models.TextField(blank=True, help_text="What the last applied pull kept on purpose (see README).")

    class Meta:
        verbose_name = "meta state"

    def __str__(self) -> str:
        return f"pulled from {self.meta_url or '-'}"


from apps_registry.endpoints import RequestEndpoint  # noqa: E402, F401  (a model of this app, in its own module)
from apps_registry.selftest_runs import SelftestRun  # noqa: E402, F401  (a model of this app, in its own module)
