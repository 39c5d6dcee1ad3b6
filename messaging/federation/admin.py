"""The console's page of this domain's links (Messaging › Link health): every neighbour over a
configured link, with its live state (up; down since when, and whether it is routed around;
disabled; not called yet), the last error, the last answer, what was forwarded each way, when its
queues are retried, and the channel publishes and receipts waiting on it. Read-only; "probe now"
pings the selected neighbours at once (needs the change permission). Messaging › Receipts waiting
lists each receipt still on its way to its origin domain, with its attempts and last error; Messages
held in order, those that came before an earlier one from their origin and wait for it; Takeovers,
who serves whose users (standby domains)."""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.contrib import admin
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from apps_registry.models import DomainLink, Takeover
from foundation.admin_readonly import ACT, ReadOnlyAdminMixin
from messaging.federation.links import link_health_rows_ensure
from messaging.federation.models import ChannelForward, HeldInOrder, LinkHealth, OrderAfter, OrderMark, ReceiptForward
from messaging.federation.selectors import configured_links, link_state_text
from messaging.federation.standby.copy import copy_lag
from messaging.federation.takeover.take import hand_back
from messaging.federation.wire.probes import links_probe


def _count(model=ChannelForward, **filters) -> Coalesce:
    rows = (model.objects.filter(peer=OuterRef("peer"), **filters).order_by().values("peer")
            .annotate(n=Count("id")).values("n"))
    return Coalesce(Subquery(rows), 0)


@admin.register(LinkHealth)
class LinkHealthAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["peer", "state", "last_error", "last_ok_at", "forwarded_out", "forwarded_in", "retry_at",
                    "publishes_waiting", "publishes_dead", "receipts_waiting", "standby_copy", "no_way_on_to"]
    fields = readonly_fields = ["peer", "state", "last_error", "last_ok_at", "last_failure_at", "failures",
                                "retry_at", "forwarded_out", "forwarded_in", "publishes_waiting", "publishes_dead",
                                "receipts_waiting", "standby_copy", "no_way_on_to", "updated_at"]
    ordering = ["peer"]
    actions = ["probe_now"]

    def changelist_view(self, request, extra_context=None):
        # Every neighbour gets a row, so one never called yet is listed too ("not called yet").
        link_health_rows_ensure(configured_links())
        self._lag = copy_lag()
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._lag = copy_lag()
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="standby copy (waiting, lag)")
    def standby_copy(self, obj: LinkHealth) -> str:
        """The live copy of this domain's users' mailboxes to this neighbour, where it is their standby."""
        waiting, lag = getattr(self, "_lag", {}).get(obj.peer, (0, 0.0))
        return f"{waiting} waiting, {lag:.1f} s behind" if waiting else "-"

    def get_queryset(self, request):
        here = settings.DOMAIN_NAME
        link = DomainLink.objects.filter(Q(n1__name=here, n2__name=OuterRef("peer"))
                                         | Q(n2__name=here, n1__name=OuterRef("peer")))
        return super().get_queryset(request).annotate(
            link_enabled=Subquery(link.values("enabled")[:1]),
            waiting=_count(dead_at__isnull=True), dead=_count(dead_at__isnull=False),
            receipts=_count(ReceiptForward))

    @admin.display(description="state")
    def state(self, obj: LinkHealth) -> str:
        return link_state_text(obj, enabled=obj.link_enabled)

    @admin.display(description="publishes waiting")
    def publishes_waiting(self, obj: LinkHealth) -> int:
        return obj.waiting

    @admin.display(description="publishes dead")
    def publishes_dead(self, obj: LinkHealth) -> int:
        return obj.dead

    @admin.display(description="receipts waiting")
    def receipts_waiting(self, obj: LinkHealth) -> int:
        return obj.receipts

    @admin.display(description="no way on to (routed around)")
    def no_way_on_to(self, obj: LinkHealth) -> str:
        """What the neighbour said it has no way on to, and until when it is passed over for them."""
        now = time.time()
        live = sorted((t, u) for t, u in (obj.blocked or {}).items() if isinstance(u, (int, float)) and u > now)
        return ", ".join(f"{t} ({int(u - now)} s)" for t, u in live) or "-"

    @admin.action(description="Probe the selected links now", permissions=ACT)
    def probe_now(self, request, queryset):
        results = links_probe(peers=list(queryset.values_list("peer", flat=True)))
        for r in results:
            self.message_user(request, f"{r.peer}: down ({r.error})" if not r.ok else
                              f"{r.peer}: answers pings, but its last call failed: retried when its backoff ends"
                              if r.held_back else f"{r.peer}: up")
        skipped = queryset.count() - len(results)
        if skipped:
            self.message_user(request, f"{skipped} link(s) not probed: disabled or no longer configured.")


