"""The console's list of selftest runs: a run whose client died before ending it (a killed laptop,
a lost network) stays here until an operator ends it, which removes what it was given
(messaging.selftest.provision.selftest_end)."""

from __future__ import annotations

from django.contrib import admin

from apps_registry.models import SelftestRun
from messaging.selftest.provision import selftest_end


@admin.register(SelftestRun)
class SelftestRunAdmin(admin.ModelAdmin):
    list_display = ["name", "app", "app_created", "created_at"]
    list_select_related = ["app"]
    fields = readonly_fields = ["name", "app", "app_created", "users", "channel", "webhook_endpoint_id", "created_at"]
    actions = ["end"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # ending a run is the action below: a plain delete would leave its throwaways behind

    @admin.action(description="End selected runs (remove what they were given)", permissions=["change"])
    def end(self, request, queryset):
        names = list(queryset.values_list("name", flat=True))
        ended = sum(selftest_end(name=name) for name in names)
        self.message_user(request, f"Ended {ended} selftest run(s).")
