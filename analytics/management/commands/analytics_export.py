"""python manage.py analytics_export [--reset]: export what changed since the last run to the lake."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from analytics.services import ExportBusy, lake_export, lake_reset
from foundation.patches.django import command_stream


class Command(BaseCommand):
    help = "Export the rows changed since the last export to Parquet under ANALYTICS_LAKE."

    def add_arguments(self, parser):
        parser.add_argument("--reset", action="store_true",
                            help="forget the watermarks and delete the exported datasets first (a full re-export)")

    def handle(self, *args, reset: bool, **options):
        bars: dict[str, tqdm] = {}

        def progress(dataset: str, rows: int, estimate: int | None) -> None:
            if dataset not in bars:
                bars[dataset] = tqdm(desc=f"{dataset:>16}", total=estimate, unit=" rows",
                                     file=command_stream(self.stderr), disable=options["verbosity"] == 0)
            bars[dataset].update(rows)

        try:
            if reset:
                lake_reset()
                self.stdout.write("Watermarks forgotten and exported datasets deleted.")
            result = lake_export(requested_by="manage.py analytics_export", progress=progress)
        except ExportBusy as exc:
            raise CommandError(f"{exc}; try again when it has finished") from None
        finally:
            for bar in bars.values():
                bar.close()
        rows = ", ".join(f"{name} {count}" for name, count in result.rows.items())
        self.stdout.write(f"Export run {result.run_id}: {rows} ({result.files} files).")
