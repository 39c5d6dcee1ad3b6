"""`manage.py queuecredential create|rotate|revoke APPNAME | list`: an app's queue intake credential
(messaging.intake.stream.credentials). The password is printed once, as the last line."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps_registry.models import ClientApp
from foundation.transport.queue_names import acl_user, intake_key
from messaging.intake.stream.credentials import (
    CredentialExists,
    NoCredential,
    queue_credential_create,
    queue_credential_revoke,
    queue_credential_rotate,
)
from messaging.intake.stream.models import QueueCredential


class Command(BaseCommand):
    help = "Manage queue intake credentials (Redis ACL users): create APPNAME | rotate APPNAME | revoke APPNAME | list"

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        for action, text in (("create", "make the app's credential; the password is the last line printed"),
                             ("rotate", "a new password (the last line printed); the old one stops working"),
                             ("revoke", "delete the credential and its Redis user")):
            sub.add_parser(action, help=text).add_argument("app_name")
        sub.add_parser("list")

    def handle(self, *args, action: str, **options):
        if action == "list":
            for credential in QueueCredential.objects.select_related("app").order_by("app__app_name"):
                rotated = f"rotated {credential.rotated_at:%Y-%m-%d %H:%M}" if credential.rotated_at else ""
                self.stdout.write(f"{credential.app.app_name:12} {acl_user(credential.app.app_name):20} "
                                  f"{intake_key(credential.app.app_name):24} {rotated}")
            return
        app = ClientApp.objects.filter(app_name=options["app_name"]).first()
        if app is None:
            raise CommandError(f"no client app named {options['app_name']!r}")
        try:
            if action == "revoke":
                queue_credential_revoke(app=app)
                self.stdout.write(f"revoked the queue credential of {app.app_name} (Redis user {acl_user(app.app_name)})")
                return
            _, password = (queue_credential_create if action == "create" else queue_credential_rotate)(app=app)
        except (CredentialExists, NoCredential) as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"Redis user {acl_user(app.app_name)} may XADD to {intake_key(app.app_name)} only; "
                          "its password is shown once, store it now:")
        self.stdout.write(password)
