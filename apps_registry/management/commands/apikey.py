from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps_registry.models import ApiKey, ClientApp
from apps_registry.services import api_key_create, api_key_revoke


class Command(BaseCommand):
    help = "Manage API keys: create APPNAME [--name N] | list [APPNAME] | revoke PREFIX"

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key; the key is the last line printed")
        create.add_argument("app_name")
        create.add_argument("--name", default="cli")
        listing = sub.add_parser("list")
        listing.add_argument("app_name", nargs="?")
        revoke = sub.add_parser("revoke")
        revoke.add_argument("prefix")

    def handle(self, *args, action: str, **options):
        if action == "create":
            app = ClientApp.objects.filter(app_name=options["app_name"]).first()
            if app is None:
                raise CommandError(f"no client app named {options['app_name']!r}")
            key, raw = api_key_create(app=app, name=options["name"])
            self.stderr.write(f"API key {key.prefix} for {app.app_name} created; it is shown once, store it now:")
            self.stdout.write(raw)
        elif action == "list":
            keys = ApiKey.objects.select_related("app").order_by("app__app_name", "-created_at")
            if options["app_name"]:
                keys = keys.filter(app__app_name=options["app_name"])
            for key in keys:
                self.stdout.write(f"{key.prefix}  {key.app.app_name:12} {key.name:20} {key.usage}")
        else:
            key = ApiKey.objects.filter(prefix=options["prefix"]).first()
            if key is None:
                raise CommandError(f"no API key with prefix {options['prefix']!r}")
            api_key_revoke(api_key=key)
            self.stdout.write(f"revoked {key.prefix}")
