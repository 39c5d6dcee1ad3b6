from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand

from apps_registry.config_io import config_export


class Command(BaseCommand):
    help = "Export the configuration as linker meta-server YAML (to stdout, or --output FILE)."

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", type=Path, default=None)

    def handle(self, *args, output: Path | None, **options):
        text = config_export()
        if output is None:
            self.stdout.write(text, ending="")
        else:
            output.write_text(text)
            self.stdout.write(self.style.SUCCESS(f"wrote {output}"))
