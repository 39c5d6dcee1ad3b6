"""System checks (ids switchboard.*) that catch a misconfigured node before it serves."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.checks import Warning as CheckWarning

from foundation.names import domain_name_valid


@register(Tags.security, deploy=False)
def check_secrets(app_configs, **kwargs):
    errors = []
    if getattr(settings, "PRODUCTION", False):
        if settings.SECRET_KEY == settings.DEFAULT_SECRET_KEY or len(settings.SECRET_KEY) < 40:
            errors.append(Error(
                "Production runs with the default or a short SECRET_KEY.",
                hint="Set SECRET_KEY (or SECRET_KEY_FILE) to 50+ random characters.",
                id="switchboard.E001",
            ))
        if settings.DEBUG:
            errors.append(Error("DEBUG is on in production.", hint="Unset DEBUG.", id="switchboard.E002"))
        if "*" in settings.ALLOWED_HOSTS:
            errors.append(CheckWarning(
                "ALLOWED_HOSTS accepts any host in production.",
                hint="List the public host names in ALLOWED_HOSTS.",
                id="switchboard.W001",
            ))
        if settings.WEBHOOKS_ALLOW_HTTP:
            errors.append(CheckWarning(
                "WEBHOOKS_ALLOW_HTTP is on in production: webhook payloads and signatures may travel unencrypted.",
                hint="Unset WEBHOOKS_ALLOW_HTTP; register https:// endpoints.",
                id="switchboard.W002",
            ))
    unreadable = [n for n in settings.OUTGOING_ALLOWED_NETWORKS if _network(n) is None]
    if unreadable:
        errors.append(Error(
            f"OUTGOING_ALLOWED_NETWORKS holds what is not a network: {', '.join(unreadable)}.",
            hint="Give addresses or CIDR networks, comma-separated (e.g. 10.1.2.0/24).",
            id="switchboard.E009",
        ))
    if getattr(settings, "PRODUCTION", False):
        broad = [n for n in settings.OUTGOING_ALLOWED_NETWORKS if _too_wide(n)]
        if broad:
            errors.append(CheckWarning(
                f"OUTGOING_ALLOWED_NETWORKS lets tenants' webhooks and auth URLs reach wide networks: {', '.join(broad)}.",
                hint="List only the networks of the receivers that need it (e.g. 10.1.2.0/24); see docs/security.md.",
                id="switchboard.W003",
            ))
    return errors


# An allowed network wider than this (a /16 of IPv4, a /48 of IPv6) opens most of a private address
# plan to calls whose destination a tenant chose.
OUTGOING_NETWORK_WARN_PREFIX = {4: 16, 6: 48}


def _network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None


def _too_wide(value: str) -> bool:
    net = _network(value)
    return net is not None and net.prefixlen < OUTGOING_NETWORK_WARN_PREFIX[net.version]


@register(Tags.database, deploy=False)
def check_services(app_configs, **kwargs):
    errors = []
    if getattr(settings, "PRODUCTION", False):
        if not settings.PRODUCTION_DATABASE_URL_SET:
            errors.append(Error(
                "DATABASE_URL is not set; production never starts an embedded Postgres.",
                hint="DATABASE_URL=postgresql://user:password@host:5432/switchboard",
                id="switchboard.E003",
            ))
        if not settings.PRODUCTION_REDIS_URL_SET:
            errors.append(Error(
                "REDIS_URL is not set; production never starts an embedded Redis.",
                hint="REDIS_URL=redis://host:6379/0",
                id="switchboard.E004",
            ))
    layer = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    # channels_redis's layers, or foundation's slimmer subclass of its pub/sub layer.
    if not layer.startswith(("channels_redis.", "foundation.patches.channels_redis.")):
        errors.append(Error(
            f"The channel layer is {layer!r}; web nodes can only reach each other's sockets through Redis.",
            hint="Use channels_redis (the default settings do).",
            id="switchboard.E005",
        ))
    return errors


@register(deploy=False)
def check_node_identity(app_configs, **kwargs):
    errors = []
    if not domain_name_valid(settings.DOMAIN_NAME):
        errors.append(Error(
            f"DOMAIN_NAME={settings.DOMAIN_NAME!r} is not a valid domain name.",
            hint="Letters, digits, '-', '_' and '.', at most 64 characters (e.g. domain-01).",
            id="switchboard.E006",
        ))
    if not settings.NODE_ID:
        errors.append(Error("NODE_ID is empty.", id="switchboard.E007"))
    if not 1 <= settings.PORT <= 65535:
        errors.append(Error(f"PORT={settings.PORT} is out of range.", id="switchboard.E008"))
    if settings.PRESENCE_SNAPSHOT_PAGE < 1:
        errors.append(Error(f"PRESENCE_SNAPSHOT_PAGE={settings.PRESENCE_SNAPSHOT_PAGE} lists no users per frame.",
                            hint="1 or more (default 1000).", id="switchboard.E010"))
    return errors


@register(deploy=False)
def check_network_door(app_configs, **kwargs):
    """The bounds of the door between domains (foundation.body_cap, messaging.federation): each must let
    a genuine call through."""
    errors = []
    if settings.NETWORK_LARGE_BODIES_PER_LINK < 1:
        errors.append(Error(
            f"NETWORK_LARGE_BODIES_PER_LINK={settings.NETWORK_LARGE_BODIES_PER_LINK}: no neighbour's call over "
            f"NETWORK_LARGE_BODY_BYTES ({settings.NETWORK_LARGE_BODY_BYTES}) would ever be read.",
            hint="1 or more (default 2).", id="switchboard.E030"))
    if settings.HTTP_BODY_TIMEOUT_SECONDS < 0:
        errors.append(Error(f"HTTP_BODY_TIMEOUT_SECONDS={settings.HTTP_BODY_TIMEOUT_SECONDS} is negative.",
                            hint="Seconds a request body may take (default 30); 0 for no limit.",
                            id="switchboard.E031"))
    if settings.TAKEOVER_EPOCH_MAX_AHEAD_SECONDS < 1:
        errors.append(Error(
            f"TAKEOVER_EPOCH_MAX_AHEAD_SECONDS={settings.TAKEOVER_EPOCH_MAX_AHEAD_SECONDS:g}: a takeover told by a "
            "domain whose clock is a moment ahead would be refused.",
            hint="At least the clocks' skew between domains (default 300).", id="switchboard.E032"))
    return errors
