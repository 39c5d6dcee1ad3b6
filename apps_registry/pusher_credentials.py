"""An app's Pusher Channels credentials (a model of apps_registry, in its own module): what
`pusher-js`, Laravel Echo and the `pusher` server libraries are configured with to use Switchboard
as their Pusher server (docs/protocol.md, "Pusher protocol").

- `pusher_app_id` (Pusher's `app_id`) names the app in the HTTP API's paths (`/apps/{app_id}/events`);
- `key` is public: browsers connect with it (`/app/{key}`) and it signs nothing;
- `secret` signs the HTTP API's queries and the channel authorizations an app's server gives its
  clients (HMAC-SHA256). Like the app's token secret it is kept in clear (an HMAC needs it), shown
  in the console only when it is made (rotated), and in exports only with include_secrets;
- `client_events`: whether clients may send `client-*` events on private and presence channels;
- `enabled`: off refuses the app's Pusher clients (4003) and its Pusher HTTP API calls (403).

Every app has one row (created with the app, ClientApp.save; migration 0015 made them for the apps
that existed). The key and the Pusher app id are unique across apps: a web node finds an app by its key
(apps_registry.selectors.app_snapshot_by_pusher_key) and the HTTP API by its app id.
"""

from __future__ import annotations

import secrets

from django.db import models


def new_pusher_app_id() -> str:
    # Pusher's app ids are decimal numbers; libraries and Laravel's config treat them as strings.
    return str(secrets.randbelow(9_000_000) + 1_000_000)


def new_pusher_key() -> str:
    return secrets.token_hex(10)  # 20 hex digits, as Pusher's keys


def new_pusher_secret() -> str:
    return secrets.token_hex(16)


class PusherCredentials(models.Model):
    app = models.OneToOneField("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="pusher")
    pusher_app_id = models.CharField("Pusher app_id", max_length=64, unique=True, default=new_pusher_app_id)
    key = models.CharField("Pusher key", max_length=64, unique=True, default=new_pusher_key)
    secret = models.CharField("Pusher secret", max_length=128, default=new_pusher_secret)
    client_events = models.BooleanField(
        "client events", default=False,
        help_text="Clients may send client-* events to the other subscribers of private and presence channels.")
    enabled = models.BooleanField(
        default=True, help_text="Off: Pusher clients are refused (close 4003) and the Pusher HTTP API answers 403.")
    secret_rotated_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "Pusher credentials"
        verbose_name_plural = "Pusher credentials"
        ordering = ["app__app_name"]

    def __str__(self) -> str:
        return f"{self.app} (Pusher app {self.pusher_app_id})"
