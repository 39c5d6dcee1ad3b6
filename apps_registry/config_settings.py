"""An app entry's `settings` in the config YAML (apps_registry.config_io): the app settings that
protect its users, imported (checked by the model fields' own validation) and exported."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from .config_entries import ConfigError
from .models import ClientApp

# The file's name of each app setting that protects its users (`settings:` of an app entry).
APP_SETTINGS = {
    "allowedOrigins": "allowed_origins",
    "maxTokenLifetimeSeconds": "max_token_lifetime_seconds",
    "authTimeoutMs": "auth_timeout_ms",
    "confirmationEnabled": "confirmation_enabled",
    "maxContentBytes": "max_content_bytes",
    "maxGroupRecipients": "max_group_recipients",
    "rateLimitPerSecond": "rate_limit_per_second",
    "rateLimitBurst": "rate_limit_burst",
    "deliveriesPerSecond": "deliveries_per_second",
    "deliveriesBurst": "deliveries_burst",
    "maxConnectionsPerUser": "max_connections_per_user",
    "apiRateLimitPerSecond": "api_rate_limit_per_second",
    "apiRateLimitBurst": "api_rate_limit_burst",
    "retentionDays": "retention_days",
    "maxDeliveryAttempts": "max_delivery_attempts",
}


def _setting_default(field_name: str) -> Any:
    return ClientApp._meta.get_field(field_name).get_default()


def settings_import(entry: dict, where: str, *, mirror: bool) -> dict[str, Any]:
    """The model fields an entry's `settings` sets (checked by the fields' own validation); with
    `mirror`, every setting the entry leaves out is its default."""
    given = entry.get("settings") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: settings must be a mapping")
    unknown = sorted(set(given) - set(APP_SETTINGS))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(APP_SETTINGS)})")
    fields: dict[str, Any] = {}
    for key, name in APP_SETTINGS.items():
        if key not in given:
            if mirror:
                fields[name] = _setting_default(name)
            continue
        value = given[key]
        field = ClientApp._meta.get_field(name)
        if name == "allowed_origins":
            if not isinstance(value, list) or not all(isinstance(o, str) and o for o in value):
                raise ConfigError(f"{where}: settings.allowedOrigins must be a list of origins")
        elif field.get_internal_type() == "BooleanField" and not isinstance(value, bool):
            raise ConfigError(f"{where}: settings.{key} must be true or false")
        elif field.get_internal_type() != "BooleanField" and isinstance(value, bool):
            raise ConfigError(f"{where}: settings.{key} must be a number")
        try:
            fields[name] = field.clean(value, None)
        except ValidationError as exc:
            raise ConfigError(f"{where}: settings.{key}: {' '.join(exc.messages)}") from None
    return fields


def settings_export(app: ClientApp) -> dict[str, Any]:
    return {key: getattr(app, name) for key, name in APP_SETTINGS.items()
            if getattr(app, name) != _setting_default(name)}
