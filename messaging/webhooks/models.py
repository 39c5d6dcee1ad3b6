"""Webhooks: an app's server learns what happened without holding a socket open: the platform
POSTs signed JSON to the app's endpoints (messaging.webhooks; the wire format is docs/webhooks.md).
Tables of the messaging app (registered through messaging.models).
"""

from __future__ import annotations

import secrets
import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from apps_registry.models import ClientApp, RequestEndpoint


class WebhookEvent(models.TextChoices):
    USER_CONNECTED = "user.connected"  # a user's first connection in the cluster opened
    USER_DISCONNECTED = "user.disconnected"  # ... its last one closed
    MESSAGE_DEAD_LETTERED = "message.dead_lettered"  # a delivery used up its attempts
    CHANNEL_OCCUPIED = "channel.occupied"  # a channel got its first reader in the cluster
    CHANNEL_VACATED = "channel.vacated"  # ... and lost its last one
    REQUEST_ANSWERED = "request.answered"  # a client answered the server's request (SERVER_REQUEST)
    REQUEST_TIMED_OUT = "request.timed_out"  # ... or did not within its timeout
    TEST = "webhook.test"  # sent from the console to one endpoint; nobody subscribes to it
    # A client's request, to the webhook URL of the request endpoint it names (messaging.requests),
    # not to the app's webhook endpoints: nobody subscribes to it either.
    REQUEST_RECEIVED = "request.received"
    # Pusher's webhooks (messaging.gateway.pusher.webhooks): sent in Pusher's format, signed with the
    # app's Pusher secret, to the endpoints that name them (never to "*").
    PUSHER_CHANNEL_OCCUPIED = "pusher.channel_occupied"
    PUSHER_CHANNEL_VACATED = "pusher.channel_vacated"
    PUSHER_MEMBER_ADDED = "pusher.member_added"
    PUSHER_MEMBER_REMOVED = "pusher.member_removed"
    PUSHER_CLIENT_EVENT = "pusher.client_event"
    PUSHER_CACHE_MISS = "pusher.cache_miss"


WEBHOOK_ALL_EVENTS = "*"
PUSHER_EVENT_PREFIX = "pusher."
PUSHER_WEBHOOK_EVENTS: tuple[str, ...] = tuple(e.value for e in WebhookEvent if e.startswith(PUSHER_EVENT_PREFIX))
# What "*" means: every Switchboard event an endpoint may want (not Pusher's, nor the two below).
WEBHOOK_SUBSCRIBABLE_EVENTS: tuple[str, ...] = tuple(
    e.value for e in WebhookEvent
    if e not in (WebhookEvent.TEST, WebhookEvent.REQUEST_RECEIVED) and e not in PUSHER_WEBHOOK_EVENTS)
# What an endpoint may list in `events` (besides "*"): the check constraint is built from this.
WEBHOOK_NAMEABLE_EVENTS: tuple[str, ...] = (*WEBHOOK_SUBSCRIBABLE_EVENTS, *PUSHER_WEBHOOK_EVENTS)


