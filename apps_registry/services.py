"""Write-side operations of the configuration registry."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from datetime import timedelta
from typing import TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from .models import ApiKey, AuthMode, ClientApp, Domain, HashedKey, OperatorKey, UserDistribution, UserRange
from .pusher_credentials import PusherCredentials, new_pusher_secret
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


def api_key_create(*, app: ClientApp, name: str, expires_at=None) -> tuple[ApiKey, str]:
    """Create a key (working until `expires_at`, if given); returns the row and the only copy of the
    raw key there will ever be."""
    prefix = "sb_" + secrets.token_hex(API_KEY_PREFIX_LEN // 2 + 1)[: API_KEY_PREFIX_LEN - 3]
    raw_key = f"{prefix}.{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(app=app, name=name, prefix=prefix, key_hash=_digest(raw_key), expires_at=expires_at)
    return key, raw_key


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The active key matching `raw_key`, or None. Records when it was last used."""
    prefix, _, _ = (raw_key or "").partition(".")
    if not prefix:
        return None
    return _key_match(ApiKey.objects.select_related("app"), prefix, raw_key)


def _key_match(keys: QuerySet[K], prefix: str, raw_key: str) -> K | None:
    """The active (not revoked, not expired) key of `keys` with `prefix` whose digest matches
    `raw_key` (constant-time), its
    use recorded at most once per API_KEY_TOUCH_EVERY; None otherwise."""
    now = timezone.now()
    key = (keys.filter(prefix=prefix, revoked_at__isnull=True)
           .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now)).first())
    if key is None or not hmac.compare_digest(key.key_hash, _digest(raw_key)):
        return None
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


def distribution_standby_validate(*, domain: Domain | None, standby: Domain | None) -> None:
    """A standby is another domain than the home: the copy must survive the home's loss."""
    if standby is not None and domain is not None and standby.pk == domain.pk:
        raise ValidationError({"standby": f"The standby must be another domain than the home ({domain.name}): "
                                          "the copy is there to survive the home's loss."})


def distribution_create(*, app: ClientApp, domain: Domain, range_from: int, range_to: int | None,
                        standby: Domain | None = None) -> UserDistribution:
    with transaction.atomic():
        ClientApp.objects.select_for_update().filter(pk=app.pk).first()  # serialise per app
        distribution_validate(app=app, range_from=range_from, range_to=range_to)
        distribution_standby_validate(domain=domain, standby=standby)
        return UserDistribution.objects.create(app=app, domain=domain, range_from=range_from, range_to=range_to,
                                               standby=standby)


def coverage_gap(*, before: Iterable[UserRange], after: Iterable[UserRange]) -> UserRange | None:
    """The first users (lowest numbers first) `before` gives a home and `after` does not; None when
    `after` covers everything `before` did."""
    after = sorted(after, key=lambda r: r.low)
    for wanted in sorted(before, key=lambda r: r.low):
        cursor = wanted.low
        for have in after:
            if have.high is not None and have.high < cursor:
                continue
            if have.low > cursor:
                break  # the users from cursor up to have.low - 1 have no home
            if have.high is None:
                cursor = None
                break
            cursor = have.high + 1
            if wanted.high is not None and cursor > wanted.high:
                break
        if cursor is None or (wanted.high is not None and cursor > wanted.high):
            continue
        nxt = next((have.low for have in after if have.low > cursor), None)
        ends = [x for x in (wanted.high, None if nxt is None else nxt - 1) if x is not None]
        return UserRange(cursor, min(ends) if ends else None)
    return None


def homeless_message(app_name: str, gap: UserRange) -> str:
    users = f"{gap.low} and up" if gap.high is None else f"{gap.low}-{gap.high}"
    return f"{app_name} users {users} would have no home domain"


def distribution_coverage_check(*, app: ClientApp, after: Iterable[UserRange]) -> None:
    """Refuse (ValidationError naming the app and the first range) a change after which a user of
    `app` who has a home domain now would have none. An app's first distributions are free: nothing
    was covered before them. Moving users to another domain is no loss of coverage."""
    before = [d.user_range for d in app.distributions.all()]
    gap = coverage_gap(before=before, after=after)
    if gap is not None:
        raise ValidationError(homeless_message(app.app_name, gap) + "; move them to another domain instead "
                              "(change the distribution's domain), or widen a neighbouring distribution in the "
                              "same save on the app's page.")


def distributions_delete_refusal(*, distribution_ids: Iterable[int]) -> str | None:
    """Why deleting these distributions must be refused (a user would be left without a home
    domain), or None."""
    ids = set(distribution_ids)
    app_ids = set(UserDistribution.objects.filter(pk__in=ids).values_list("app_id", flat=True))
    for app in ClientApp.objects.filter(pk__in=app_ids).order_by("app_name"):
        try:
            distribution_coverage_check(app=app, after=[d.user_range for d in app.distributions.exclude(pk__in=ids)])
        except ValidationError as exc:
            return exc.messages[0]
    return None


def distributions_delete(*, distribution_ids: Iterable[int]) -> int:
    """Delete distributions (the admin's delete and bulk delete), refused with a ValidationError when
    a user would be left without a home domain; the apps' rows are locked, as for creation, so two
    operators deleting the two halves of a coverage at once cannot both win."""
    ids = set(distribution_ids)
    with transaction.atomic():
        app_ids = set(UserDistribution.objects.filter(pk__in=ids).values_list("app_id", flat=True))
        list(ClientApp.objects.select_for_update().filter(pk__in=app_ids).order_by("pk"))
        refusal = distributions_delete_refusal(distribution_ids=ids)
        if refusal is not None:
            raise ValidationError(refusal)
        deleted, _ = UserDistribution.objects.filter(pk__in=ids).delete()
    return deleted


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


def pusher_secret_rotate(*, credentials: PusherCredentials) -> str:
    """Give the app's Pusher credentials a new secret; returns it (the console shows it once). The
    old one stops working at once: the app's server and its channel authorizations sign with the new
    one from then on (web nodes see it within the snapshot's few seconds)."""
    credentials.secret = new_pusher_secret()
    credentials.secret_rotated_at = timezone.now()
    credentials.save(update_fields=["secret", "secret_rotated_at"])
    return credentials.secret
