"""The console for nodes and live sessions."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from .models import Node, Session
from .services import session_disconnect


class LiveFilter(admin.SimpleListFilter):
    title = "connection"
    parameter_name = "live"

    def lookups(self, request, model_admin):
        return [("yes", "live"), ("no", "closed")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(disconnected_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(disconnected_at__isnull=False)
        return queryset


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["user_id", "app", "node", "connected_at", "last_seen_at", "disconnected_at", "acks",
                    "remote_addr"]
    list_filter = [LiveFilter, "app", "node"]
    list_select_related = ["app", "node"]
    search_fields = ["user_id__exact"]
    show_full_result_count = False
    ordering = ["-connected_at"]
    actions = ["disconnect"]
    readonly_fields = [f.name for f in Session._meta.fields]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Disconnect selected live sessions", permissions=["change"])
    def disconnect(self, request, queryset):
        sessions = list(queryset.filter(disconnected_at__isnull=True))
        for session in sessions:
            session_disconnect(session=session, reason="disconnected by an operator")
        self.message_user(request, f"Asked {len(sessions)} connection(s) to close.")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["node_id", "domain", "started_at", "heartbeat_at", "heartbeat_age", "stopped_at"]
    readonly_fields = ["node_id", "domain", "started_at", "heartbeat_at", "stopped_at"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, obj: Node) -> str:
        if obj.stopped_at:
            return "stopped"
        return f"{(timezone.now() - obj.heartbeat_at).total_seconds():.0f} s"
