"""An app's queue credential: a Redis ACL user that may XADD to the app's own intake stream and
nothing else (`resetkeys ~sbq:<APPNAME>:in -@all +xadd +ping`, and `+select|<db>` where Switchboard's
Redis database is not 0: that database only). It cannot read any stream (its own included), write
another key, subscribe, or run any other command; AUTH and HELLO are always allowed by Redis. With
the same password, the user `sbq-<APPNAME>:requests` may XREADGROUP and XACK the app's request
stream `sbq:<APPNAME>:requests` (messaging.requests), and nothing else.

The password is generated here, shown once and kept only as its SHA-256 (Redis takes `#<hex>`).
Rotating replaces it and disconnects the user's open connections (CLIENT KILL USER), so the old
password stops working at once; revoking deletes the user (which disconnects it too).

Redis keeps ACL users in memory only (no ACL file here), so Postgres is the record:
`queue_acl_sync` applies every row's user (and removes this database's users that have no row),
at a consumer's start and reconnect and by beat, with the gate's decision (intake.stream.gate)
for +xadd.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass

import redis
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps_registry.models import ClientApp
from foundation.transport.queue_names import (
    acl_user,
    app_name_of_acl_user,
    intake_key,
    queue_client,
    queue_db,
    requests_acl_user,
    requests_key,
)
from messaging.intake.stream.gate import WRITE, consumers_alive, gate_decide, intake_cap, streams_measure
from messaging.intake.stream.models import QueueCredential

log = logging.getLogger(__name__)

PASSWORD_BYTES = 32


class CredentialExists(Exception):
    """The app already has a queue credential: rotate it instead."""


class NoCredential(Exception):
    """The app has no queue credential."""


@dataclass(frozen=True)
class Synced:
    applied: tuple[str, ...]  # apps whose ACL user was (re)written
    removed: tuple[str, ...]  # ACL users with no credential row, deleted


def password_sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_commands(*, writable: bool) -> frozenset[str]:
    commands = {"-@all", "+ping"}
    if queue_db():
        commands.add(f"+select|{queue_db()}")  # the client must SELECT Switchboard's database, and no other
    if writable:
        commands.add(WRITE)
    return frozenset(commands)


def acl_rules(app_name: str, sha256: str, *, writable: bool) -> list[str]:
    """ACL SETUSER's rules for the app's user, from nothing (`reset`): one statement, so the user
    never exists half-made."""
    return ["reset", "on", f"#{sha256}", "resetchannels", "resetkeys", f"~{intake_key(app_name)}",
            "-@all", *sorted(acl_commands(writable=writable) - {"-@all"})]  # -@all first: rules apply in order


def requests_acl_rules(app_name: str, sha256: str) -> list[str]:
    """The rules of the app's request-stream user (same password): XREADGROUP and XACK on
    sbq:<APPNAME>:requests, nothing else."""
    commands = {"+ping", "+xreadgroup", "+xack"}
    if queue_db():
        commands.add(f"+select|{queue_db()}")
    return ["reset", "on", f"#{sha256}", "resetchannels", "resetkeys", f"~{requests_key(app_name)}", "-@all",
            *sorted(commands)]


def credential_app_names() -> list[str]:
    return list(QueueCredential.objects.order_by("app__app_name").values_list("app__app_name", flat=True))


def _apply_after_commit(app_name: str, *, disconnect: bool) -> None:
    def apply() -> None:
        try:
            queue_acl_sync(app_names=[app_name])
            client = queue_client()
            if disconnect:
                for user in (acl_user(app_name), requests_acl_user(app_name)):
                    client.execute_command("CLIENT", "KILL", "USER", user)
        except redis.RedisError:
            log.warning("queue credential of %s not applied to Redis now; beat's sync applies it", app_name,
                        exc_info=True)
    transaction.on_commit(apply)


def queue_credential_create(*, app: ClientApp) -> tuple[QueueCredential, str]:
    """A new credential for `app` (CredentialExists if it has one): the row, and the password,
    which is never kept or shown again. Its ACL user is applied once the row commits."""
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    try:
        with transaction.atomic():
            credential = QueueCredential.objects.create(app=app, password_sha256=password_sha256(password))
    except IntegrityError:
        raise CredentialExists(f"app {app.app_name} has a queue credential already; rotate it") from None
    _apply_after_commit(app.app_name, disconnect=False)
    return credential, password


def queue_credential_rotate(*, app: ClientApp) -> tuple[QueueCredential, str]:
    """A new password for the app's credential (NoCredential if none): the old one fails from the
    moment it is applied, and connections made with it are closed."""
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    with transaction.atomic():
        # Locked so a concurrent sync either applies the old hash before this commits, or reads the new one.
        credential = QueueCredential.objects.select_for_update().filter(app=app).first()
        if credential is None:
            raise NoCredential(f"app {app.app_name} has no queue credential")
        credential.password_sha256 = password_sha256(password)
        credential.rotated_at = timezone.now()
        credential.save(update_fields=["password_sha256", "rotated_at"])
    _apply_after_commit(app.app_name, disconnect=True)
    return credential, password


def queue_credential_revoke(*, app: ClientApp) -> None:
    """Delete the app's credential (NoCredential if none) and its ACL user, which closes the
    user's connections. Entries already in the stream are still consumed."""
    deleted, _ = QueueCredential.objects.filter(app=app).delete()
    if not deleted:
        raise NoCredential(f"app {app.app_name} has no queue credential")
    name = acl_user(app.app_name)

    def remove() -> None:
        try:
            queue_client().execute_command("ACL", "DELUSER", name, requests_acl_user(app.app_name))
        except redis.RedisError:
            log.warning("ACL user %s not deleted now; beat's sync removes it", name, exc_info=True)
    transaction.on_commit(remove)


