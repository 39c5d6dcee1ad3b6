"""python manage.py analytics_bench: time the export and both jobs on a generated day (analytics.bench),
on a database and a lake of the benchmark's own, dropped after the run."""

from __future__ import annotations

import shlex
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from analytics.bench import BenchFailed, bench_elsewhere, bench_run, docs_write, markdown
from analytics.bench_sandbox import SandboxRefused

DEFAULTS = {"messages": 1_000_000, "sessions": 100_000}


class Command(BaseCommand):
    help = ("Generate a day of activity, then time the export and both Spark jobs (see analytics/bench.py), on a "
            "database and a lake of the benchmark's own: the platform's data and export state are never touched.")

    def add_arguments(self, parser):
        parser.add_argument("--messages", type=int, default=DEFAULTS["messages"])
        parser.add_argument("--sessions", type=int, default=DEFAULTS["sessions"])
        parser.add_argument("--lake", type=Path,
                            help="the benchmark's lake folder: new, empty, or an earlier benchmark's (default: a "
                                 "temporary folder); never the platform's lake; removed after the run")
        parser.add_argument("--database",
                            help="the benchmark's database on the platform's Postgres server: new, empty, or an "
                                 "earlier benchmark's (default: a new switchboard_bench_<random>); dropped after")
        parser.add_argument("--no-jobs", action="store_true", help="generate and export only, no Spark job")
        parser.add_argument("--write-docs", action="store_true", help="write the results to docs/benchmarks.md")
        parser.add_argument("--here", action="store_true",
                            help="run in this process on the configured database and lake, which must be a "
                                 "benchmark's own (what the command starts in its child process)")
        parser.add_argument("--shown-command", default="", help="the command line the results name (with --here)")

    def handle(self, *args, messages: int, sessions: int, lake: Path | None, database: str | None, no_jobs: bool,
               write_docs: bool, here: bool, shown_command: str, **options):
        say = self._say
        try:
            if here:
                result = bench_run(messages=messages, sessions=sessions, lake_dir=Path(settings.ANALYTICS_LAKE),
                                   jobs=not no_jobs, say=say)
                self.stdout.write(markdown(result, shown_command), ending="")
                return
            shown = _shown(messages=messages, sessions=sessions, no_jobs=no_jobs, write_docs=write_docs)
            argv = ["--messages", str(messages), "--sessions", str(sessions), "--shown-command", shown,
                    *(["--no-jobs"] if no_jobs else [])]
            text = bench_elsewhere(argv=argv, lake=lake, database=database, say=say)
        except (SandboxRefused, BenchFailed) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(text, ending="")
        if write_docs:
            docs_write(text)

    def _say(self, line: str) -> None:
        self.stderr.write(f"· {line}")


def _shown(*, messages: int, sessions: int, no_jobs: bool, write_docs: bool) -> str:
    """The command line the results name: the options that change them, and --write-docs."""
    argv = ["analytics_bench"]
    for name, value in (("messages", messages), ("sessions", sessions)):
        if value != DEFAULTS[name]:
            argv += [f"--{name}", str(value)]
    argv += ["--no-jobs"] * no_jobs + ["--write-docs"] * write_docs
    return "python manage.py " + shlex.join(argv)
