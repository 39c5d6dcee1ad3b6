"""The console's pages of the event exchange (Messaging › Follows, Event exchanges): the durable
follow graph (search a user's number: the rows where it follows or is followed) and each app's
exchange state (how far it has applied, the gap that holds events back, what was given up or
refused). Read-only: only the engine writes them."""

from __future__ import annotations

from django.contrib import admin

from foundation.admin_readonly import ReadOnlyAdminMixin
from messaging.exchange.models import ExchangeState, Follow


@admin.register(Follow)
class FollowAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["follower", "followee", "app", "created_at"]
    list_filter = ["app"]
    list_select_related = ["app"]
    search_fields = ["=follower", "=followee"]
    search_help_text = "A user's number: the rows where it is the follower or the followee."
    show_full_result_count = False
    ordering = ["app", "follower", "followee"]
    fields = readonly_fields = ["app", "follower", "followee", "created_at"]


@admin.register(ExchangeState)
class ExchangeStateAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["app", "applied_seq", "gap", "held", "skipped", "malformed", "updated_at"]
    list_select_related = ["app"]
    ordering = ["app"]
    fields = readonly_fields = ["app", "applied_seq", "gap_seq", "gap_since", "held", "skipped", "malformed",
                                "updated_at"]

    @admin.display(description="gap (first missing seq, since)")
    def gap(self, state: ExchangeState) -> str:
        if state.gap_seq is None:
            return "none"
        since = f", since {state.gap_since:%Y-%m-%d %H:%M:%S}" if state.gap_since else ""
        return f"{state.gap_seq}{since}"
