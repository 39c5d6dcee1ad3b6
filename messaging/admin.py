"""The console for messages, their per-recipient delivery records and the dead-letter queue.

Built to stay fast with millions of rows: no full COUNT(*) on changelists, related rows fetched
with the page (list_select_related), filters on indexed columns only.

Nothing here deletes: removing one message or delivery would leave a hole in a mailbox's sequence
(a client fetching would see seq 1, 3, 4). Removal belongs to retention; a dead letter an operator
gives up on is discarded (it stays on record as expired).
"""

from __future__ import annotations

from django.contrib import admin

from foundation.admin_readonly import ACT, ReadOnlyAdminMixin

from .core.delivery.dead_letters import dead_letters_discard, dead_letters_requeue
from .exchange import admin as exchange_admin  # noqa: F401  (registers the event exchange's console)
from .federation import admin as federation_admin  # noqa: F401  (registers the links' console)
from .federation.whereabouts import delivery_where
from .intake.stream import admin as queue_intake_admin  # noqa: F401  (registers the queue credentials' console)
from .models import DeadLetter, Delivery, DeliveryState, Message
from .requests import admin as requests_admin  # noqa: F401  (registers the requests' console)
from .selftest import admin as selftest_admin  # noqa: F401  (registers the selftest runs' console)
from .webhooks import admin as webhooks_admin  # noqa: F401  (registers the webhook console)


@admin.display(description="where")
def _where(obj: Delivery) -> str:
    """For a recipient homed in another domain: "forwarded to domain-02, delivered in domain-03"."""
    return delivery_where(obj)


class DeliveryInline(admin.TabularInline):
    model = Delivery
    fields = ["recipient", "seq", "state", "attempts", "created_at", "sent_at", "delivered_at", "next_attempt_at",
              "forward_to", "where", "last_error"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    where = staticmethod(_where)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Message)
class MessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "created_at", "app", "sender", "kind", "reference", "short_content"]
    list_filter = ["kind", "app"]
    list_select_related = ["app"]
    search_fields = ["sender__exact"]  # indexed; an OR with unindexed columns would scan the table
    show_full_result_count = False
    ordering = ["-id"]
    inlines = [DeliveryInline]
    readonly_fields = ["app", "sender", "kind", "content", "reference", "confirmation_requested",
                       "client_message_id", "origin_domain", "origin_message_id", "forward_path", "confirms_origin",
                       "created_at"]

    @admin.display(description="content")
    def short_content(self, obj: Message) -> str:
        return obj.content[:80] + ("…" if len(obj.content) > 80 else "")


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "message_id", "recipient", "seq", "state", "attempts", "created_at", "delivered_at",
                    "next_attempt_at", "where"]
    list_filter = ["state"]
    list_select_related = ["message"]
    search_fields = ["recipient__exact"]
    show_full_result_count = False
    ordering = ["-id"]
    raw_id_fields = ["message"]
    where = staticmethod(_where)


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["id", "message_id", "app", "recipient", "attempts", "dead_at", "last_error"]
    list_filter = ["app"]
    list_select_related = ["app", "message"]
    search_fields = ["recipient__exact"]
    show_full_result_count = False
    ordering = ["-dead_at"]
    actions = ["requeue", "discard"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(state=DeliveryState.DEAD)

    @admin.action(description="Re-queue selected dead letters (fresh attempts)", permissions=ACT)
    def requeue(self, request, queryset):
        count = dead_letters_requeue(delivery_ids=list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"Re-queued {count} dead letter(s).")

    @admin.action(description="Discard selected dead letters", permissions=ACT)
    def discard(self, request, queryset):
        count = dead_letters_discard(delivery_ids=list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"Discarded {count} dead letter(s).")
