"""Write-side operations of the configuration registry."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .models import ApiKey, AuthMode, ClientApp, Domain, HashedKey, OperatorKey, UserDistribution
from .selectors import distribution_overlaps

API_KEY_PREFIX_LEN = 10
# last_used_at is written at most this often per key: a busy key must not turn every API call
# into an UPDATE.
API_KEY_TOUCH_EVERY = timedelta(seconds=60)
K = TypeVar("K", bound=HashedKey)


def _digest(raw_key: str) -> str:
    # API keys carry 256 bits of randomness, so a fast hash is safe (no dictionary to guess from)
    # and keeps per-request authentication cheap.
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(*, app: ClientApp, name: str) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the only copy of the raw key there will ever be."""
    prefix = "sb_" + secrets.token_hex(API_KEY_PREFIX_LEN // 2 + 1)[: API_KEY_PREFIX_LEN - 3]
    raw_key = f"{prefix}.{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(app=app, name=name, prefix=prefix, key_hash=_digest(raw_key))
    return key, raw_key


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The active key matching `raw_key`, or None. Records when it was last used."""
    prefix, _, _ = (raw_key or "").partition(".")
    if not prefix:
        return None
    return _key_match(ApiKey.objects.select_related("app"), prefix, raw_key)


def _key_match(keys: QuerySet[K], prefix: str, raw_key: str) -> K | None:
    """The active key of `keys` with `prefix` whose digest matches `raw_key` (constant-time), its
    use recorded at most once per API_KEY_TOUCH_EVERY; None otherwise."""
    key = keys.filter(prefix=prefix, revoked_at__isnull=True).first()
    if key is None or not hmac.compare_digest(key.key_hash, _digest(raw_key)):
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > API_KEY_TOUCH_EVERY:
        type(key).objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def _key_revoke(key: K) -> K:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    return _key_revoke(api_key)


OPERATOR_KEY_PREFIX = "sbop_"


def operator_key_create(*, name: str) -> tuple[OperatorKey, str]:
    """Create an operator key; returns the row and the only copy of the raw key there will ever be."""
    prefix = OPERATOR_KEY_PREFIX + secrets.token_hex(6)[:11]  # 16 characters, the column's width
    raw_key = f"{prefix}.{secrets.token_urlsafe(32)}"
    key = OperatorKey.objects.create(name=name, prefix=prefix, key_hash=_digest(raw_key))
    return key, raw_key


def operator_key_authenticate(*, raw_key: str) -> OperatorKey | None:
    """The active operator key matching `raw_key`, or None (an app's API key never matches: its
    prefix is not in this table). Records when it was last used."""
    prefix, _, _ = (raw_key or "").partition(".")
    if not prefix.startswith(OPERATOR_KEY_PREFIX):
        return None
    return _key_match(OperatorKey.objects.all(), prefix, raw_key)


def operator_key_revoke(*, operator_key: OperatorKey) -> OperatorKey:
    return _key_revoke(operator_key)


def distribution_validate(
    *, app: ClientApp, range_from: int, range_to: int | None, exclude_id: int | None = None
) -> None:
    """Raise ValidationError naming the clash when the range is invalid or overlaps another."""
    if range_from < 0:
        raise ValidationError({"range_from": "'from' must be 0 or more."})
    if range_to is not None and range_to < range_from:
        raise ValidationError({"range_to": f"'to' ({range_to}) must not be below 'from' ({range_from})."})
    clash = distribution_overlaps(app=app, range_from=range_from, range_to=range_to, exclude_id=exclude_id)
    if clash is not None:
        upper = "no upper end" if clash.range_to is None else clash.range_to
        raise ValidationError(
            f"Users {app.app_name}-{range_from}…{'' if range_to is None else range_to} overlap the distribution "
            f"{clash.range_from}…{upper} on {clash.domain.name}; a user can live in one domain only."
        )


def distribution_create(*, app: ClientApp, domain: Domain, range_from: int, range_to: int | None) -> UserDistribution:
    with transaction.atomic():
        ClientApp.objects.select_for_update().filter(pk=app.pk).first()  # serialise per app
        distribution_validate(app=app, range_from=range_from, range_to=range_to)
        return UserDistribution.objects.create(app=app, domain=domain, range_from=range_from, range_to=range_to)


# Open by choice (auth mode none, as in the linker seed): the README's examples log in with any token.
DEMO_APP = {"app_name": "ANZ", "app_id": "app-id-343", "master_user_id": "ANZ-123223", "auth_mode": AuthMode.NONE}


def domain_ensure(*, domain_name: str, ws_url: str) -> Domain:
    """This node's domain, listed with `ws_url` when it is new (an existing one is left as it is)."""
    return Domain.objects.get_or_create(name=domain_name, defaults={"urls": [ws_url]})[0]


def demo_config_ensure(*, domain_name: str, ws_url: str) -> ClientApp | None:
    """The demo tenant of the README: app ANZ / app-id-343 / master ANZ-123223, homed here. Anyone
    may log in as any of its users, so it is made only where settings.DEMO_ENABLED (off in
    production); elsewhere nothing is made and None is returned."""
    if not settings.DEMO_ENABLED:
        return None
    with transaction.atomic():
        domain = domain_ensure(domain_name=domain_name, ws_url=ws_url)
        app, _ = ClientApp.objects.get_or_create(app_name=DEMO_APP["app_name"], defaults=DEMO_APP)
        if not app.distributions.exists():
            distribution_create(app=app, domain=domain, range_from=0, range_to=None)
    return app


def admin_user_ensure(*, username: str, password: str | None) -> str | None:
    """Create the first staff superuser; returns the generated password when one was made up."""
    user_model = get_user_model()
    if user_model.objects.filter(username=username).exists():
        return None
    generated = None
    if not password:
        password = generated = secrets.token_urlsafe(12)
    user_model.objects.create_superuser(username=username, email="", password=password)
    return generated
