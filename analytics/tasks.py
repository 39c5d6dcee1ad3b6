"""Celery tasks of analytics. Each takes ids (or nothing, from beat), calls one service, and is
safe to run twice: an export moves watermarks only with the files that carry the rows, and a
report replaces the one of the same range."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from analytics.models import JobKind, JobRun
from analytics.selectors import report_default_range
from analytics.services import ExportBusy, ReportBusy, lake_export
from analytics.services import report_run as report_run_service
from analytics.services.retention import rows_past_retention_delete
from foundation.backoff import Backoff

log = logging.getLogger(__name__)
# Exports and Spark reports run far longer than the default task limit (CELERY_TASK_*_TIME_LIMIT).
SPARK_TIME_LIMITS = {"soft_time_limit": settings.ANALYTICS_TASK_SOFT_TIME_LIMIT,
                     "time_limit": settings.ANALYTICS_TASK_TIME_LIMIT}
# A run requested while another of its kind is running waits for it, the same while at a time (the
# running one takes minutes, not a growing while): a backoff whose cap is its base.
EXPORT_BUSY_RETRY = Backoff(base=15.0, cap=15.0, jitter=0.0)
REPORT_BUSY_RETRY = Backoff(base=30.0, cap=30.0, jitter=0.0)


@shared_task(bind=True, acks_late=True, max_retries=40, **SPARK_TIME_LIMITS)
def export_run(self, job_run_id: int | None = None) -> dict:
    """Beat (every ANALYTICS_EXPORT_SECONDS) or the admin's button: export what changed."""
    try:
        result = lake_export(job_run_id=job_run_id, requested_by="" if job_run_id else "beat")
    except ExportBusy:
        if job_run_id is None:
            return {"skipped": "another export is running"}  # the next beat tick takes over
        raise self.retry(countdown=EXPORT_BUSY_RETRY.seconds(self.request.retries + 1)) from None
    return {"run": result.run_id, "rows": result.rows, "files": result.files}


@shared_task(bind=True, acks_late=True, max_retries=40, **SPARK_TIME_LIMITS)
def report_run(self, job_run_id: int | None = None, kind: str | None = None) -> dict:
    """Beat (nightly, yesterday's report) or the admin's button (the run's kind and range)."""
    if job_run_id is not None:
        run = JobRun.objects.get(pk=job_run_id)
        kind, since, until = run.kind, run.since, run.until
    else:
        since, until = None, None
    if since is None or until is None:
        since, until = report_default_range()
    try:
        report = report_run_service(kind=JobKind(kind), since=since, until=until, job_run_id=job_run_id,
                                    requested_by="" if job_run_id else "beat")
    except ReportBusy:
        raise self.retry(countdown=REPORT_BUSY_RETRY.seconds(self.request.retries + 1)) from None
    return {"report": report.pk if report else None}


@shared_task
def retention_sweep() -> dict:
    """Beat (every RETENTION_SWEEP_SECONDS): rows past their app's retention that the export has,
    and a standby's copies past it, deleted in bounded batches (analytics.services.retention)."""
    swept = rows_past_retention_delete()
    return {"removed": swept.removed, "done": swept.done}