def queue_acl_sync(*, app_names: list[str] | None = None) -> Synced:
    """Make Redis's ACL users those of the credential rows (all, or `app_names`'): a missing or
    different user is written whole (password, key, commands; +xadd as the gate decides); with
    all rows, this database's users that have no row are deleted. Idempotent."""
    client = queue_client()
    with transaction.atomic():
        # The rows stay locked while their users are written: a rotation commits before or after, never between.
        rows = QueueCredential.objects.select_for_update(of=("self",)).select_related("app").order_by("pk")
        if app_names is not None:
            rows = rows.filter(app__app_name__in=app_names)
        hashes = {row.app.app_name: row.password_sha256 for row in rows}
        names = sorted(hashes)
        cap = intake_cap(alive=consumers_alive(client))
        applied = []
        pipe = client.pipeline(transaction=False)
        for m in streams_measure(client, names):
            writable = gate_decide(was_writable=m.acl is not None and m.acl.writable, used=m.used, cap=cap)
            wanted_keys = (intake_key(m.app_name),)
            if (m.acl is None or not m.acl.enabled or m.acl.passwords != (hashes[m.app_name],)
                    or m.acl.keys != wanted_keys or m.acl.commands != acl_commands(writable=m.acl.writable)):
                pipe.execute_command("ACL", "SETUSER", acl_user(m.app_name),
                                     *acl_rules(m.app_name, hashes[m.app_name], writable=writable))
                applied.append(m.app_name)
            # (written whole every time: one command, and no gate moves it)
            pipe.execute_command("ACL", "SETUSER", requests_acl_user(m.app_name),
                                 *requests_acl_rules(m.app_name, hashes[m.app_name]))
        if len(pipe):
            pipe.execute()
    removed = []
    if app_names is None:
        for user in client.execute_command("ACL", "USERS"):
            user = user.decode() if isinstance(user, bytes) else user
            app_name = app_name_of_acl_user(user)
            if app_name is not None and app_name not in hashes:
                client.execute_command("ACL", "DELUSER", user)
                removed.append(user)
    if applied or removed:
        log.info("queue ACL users applied: %s; removed: %s", ", ".join(applied) or "none", ", ".join(removed) or "none")
    return Synced(tuple(applied), tuple(removed))
