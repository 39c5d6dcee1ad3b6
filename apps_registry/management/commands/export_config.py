from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand

from apps_registry.config_io import config_export


class Command(BaseCommand):
    help = ("Export the configuration as linker meta-server YAML (to stdout, or --output FILE). "
            "App token secrets are left out unless --include-secrets is given.")

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", type=Path, default=None)
        parser.add_argument("--include-secrets", action="store_true",
                            help="also export each app's tokenSecret (keep such a file private)")

    def handle(self, *args, output: Path | None, include_secrets: bool, **options):
        text = config_export(include_secrets=include_secrets)
        if output is None:
            self.stdout.write(text, ending="")
        else:
            output.write_text(text)
            self.stdout.write(self.style.SUCCESS(f"wrote {output}"))
