from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps_registry.config_io import ConfigError, config_import
from apps_registry.models import OPEN_APP_MEANING, PUSH_OPEN_MEANING, AuthMode


class Command(BaseCommand):
    help = "Import domains, links, client apps and distributions from a linker meta-server YAML file."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument(
            "--auth-mode", choices=AuthMode.values, default=None,
            help="Auth mode of apps whose entry names none (no authMode, tokenSecret or authEnabled: true). "
                 "Without it, an entry saying authEnabled: false is open (auth mode none, as in the linker) and "
                 "one saying nothing gets signed tokens; 'none' opens them to anyone who knows their appId.",
        )

    def handle(self, *args, file: Path, auth_mode: str | None, **options):
        if not file.exists():
            raise CommandError(f"{file}: no such file")
        try:
            summary = config_import(text=file.read_text(), default_auth_mode=auth_mode)
        except ConfigError as exc:
            raise CommandError(f"{file}: {exc} (nothing was imported)") from None
        self.stdout.write(self.style.SUCCESS(f"imported {file}: {summary}"))
        for app_name, endpoint, secret in summary.endpoint_secrets:
            self.stdout.write(f"request endpoint {app_name} {endpoint}: webhook secret {secret} (shown once; "
                              "it signs the request.received calls)")
        if summary.open_apps:
            self.stdout.write(self.style.WARNING(
                f"open apps (auth mode none: {OPEN_APP_MEANING}): {', '.join(summary.open_apps)}. "
                "Give them signed tokens or an auth URL in the admin, or import with --auth-mode signed_token."))
        if summary.push_open_app:
            self.stdout.write(self.style.WARNING(
                f"{summary.push_open_app} has push open mode: {PUSH_OPEN_MEANING}. For development and demos only "
                "(a production node never serves it, and `check --deploy` refuses it there)."))
