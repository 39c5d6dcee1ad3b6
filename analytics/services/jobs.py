"""The life of a JobRun: requested (the admin's button), started, finished."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from analytics.models import JobKind, JobRun, JobState
from foundation import handoff

# Task names, not imports: tasks call services, so services name tasks without importing them.
TASK_OF_KIND = {JobKind.EXPORT: "analytics.tasks.export_run", JobKind.PRESENCE: "analytics.tasks.report_run",
                JobKind.BACKLOG: "analytics.tasks.report_run"}


def job_request(*, kind: JobKind, requested_by: str, since: datetime | None = None,
                until: datetime | None = None) -> JobRun:
    """Queue a run on a worker (after commit), through the door of foundation.handoff (Celery's default
    queue); the returned row shows its progress."""
    run = JobRun.objects.create(kind=kind, requested_by=requested_by, since=since, until=until)
    transaction.on_commit(lambda: handoff.task_enqueue(TASK_OF_KIND[JobKind(kind)], [run.pk]))
    return run


def job_start(*, job_run_id: int | None, kind: JobKind, requested_by: str = "", since: datetime | None = None,
              until: datetime | None = None) -> JobRun | None:
    """Mark a run running, creating it when no id is given. None when that run already succeeded
    (a task delivered twice does its work once)."""
    now = timezone.now()
    if job_run_id is None:
        return JobRun.objects.create(kind=kind, state=JobState.RUNNING, requested_by=requested_by, since=since,
                                     until=until, started_at=now)
    started = JobRun.objects.filter(pk=job_run_id).exclude(state=JobState.SUCCEEDED).update(
        state=JobState.RUNNING, started_at=now, finished_at=None, error="")
    return JobRun.objects.get(pk=job_run_id) if started else None


def job_finish(*, job_run: JobRun, error: str = "", rows: dict | None = None) -> None:
    job_run.state = JobState.FAILED if error else JobState.SUCCEEDED
    job_run.error = error[:5000]
    job_run.finished_at = timezone.now()
    fields = ["state", "error", "finished_at"]
    if rows is not None:
        job_run.rows = rows
        fields.append("rows")
    job_run.save(update_fields=fields)
