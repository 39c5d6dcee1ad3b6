"""What analytics keeps in Postgres: export watermarks, job runs, and report results.

The exported rows themselves live in the lake (Parquet under ANALYTICS_LAKE); Postgres holds
only what says how far the export got and what the reports found.

Guarantees:
- A watermark moves only in the transaction that also records, on the export's JobRun, the
  files that carry the rows up to it (analytics.services.export): the lake and the watermark
  cannot disagree about which rows were exported.
- One Report per (kind, since, until): running a report again for the same range replaces its
  rows in one transaction, and ReportRow is unique per (report, metric, grain, period, app,
  subgroup, bucket), so no figure is ever stored twice.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class ExportTable(models.TextChoices):
    MESSAGES = "messages"
    DELIVERIES = "deliveries"
    SESSIONS = "sessions"
    PRESENCE_EVENTS = "presence_events"


class ExportWatermark(models.Model):
    """How far the export of one source table got.

    `position` is the last source id whose row is in the lake (for sessions: the id of the last
    disconnect event whose closed session is in the lake). `snapshot_run` names the export run
    whose live snapshot (deliveries not yet delivered or expired, sessions still open) is current.
    """

    table = models.CharField(max_length=32, primary_key=True, choices=ExportTable.choices)
    position = models.BigIntegerField(default=0)
    snapshot_run = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.table} up to #{self.position}"


class JobKind(models.TextChoices):
    EXPORT = "export", "export to the lake"
    PRESENCE = "presence", "presence report"
    BACKLOG = "backlog", "backlog report"


REPORT_KINDS = (JobKind.PRESENCE, JobKind.BACKLOG)


class JobState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


UNFINISHED_STATES = (JobState.QUEUED, JobState.RUNNING)


class JobRun(models.Model):
    """One export or report run, from the request (the admin's button, beat, a command) to its end.

    An export run is `committed` once its watermarks moved (its files are then the record of the
    rows it exported) and `succeeded` once those files are published in the lake; an export that
    died after committing is published by the next one.
    """

    kind = models.CharField(max_length=16, choices=JobKind.choices)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    requested_by = models.CharField(max_length=150, blank=True, default="")
    since = models.DateTimeField(null=True, blank=True)
    until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    snapshot_at = models.DateTimeField(null=True, blank=True)  # an export's read time: its snapshots are as of it
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    rows = models.JSONField(default=dict, blank=True)  # rows written per dataset, or report rows stored
    files = models.JSONField(default=list, blank=True)  # an export's files, relative to the lake

    class Meta:
        indexes = [
            # The latest runs of a kind: the dashboard, the report pages' button state, pruning.
            models.Index(fields=["kind", "-created_at"], name="jobrun_latest_of_kind"),
            # Exports left unfinished by a crash, found by the next export.
            models.Index(fields=["kind"], name="jobrun_unfinished", condition=Q(state__in=["queued", "running"])),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} ({self.state})"

    @property
    def is_finished(self) -> bool:
        return self.state not in UNFINISHED_STATES


class Report(models.Model):
    """The result of one presence or backlog job over [since, until)."""

    kind = models.CharField(max_length=16, choices=[(k.value, k.label) for k in REPORT_KINDS])
    since = models.DateTimeField()
    until = models.DateTimeField()
    # The time of the live snapshot the job read (backlog by age, dead letters, open sessions).
    as_of = models.DateTimeField(null=True, blank=True)
    computed_at = models.DateTimeField(default=timezone.now)
    job_run = models.ForeignKey(JobRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "since", "until"], name="report_once_per_range")]
        indexes = [
            # The latest report of a kind (the dashboard's charts, "latest" links).
            models.Index(fields=["kind", "-computed_at"], name="report_latest_of_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.since:%Y-%m-%d %H:%M} – {self.until:%Y-%m-%d %H:%M}"


class ReportRow(models.Model):
    """One figure: a metric at a grain (minute, hour, day, the whole range, the snapshot) for an
    app ("" = all apps) and a subgroup (a domain, a feature, a state; "" = all), in a bucket (a
    percentile, an age bucket, an attempt count, an error, a user)."""

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="rows")
    metric = models.CharField(max_length=64)
    grain = models.CharField(max_length=16)
    period = models.DateTimeField()
    app = models.CharField(max_length=64, blank=True, default="")
    subgroup = models.CharField(max_length=128, blank=True, default="")
    bucket = models.CharField(max_length=200, blank=True, default="")
    value = models.FloatField()

    class Meta:
        constraints = [
            # Also the index of every read: a report's rows of one metric (selectors).
            models.UniqueConstraint(fields=["report", "metric", "grain", "period", "app", "subgroup", "bucket"],
                                    name="report_row_once"),
        ]

    def __str__(self) -> str:
        return f"{self.metric} {self.grain} {self.app}/{self.subgroup}/{self.bucket} = {self.value:g}"


class RetentionDay(models.Model):
    """Rows the retention sweep deleted on one day (UTC) from one source table
    (analytics.services.retention): grown in the transaction of each batch it counts, so the
    count is exactly what went."""

    day = models.DateField()
    source = models.CharField(max_length=32)  # deliveries, messages, sessions, presence_events
    removed = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "source"], name="retention_day_per_source")]

    def __str__(self) -> str:
        return f"{self.day}: {self.removed} {self.source}"
