"""Running a report job and storing its result rows.

Both ways of running a job end the same way: the job writes its (small, aggregated) result rows
as Parquet under the lake, and report_load reads them into the report tables. In-process
(report_run) that is one call; with spark-submit on a cluster, the job writes to --out and
`manage.py analytics_report <kind> --load <out>` loads it, so no result ever has to travel back
through the driver of a remote cluster.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from analytics.jobs import datasets as ds
from analytics.models import REPORT_KINDS, JobKind, JobRun, Report, ReportRow
from foundation.locks import one_at_a_time

from .jobs import job_finish, job_start
from .lake import Lake
from .locks import REPORT_LOCK


class ReportBusy(Exception):
    """A report of that kind is being computed (by another worker, or this task delivered twice)."""


JOB_MODULES = {JobKind.PRESENCE: "analytics.jobs.presence", JobKind.BACKLOG: "analytics.jobs.backlog"}


def report_run(*, kind: JobKind, since: datetime, until: datetime, job_run_id: int | None = None,
               requested_by: str = "", progress: Callable[[int, int], None] | None = None) -> Report | None:
    """Run the `kind` job over [since, until) on SPARK_MASTER and store its result. None when the
    JobRun `job_run_id` had already succeeded (a task delivered twice runs once)."""
    if kind not in REPORT_KINDS:
        raise ValueError(f"{kind!r} is not a report")
    with one_at_a_time(REPORT_LOCK[kind]) as taken:
        if not taken:
            raise ReportBusy(f"a {kind} report is running")
        run = job_start(job_run_id=job_run_id, kind=kind, requested_by=requested_by, since=since, until=until)
        if run is None:
            return None
        return _report_compute(run, kind, since, until, progress)


def _report_compute(run: JobRun, kind: str, since: datetime, until: datetime,
                    progress: Callable[[int, int], None] | None) -> Report:
    lake = Lake(settings.ANALYTICS_LAKE)
    out = f"{ds.REPORTS}/{kind}/run-{run.pk:08d}"
    try:
        job = importlib.import_module(JOB_MODULES[JobKind(kind)])
        # PySpark is loaded where a report runs, not wherever this module is (the admin and the
        # tasks import it in every web node and worker): importing it costs each process 0.3 s.
        from analytics.jobs.common import write_result
        from analytics.spark import spark_progress, spark_session  # PySpark, as above

        spark = spark_session()
        with spark_progress(spark, progress):
            write_result(job.build(spark, lake.url(), since, until), lake.url(out))
        report = report_load(kind=kind, since=since, until=until, results=lake.url(out), job_run=run)
    except Exception as exc:
        job_finish(job_run=run, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        lake.delete_dir(out)
    job_finish(job_run=run, rows={"rows": report.rows.count()})
    return report


def report_load(*, kind: JobKind, since: datetime, until: datetime, results: str, job_run: JobRun | None = None
                ) -> Report:
    """Store the result rows a job wrote to `results` (a folder or URI) as the report of (kind,
    since, until), replacing an earlier one of the same range in one transaction."""
    table = Lake(results).read("", ds.RESULT_COLUMNS)
    rows = table.to_pylist()
    as_of = max((r["period"] for r in rows if r["metric"] == ds.LIVE_SNAPSHOT), default=None)
    with transaction.atomic():
        report, _ = Report.objects.select_for_update().update_or_create(
            kind=kind, since=since, until=until,
            defaults={"as_of": as_of, "computed_at": timezone.now(), "job_run": job_run})
        report.rows.all().delete()
        ReportRow.objects.bulk_create(
            [ReportRow(report=report, metric=r["metric"], grain=r["grain"], period=r["period"], app=r["app"] or "",
                       subgroup=r["subgroup"] or "", bucket=r["bucket"] or "", value=r["value"]) for r in rows],
            batch_size=5000,
        )
    return report
