"""The console's reports: report pages with charts and CSV, job runs and the on-demand button,
export watermarks. The front page (templates/admin/index.html) is the operator dashboard."""

from __future__ import annotations

import csv
from datetime import datetime

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from .models import ExportWatermark, JobKind, JobRun, Report
from .pages import report_sections
from .selectors import job_runs_latest, report_default_range, report_rows_for_csv, report_today_range
from .services import job_request


class JobRequestForm(forms.Form):
    kind = forms.ChoiceField(choices=JobKind.choices)
    span = forms.ChoiceField(choices=[("yesterday", "yesterday"), ("today", "today so far"), ("range", "range")],
                             required=False)
    since = forms.DateTimeField(required=False)
    until = forms.DateTimeField(required=False)

    def range(self) -> tuple[datetime | None, datetime | None]:
        data = self.cleaned_data
        if data["kind"] == JobKind.EXPORT:
            return None, None
        if data["span"] == "range" and data["since"] and data["until"]:
            return data["since"], data["until"]
        return report_today_range() if data["span"] == "today" else report_default_range()


@admin.register(JobRun)
class JobRunAdmin(admin.ModelAdmin):
    list_display = ["__str__", "kind", "state", "requested_by", "since", "until", "created_at", "finished_at"]
    list_filter = ["kind", "state"]
    readonly_fields = [f.name for f in JobRun._meta.fields]
    ordering = ["-created_at"]
    change_form_template = "admin/analytics/jobrun/change_form.html"

    def has_add_permission(self, request):
        return False  # runs are requested with the buttons (request_view), not typed in

    def has_change_permission(self, request, obj=None):
        return False

    def get_urls(self):
        return [path("request/", self.admin_site.admin_view(require_POST(self.request_view)),
                     name="analytics_jobrun_request"), *super().get_urls()]

    def request_view(self, request: HttpRequest) -> HttpResponse:
        """The on-demand button: queue the run on a worker and show its page."""
        if not request.user.has_perm("analytics.add_jobrun"):
            raise PermissionDenied
        form = JobRequestForm(request.POST)
        if not form.is_valid():
            messages.error(request, f"Cannot start that job: {form.errors.as_text()}")
            return HttpResponseRedirect(reverse("admin:index"))
        since, until = form.range()
        run = job_request(kind=form.cleaned_data["kind"], requested_by=request.user.get_username(), since=since,
                          until=until)
        self.message_user(request, f"{run} queued.")
        return HttpResponseRedirect(reverse("admin:analytics_jobrun_change", args=[run.pk]))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = get_object_or_404(JobRun, pk=object_id)
        report = Report.objects.filter(job_run=run).first()
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "run": run,
                                                                  "report": report})


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ["__str__", "kind", "since", "until", "as_of", "computed_at"]
    list_filter = ["kind"]
    ordering = ["-computed_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_urls(self):
        view = self.admin_site.admin_view
        return [path("<int:report_id>/csv/", view(self.csv_view), name="analytics_report_csv"),
                *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The report page: charts and tables instead of a form."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        report = get_object_or_404(Report, pk=object_id)
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": str(report),
            "report": report, "sections": report_sections(report), "latest_runs": job_runs_latest(),
            "report_kinds": [(report.kind, report.get_kind_display())],
        }
        return TemplateResponse(request, "admin/analytics/report/report.html", context)

    def csv_view(self, request: HttpRequest, report_id: int) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        report = get_object_or_404(Report, pk=report_id)
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = (f'attachment; filename="{report.kind}-{report.since:%Y%m%dT%H%M}-'
                                           f'{report.until:%Y%m%dT%H%M}.csv"')
        writer = csv.writer(response)
        writer.writerow(["metric", "grain", "period", "app", "subgroup", "bucket", "value"])
        for r in report_rows_for_csv(report):
            writer.writerow([r.metric, r.grain, r.period.isoformat(), r.app, r.subgroup, r.bucket, f"{r.value:g}"])
        return response


@admin.register(ExportWatermark)
class ExportWatermarkAdmin(admin.ModelAdmin):
    list_display = ["table", "position", "snapshot_run", "updated_at"]
    readonly_fields = ["table", "position", "snapshot_run", "updated_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # `manage.py analytics_export --reset` forgets them together with the lake
