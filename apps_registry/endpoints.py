"""An app's request endpoints (a model of apps_registry, in its own module): what clients name in a
REQUEST, and how their requests reach the app's server (messaging.requests)."""

from __future__ import annotations

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

ENDPOINT_NAME_RE = r"^[A-Za-z][A-Za-z0-9_.-]{0,99}\Z"


def request_webhook_secret_new() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


class RequestEndpoint(models.Model):
    """A named endpoint of an app's server that its clients send requests to (docs/protocol.md,
    "Requests"), and how requests reach the server: the webhook `request.received` at
    `webhook_url` (signed with `webhook_secret`, shown once), and/or an entry on the app's Redis
    stream `sbq:<APPNAME>:requests` (`stream`). At least one of the two (a check constraint).

    `timeout_ms` is a request's timeout when the client names none; a client may ask for up to
    `max_timeout_ms`. A user has at most `max_in_flight_per_user` requests to this endpoint waiting
    for their outcome at a time."""

    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="request_endpoints")
    name = models.CharField(max_length=100, validators=[RegexValidator(ENDPOINT_NAME_RE)],
                            help_text="What clients name in a REQUEST, e.g. orders.place.")
    webhook_url = models.URLField("webhook URL", max_length=500, blank=True, default="",
                                  help_text="Told of each request by the webhook request.received. Empty: none.")
    webhook_secret = models.CharField(max_length=100, default=request_webhook_secret_new, editable=False)
    stream = models.BooleanField(default=False, help_text="Each request is also an entry of sbq:<APPNAME>:requests.")
    timeout_ms = models.PositiveIntegerField(default=30_000, validators=[MinValueValidator(100)])
    max_timeout_ms = models.PositiveIntegerField(default=300_000, validators=[MinValueValidator(100)])
    max_in_flight_per_user = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1)])
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["app__app_name", "name"]
        constraints = [
            # Also what a request's endpoint is looked up by (the app snapshot loads them all).
            models.UniqueConstraint(fields=["app", "name"], name="request_endpoint_name_once_per_app"),
            models.CheckConstraint(condition=~Q(webhook_url="") | Q(stream=True), name="request_endpoint_has_a_way_in"),
            models.CheckConstraint(condition=Q(max_timeout_ms__gte=F("timeout_ms")),
                                   name="request_endpoint_timeout_within_max"),
        ]

    def __str__(self) -> str:
        return f"{self.app.app_name}: {self.name}"

    def clean(self) -> None:
        if not self.webhook_url and not self.stream:
            raise ValidationError("An endpoint needs a webhook URL or the stream (or both).")
        if self.timeout_ms and self.max_timeout_ms and self.max_timeout_ms < self.timeout_ms:
            raise ValidationError({"max_timeout_ms": "At least the default timeout."})
