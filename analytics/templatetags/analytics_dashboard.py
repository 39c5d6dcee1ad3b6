"""{% operator_dashboard %}: the live figures and latest reports at the top of the admin index."""

from __future__ import annotations

from django import template

from analytics.models import JobKind
from analytics.pages import REPORT_BUTTONS, backlog_age_chart, concurrency_chart, latency_chart
from analytics.selectors import RETENTION_SOURCES, dashboard_live, job_runs_latest, report_latest, retention_figures

register = template.Library()


@register.inclusion_tag("admin/analytics/dashboard.html", takes_context=True)
def operator_dashboard(context) -> dict:
    presence, backlog = report_latest(JobKind.PRESENCE), report_latest(JobKind.BACKLOG)
    charts = []
    if presence:
        charts.append((presence, concurrency_chart(presence, width=560, height=220, everyone_only=True)))
    if backlog:
        charts.append((backlog, backlog_age_chart(backlog, width=560, height=220)))
        charts.append((backlog, latency_chart(backlog, width=560, height=220)))
    return {"live": dashboard_live(), "charts": charts, "retention": retention_figures(),
            "retention_sources": RETENTION_SOURCES, "latest_runs": job_runs_latest(), "report_kinds": REPORT_BUTTONS,
            "csrf_token": context.get("csrf_token"), "request": context.get("request")}
