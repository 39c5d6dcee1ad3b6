"""An app entry's Pusher credentials in the configuration YAML (apps_registry.config_io):

    pusher: {appId: "1234567", key: "a1b2…", secret: "…", clientEvents: true}

Exports always write `appId` and `key` (the key is public; the app id is in every API path) and
`clientEvents` when on; `secret` only with include_secrets, like `tokenSecret`. Importing an entry
without `pusher` keeps the app's credentials (a new app gets generated ones); one without `secret`
keeps the app's secret, one without `clientEvents` keeps the switch (a mirror sets it off, as the
meta's export leaves it out when off). A key or app id another app has is refused.
"""

from __future__ import annotations

import re
from typing import Any

from .config_entries import ConfigError
from .models import ClientApp
from .pusher_credentials import PusherCredentials

# What a Pusher client library accepts in a URL path and a query without escaping.
_TOKEN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def pusher_export(app: ClientApp, *, include_secrets: bool) -> dict[str, Any] | None:
    try:
        creds = app.pusher  # (config_export selects it with the app: no query per app)
    except PusherCredentials.DoesNotExist:
        return None
    item: dict[str, Any] = {"appId": creds.pusher_app_id, "key": creds.key}
    if include_secrets:
        item["secret"] = creds.secret
    if creds.client_events:
        item["clientEvents"] = True
    return item


def pusher_import(app: ClientApp, entry: Any, where: str, *, mirror: bool) -> bool:
    """Apply an entry's `pusher` mapping to the app's credentials; True if something changed."""
    where = f"{where} pusher"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping with appId and key")
    creds, _ = PusherCredentials.objects.get_or_create(app=app)
    fields: dict[str, Any] = {}
    for key, field in (("appId", "pusher_app_id"), ("key", "key"), ("secret", "secret")):
        if entry.get(key) in (None, ""):
            continue
        value = str(entry[key])
        if key != "secret" and not _TOKEN.fullmatch(value):
            raise ConfigError(f"{where}: {key} must be 1 to 64 of A-Z a-z 0-9 _ . -")
        if key != "secret" and PusherCredentials.objects.filter(**{field: value}).exclude(app=app).exists():
            raise ConfigError(f"{where}: {key} '{value}' already belongs to another app")
        if key == "secret" and not 16 <= len(value) <= 128:
            raise ConfigError(f"{where}: secret must be 16 to 128 characters")
        fields[field] = value
    client_events = entry.get("clientEvents", None if not mirror else False)
    if client_events is not None:
        if not isinstance(client_events, bool):
            raise ConfigError(f"{where}: clientEvents must be true or false")
        fields["client_events"] = client_events
    changed = {k: v for k, v in fields.items() if getattr(creds, k) != v}
    if changed:
        for k, v in changed.items():
            setattr(creds, k, v)
        creds.save(update_fields=list(changed))
    return bool(changed)