@admin.register(ReceiptForward)
class ReceiptForwardAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Receipts on their way back to their messages' origin domains, waiting on a link (a blank
    link: no enabled link led to the origin when it was written; the sweep looks again)."""

    list_display = ["id", "peer", "origin_domain", "origin_message_id", "recipient", "state", "at", "attempts",
                    "last_error", "created_at"]
    list_filter = ["peer", "state", "origin_domain"]
    search_fields = ["recipient", "=origin_message_id"]
    ordering = ["id"]
    fields = readonly_fields = list_display + ["domain", "error"]


@admin.register(HeldInOrder)
class HeldInOrderAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Messages stored here that came before an earlier one from their origin (messaging.federation.order):
    not in their recipient's mailbox until it comes, or until NETWORK_ORDER_WAIT_SECONDS have passed."""

    list_display = ["id", "recipient", "origin_domain", "origin_seq", "message", "held_at", "waits_until"]
    list_filter = ["origin_domain"]
    search_fields = ["recipient"]
    ordering = ["held_at", "id"]
    fields = readonly_fields = list_display

    @admin.display(description="waits at most until")
    def waits_until(self, obj: HeldInOrder):
        return obj.held_at + timedelta(seconds=settings.NETWORK_ORDER_WAIT_SECONDS)


class _Barriers(admin.SimpleListFilter):
    title = "barrier"
    parameter_name = "barrier"

    def lookups(self, request, model_admin):
        return [("any", "standing")]

    def queryset(self, request, queryset):
        if self.value() == "any":
            return queryset.filter(Q(blocked_until__isnull=False) & (~Q(blocked_by="") | ~Q(after_origin="")))
        return queryset


@admin.register(OrderMark)
class OrderMarkAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """How far each origin's messages to each recipient homed here are in the mailbox
    (messaging.federation.order), and the barriers that hold an origin's messages for a recipient: a
    silent holder's hand-back (`blocked by`), or another origin's message they come after."""

    list_display = ["recipient", "origin_domain", "last_seq", "held", "blocked_by", "after_origin", "after_seq",
                    "blocked_until"]
    list_filter = [_Barriers, "origin_domain"]
    search_fields = ["recipient"]
    ordering = ["recipient", "origin_domain"]
    fields = readonly_fields = list_display


@admin.register(OrderAfter)
class OrderAfterAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """What messages stored here first must follow at their recipients' homes: the places a home's
    live copy showed this standby (its users' messages from here, while it holds them), and the
    counts a holder sent with its hand-back (this domain's users' messages, for a minute after)."""

    list_display = ["recipient", "senders_home", "origin_domain", "seq", "until", "updated_at"]
    list_filter = ["senders_home", "origin_domain"]
    search_fields = ["recipient"]
    ordering = ["recipient", "origin_domain"]
    fields = readonly_fields = list_display


@admin.register(Takeover)
class TakeoverAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Who serves whose users (messaging.federation.takeover.take): each home and standby that took it
    over at least once (a standby holds the home's ranges it stands by for, no others), whether it
    holds them now, the last takeover and hand-back with their times. The same on every domain (the
    network's gossip carries it). `manage.py takeover` on the standby takes a home over or hands it
    back by hand; the action here hands back a home held by this domain."""

    list_display = ["home", "serving", "taken_at", "returned_at", "manual", "reason", "epoch"]
    list_filter = ["held", "manual"]
    ordering = ["home__name", "holder__name"]
    fields = readonly_fields = ["home", "holder", "held", "taken_at", "returned_at", "manual", "reason", "epoch"]
    actions = ["hand_back_now"]

    @admin.display(description="its users standing by at the holder are served by")
    def serving(self, obj: Takeover) -> str:
        return f"{obj.holder.name} (taken over)" if obj.held else f"{obj.home.name} (home; last held by {obj.holder.name})"

    @admin.action(description="Hand the selected homes back (held by this domain)", permissions=ACT)
    def hand_back_now(self, request, queryset):
        for takeover in queryset.select_related("home", "holder"):
            if takeover.holder.name != settings.DOMAIN_NAME:  # another standby's: it hands back its own
                self.message_user(request, f"{takeover.home.name}: not held here (its holder is {takeover.holder.name})")
                continue
            answer = hand_back(takeover.home.name, manual=True)
            self.message_user(request, f"{takeover.home.name}: {answer['state']}"
                              + (f" ({answer['changes_waiting']} changes not yet taken; try again)"
                                 if answer["state"] == "waiting" else
                                 " (its users' connections are closing here; the hand-back goes on by itself)"
                                 if answer["state"] == "closing" else ""))
