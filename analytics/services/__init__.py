"""Write-side services of analytics: the export to the lake, report runs, job runs."""

from __future__ import annotations

from .export import ExportBusy, ExportResult, lake_export, lake_reset
from .jobs import job_finish, job_request, job_start
from .reports import ReportBusy, report_load, report_run

__all__ = ["ExportBusy", "ExportResult", "ReportBusy", "job_finish", "job_request", "job_start", "lake_export", "lake_reset",
           "report_load", "report_run"]
