"""`manage.py operator_key create NAME | list | revoke PREFIX`: the operator API's credentials
(apps_registry.models.OperatorKey). The key is printed once, on stdout, and never stored."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps_registry.models import OperatorKey
from apps_registry.services import operator_key_create, operator_key_revoke


class Command(BaseCommand):
    help = "Manage operator keys: create NAME | list | revoke PREFIX"

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key; the key is the last line printed")
        create.add_argument("name")
        sub.add_parser("list")
        revoke = sub.add_parser("revoke")
        revoke.add_argument("prefix")

    def handle(self, *args, action: str, **options):
        if action == "create":
            key, raw = operator_key_create(name=options["name"])
            self.stderr.write(f"operator key {key.prefix} ({key.name}) created. It reaches every app; it is shown "
                              "once, store it now (e.g. export SWITCHBOARD_OPERATOR_KEY=…):")
            self.stdout.write(raw)
        elif action == "list":
            for key in OperatorKey.objects.order_by("-created_at"):
                self.stdout.write(f"{key.prefix}  {key.name:20} {key.usage}")
        else:
            key = OperatorKey.objects.filter(prefix=options["prefix"]).first()
            if key is None:
                raise CommandError(f"no operator key with prefix {options['prefix']!r}")
            operator_key_revoke(operator_key=key)
            self.stdout.write(f"revoked {key.prefix}")
