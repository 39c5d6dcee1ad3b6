"""python manage.py analytics_bench: time the export and both jobs on a generated day (analytics.bench)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from analytics.bench import bench_run, docs_write, markdown


class Command(BaseCommand):
    help = "Generate a day of activity, then time the export and both Spark jobs (see analytics/bench.py)."

    def add_arguments(self, parser):
        parser.add_argument("--messages", type=int, default=1_000_000)
        parser.add_argument("--sessions", type=int, default=100_000)
        parser.add_argument("--lake", type=Path, default=Path(settings.VAR_DIR) / "bench-lake",
                            help="a lake of its own (emptied first)")
        parser.add_argument("--write-docs", action="store_true", help="write the results to docs/benchmarks.md")

    def handle(self, *args, messages: int, sessions: int, lake: Path, write_docs: bool, **options):
        result = bench_run(messages=messages, sessions=sessions, lake_dir=lake,
                           say=lambda line: self.stderr.write(f"· {line}"))
        text = markdown(result, "python manage.py " + shlex.join(["analytics_bench", *sys.argv[2:]]))
        self.stdout.write(text)
        if write_docs:
            docs_write(text)