class WebhookState(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    RETRYING = "retrying"
    DEAD = "dead"


# What may still be attempted (and what the sweep looks at).
WEBHOOK_OPEN_STATES: tuple[str, ...] = (WebhookState.PENDING.value, WebhookState.RETRYING.value)


def webhook_states_sql(states: tuple[str, ...] | str) -> str:
    """As `states_sql`, for webhook delivery states (literal for the same reason: partial indexes)."""
    if isinstance(states, str):
        return f"'{WebhookState(states).value}'"
    return "(" + ", ".join(f"'{WebhookState(s).value}'" for s in states) + ")"


def webhook_secret_new() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def webhook_events_all() -> list[str]:
    return [WEBHOOK_ALL_EVENTS]


class WebhookEndpoint(models.Model):
    """A URL of one app that is told about the app's events.

    - `events` names the events it wants, or is `["*"]` for all of them; the database refuses an
      empty list and unknown names.
    - `secret` signs every call (HMAC-SHA256 over timestamp and body). Unlike an API key it is
      stored as it is, not hashed: the platform needs it to sign. It is shown once, when the
      endpoint is created; the console never shows it again.
    - `url` is https://. Plain http:// is accepted only where WEBHOOKS_ALLOW_HTTP is on (local runs
      and tests): a setting, so the services and the console's form check it; the database insists
      only on one of the two schemes.
    """

    # The foreign-key index serves "the enabled endpoints of this app" (the per-process event
    # cache, the API's list) and the join that records deliveries.
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField("URL", max_length=500)
    events = ArrayField(models.CharField(max_length=32), default=webhook_events_all,
                        help_text='Event names, or ["*"] for every event.')
    enabled = models.BooleanField(default=True)
    secret = models.CharField(max_length=100, default=webhook_secret_new, editable=False)
    description = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "webhook endpoint"
        constraints = [
            models.CheckConstraint(
                condition=Q(events__len__gt=0) & Q(events__contained_by=[*WEBHOOK_NAMEABLE_EVENTS,
                                                                          WEBHOOK_ALL_EVENTS]),
                name="webhook_endpoint_known_events",
            ),
            models.CheckConstraint(condition=Q(url__startswith="https://") | Q(url__startswith="http://"),
                                   name="webhook_endpoint_http_url"),
        ]

    def __str__(self) -> str:
        return self.url

    def wants(self, event: str) -> bool:
        return (WEBHOOK_ALL_EVENTS in self.events and event in WEBHOOK_SUBSCRIBABLE_EVENTS) or event in self.events


class WebhookDelivery(models.Model):
    """One event for one endpoint, and its attempts (messaging.webhooks.delivery).

    - `payload` is the exact JSON body, whose "id" is this row's id: every attempt sends the same
      body (with a fresh signature timestamp), so a receiver de-duplicates by it.
    - pending -> delivered, with retrying between failed attempts and dead (the webhook's own
      dead-letter state) once WEBHOOK_MAX_ATTEMPTS attempts have failed. Every move is one
      conditional statement naming the row's current claim.
    - `next_attempt_at`, while pending or retrying: when the sweep hands the row out (again): the
      end of the current hand-out's lease, or when the next attempt is due after a failure. NULL
      once delivered or dead.
    - `claim` is the token of the current hand-out: the task's attempt and its outcome name it, so
      a duplicate or late task never sends a row someone else holds, nor records over it.
    - `attempts` counts failed attempts (a non-2xx answer, a timeout, a refused connection).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Where the call goes: one of the app's webhook endpoints, or (request.received) the webhook of
    # the request endpoint a client's request names; exactly one (webhook_delivery_one_target).
    # The foreign-key indexes serve deleting an endpoint (cascade) and the console's "deliveries of
    # this endpoint".
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries", null=True,
                                 blank=True)
    request_endpoint = models.ForeignKey(RequestEndpoint, on_delete=models.CASCADE, related_name="+", null=True,
                                         blank=True)
    event = models.CharField(max_length=32, choices=WebhookEvent.choices)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=WebhookState.choices, default=WebhookState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claim = models.BigIntegerField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True,
                                                   help_text="HTTP status of the last attempt (empty: no answer)")
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.CheckConstraint(condition=Q(endpoint__isnull=False, request_endpoint__isnull=True)
                                   | Q(endpoint__isnull=True, request_endpoint__isnull=False),
                                   name="webhook_delivery_one_target"),
        ]
        indexes = [
            # The sweep: open deliveries whose timer ran out. Partial: delivered and dead rows,
            # nearly all of the table, never weigh on it.
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due",
                         condition=Q(state__in=WEBHOOK_OPEN_STATES)),
            # The console's list, newest first, and retention's purge of the oldest.
            models.Index(fields=["-created_at"], name="webhook_delivery_recent"),
            # The console's (and /metrics') dead webhooks, newest first.
            models.Index(fields=["-created_at"], name="webhook_delivery_dead",
                         condition=Q(state=WebhookState.DEAD.value)),
        ]

    def __str__(self) -> str:
        return f"{self.event} -> {self.endpoint_id or 'request endpoint ' + str(self.request_endpoint_id)} [{self.state}]"
