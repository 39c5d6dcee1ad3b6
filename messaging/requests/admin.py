"""The console's requests (Messaging › Requests): each request and its outcome, filterable, and a
summary per endpoint (counts by state and request-to-outcome latency, with a chart), plus the
sessions that ended. Read-only: requests are answered by the app's server, never here."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.html import escape

from foundation.admin_readonly import ReadOnlyAdminMixin
from messaging.requests.models import ClosedSession, Request
from messaging.requests.selectors import EndpointFigures, endpoint_figures

WINDOWS = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400}
STATE_COLOURS = (("resolved", "#2e7d32"), ("rejected", "#ef6c00"), ("timed_out", "#c62828"), ("failed", "#6a1b9a"),
                 ("waiting", "#1565c0"))


@admin.register(Request)
class RequestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "created_at", "direction", "app_name", "endpoint", "user_id", "state", "outcome", "reason",
                    "answered_via", "latency_ms"]
    list_filter = ["state", "direction", "answered_via", "app"]
    search_fields = ["=id", "user_id", "endpoint", "client_message_id", "correlation"]
    list_select_related = ["app"]
    show_full_result_count = False
    ordering = ["-created_at"]
    change_list_template = "admin/messaging/request/change_list.html"

    @admin.display(description="app", ordering="app__app_name")
    def app_name(self, obj: Request) -> str:
        return obj.app.app_name

    @admin.display(description="to outcome (ms)")
    def latency_ms(self, obj: Request) -> str:
        if obj.answered_at is None:
            return ""
        return f"{(obj.answered_at - obj.created_at).total_seconds() * 1000:.0f}"

    def get_urls(self):
        return [path("summary/", self.admin_site.admin_view(self.summary_view), name="messaging_request_summary"),
                *super().get_urls()]

    def summary_view(self, request: HttpRequest):
        window = request.GET.get("window", "1h")
        figures = endpoint_figures(window_seconds=WINDOWS.get(window, 3600))
        context = {**self.admin_site.each_context(request), "title": "Requests by endpoint", "opts": self.model._meta,
                   "figures": figures, "window": window, "windows": list(WINDOWS), "chart": figures_svg(figures),
                   "colours": STATE_COLOURS}
        return TemplateResponse(request, "admin/messaging/request/summary.html", context)


def figures_svg(figures: list[EndpointFigures]) -> str:
    """One bar per endpoint, its requests stacked by state, and its p99 latency written beside it."""
    if not figures:
        return ""
    width, bar, gap, label = 720, 22, 10, 220
    most = max(f.total for f in figures) or 1
    height = len(figures) * (bar + gap) + gap
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="requests by endpoint and state">']
    for row, f in enumerate(figures):
        y = gap + row * (bar + gap)
        name = escape(f"{f.app_name} {f.endpoint or '(server → client)'}")
        parts.append(f'<text x="0" y="{y + bar * 0.7:.0f}" font-size="12">{name}</text>')
        x = float(label)
        for state, colour in STATE_COLOURS:
            count = getattr(f, state)
            if count:
                w = (width - label - 120) * count / most
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colour}">'
                             f'<title>{state}: {count}</title></rect>')
                x += w
        p99 = "" if f.p99_ms is None else f" · p99 {f.p99_ms:g} ms"
        parts.append(f'<text x="{x + 6:.1f}" y="{y + bar * 0.7:.0f}" font-size="12">{f.total}{p99}</text>')
    parts.append("</svg>")
    return "".join(parts)


@admin.register(ClosedSession)
class ClosedSessionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["session", "app", "user_id", "reason", "discarded", "closed_at"]
    list_filter = ["reason"]
    search_fields = ["=session", "user_id"]
    ordering = ["-closed_at"]
