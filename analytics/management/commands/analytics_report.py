"""python manage.py analytics_report presence|backlog [--since DATE] [--until DATE] [--load OUT]"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings
from tqdm import tqdm

from analytics.jobs.common import parse_time
from analytics.models import REPORT_KINDS
from analytics.selectors import report_default_range
from analytics.services import ReportBusy, report_load, report_run
from foundation.patches.django import command_stream


class Command(BaseCommand):
    help = ("Run the presence or backlog report over [--since, --until) (default: yesterday, UTC) on "
            "SPARK_MASTER, or --load the result rows a spark-submit run wrote.")

    def add_arguments(self, parser):
        parser.add_argument("kind", choices=[k.value for k in REPORT_KINDS])
        parser.add_argument("--since", type=parse_time, help="UTC date or datetime (inclusive)")
        parser.add_argument("--until", type=parse_time, help="UTC date or datetime (exclusive)")
        parser.add_argument("--master", help=f"a Spark master for this run (default SPARK_MASTER, now "
                                             f"{settings.SPARK_MASTER})")
        parser.add_argument("--load", metavar="OUT", help="store the result rows that `spark-submit "
                                                          "analytics/jobs/<kind>.py ... --out OUT` wrote")

    def handle(self, *args, kind: str, since, until, master: str | None, load: str | None, **options):
        default_since, default_until = report_default_range()
        since, until = since or default_since, until or default_until
        if since >= until:
            raise CommandError("--since must be before --until")
        if load:
            report = report_load(kind=kind, since=since, until=until, results=load)
        else:
            bar = tqdm(desc=f"{kind} report", unit=" tasks", file=command_stream(self.stderr),
                       disable=options["verbosity"] == 0)

            def progress(done: int, known: int) -> None:
                bar.total = known
                bar.n = done
                bar.refresh()

            try:
                with override_settings(SPARK_MASTER=master or settings.SPARK_MASTER):
                    report = report_run(kind=kind, since=since, until=until, progress=progress,
                                        requested_by="manage.py analytics_report")
            except ReportBusy as exc:
                raise CommandError(f"{exc}; try again when it has finished") from None
            finally:
                bar.close()
        self.stdout.write(f"{report}: {report.rows.count()} figures stored (report #{report.pk}); "
                          f"see /admin/analytics/report/{report.pk}/change/")
