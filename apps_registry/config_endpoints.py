"""An app entry's `endpoints` in the config YAML (apps_registry.config_io): its request endpoints,
imported and exported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from .config_entries import ConfigError, entry_int, entry_required, validation_text
from .models import ClientApp, RequestEndpoint


@dataclass
class EndpointsImported:
    created: int = 0
    updated: int = 0
    secrets: list[tuple[str, str, str]] = field(default_factory=list)  # (app, endpoint, webhook secret): shown once


ENDPOINT_KEYS = {"name": "name", "webhook": "webhook_url", "stream": "stream", "timeoutMs": "timeout_ms",
                 "maxTimeoutMs": "max_timeout_ms", "maxInFlightPerUser": "max_in_flight_per_user",
                 "webhookSecret": "webhook_secret"}
SECRET_MAX = 100


def endpoints_import(app: ClientApp, entries: list, where: str) -> EndpointsImported:
    """The app's request endpoints become exactly the file's (matched by name); an endpoint's webhook
    secret is the file's `webhookSecret` where it has one (the meta role's export: every domain of
    the network signs an endpoint's calls with the same secret, so the app's server checks one),
    else kept across imports, and a new one's is in the summary (shown once)."""
    if not isinstance(entries, list):
        raise ConfigError(f"{where} endpoints: a list of {{name, webhook?, stream?, timeoutMs?, ...}}")
    names: list[str] = []
    done = EndpointsImported()
    for j, item in enumerate(entries):
        ewhere = f"{where} endpoints[{j}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{ewhere}: a mapping with name and webhook or stream")
        unknown = sorted(set(item) - set(ENDPOINT_KEYS))
        if unknown:
            raise ConfigError(f"{ewhere}: unknown key '{unknown[0]}' (keys: {', '.join(ENDPOINT_KEYS)})")
        name = str(entry_required(item, "name", ewhere))
        if name in names:
            raise ConfigError(f"{ewhere}: endpoint '{name}' is listed twice")
        names.append(name)
        values: dict[str, Any] = {"webhook_url": str(item.get("webhook") or ""), "stream": item.get("stream") is True}
        for key in ("timeoutMs", "maxTimeoutMs", "maxInFlightPerUser"):
            if key in item:
                values[ENDPOINT_KEYS[key]] = entry_int(item[key], f"{ewhere} {key}")
        if item.get("webhookSecret"):
            secret = item["webhookSecret"]
            if not isinstance(secret, str) or len(secret) > SECRET_MAX:
                raise ConfigError(f"{ewhere} webhookSecret: a string of at most {SECRET_MAX} characters")
            values["webhook_secret"] = secret
        endpoint = RequestEndpoint.objects.filter(app=app, name=name).first()
        created = endpoint is None
        endpoint = endpoint or RequestEndpoint(app=app, name=name)
        if "max_timeout_ms" not in values and values.get("timeout_ms", 0) > endpoint.max_timeout_ms:
            values["max_timeout_ms"] = values["timeout_ms"]
        changed = created or any(getattr(endpoint, k) != v for k, v in values.items())
        for k, v in values.items():
            setattr(endpoint, k, v)
        try:
            endpoint.full_clean(exclude=["app"])
        except ValidationError as exc:
            raise ConfigError(f"{ewhere}: {validation_text(exc)}") from None
        if changed:
            endpoint.save()
            done.created += created
            done.updated += not created
            if created and endpoint.webhook_url and "webhook_secret" not in values:
                done.secrets.append((app.app_name, name, endpoint.webhook_secret))
    RequestEndpoint.objects.filter(app=app).exclude(name__in=names).delete()
    return done


def endpoints_export(app: ClientApp, *, include_secrets: bool = False) -> list[dict[str, Any]]:
    """The app's endpoints as the file lists them (`request_endpoints` prefetched); their webhook
    secrets only with `include_secrets` (config_io.config_export's rule)."""
    endpoints = []
    for e in sorted(app.request_endpoints.all(), key=lambda e: e.name):
        spec: dict[str, Any] = {"name": e.name}
        if e.webhook_url:
            spec["webhook"] = e.webhook_url
        if e.stream:
            spec["stream"] = True
        spec.update({"timeoutMs": e.timeout_ms, "maxTimeoutMs": e.max_timeout_ms,
                     "maxInFlightPerUser": e.max_in_flight_per_user})
        if include_secrets and e.webhook_url:
            spec["webhookSecret"] = e.webhook_secret
        endpoints.append(spec)
    return endpoints
