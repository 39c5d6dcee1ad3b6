"""The console for webhook endpoints and their deliveries.

An endpoint's signing secret is shown once, when it is created (as API keys are); after that only
the fact that it is set. Deliveries are records: viewable, filterable by state, event and app, and
dead ones can be re-queued; nothing here edits or deletes them (retention does).
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils.html import format_html

from foundation.admin_readonly import ACT, ReadOnlyAdminMixin
from messaging.webhooks.models import WEBHOOK_ALL_EVENTS, WEBHOOK_NAMEABLE_EVENTS, WebhookDelivery, WebhookEndpoint

from .selectors import webhook_events_forget
from .services import (
    webhook_deliveries_requeue,
    webhook_endpoint_create,
    webhook_events_clean,
    webhook_test_send,
    webhook_url_validate,
)


def _field_errors(exc: ValidationError, field: str) -> ValidationError:
    return ValidationError(exc.message_dict.get(field, exc.messages) if hasattr(exc, "error_dict") else exc.messages)


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(label="URL", max_length=500, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[(WEBHOOK_ALL_EVENTS, "every event"), *((e, e) for e in WEBHOOK_NAMEABLE_EVENTS)],
        widget=forms.CheckboxSelectMultiple, initial=[WEBHOOK_ALL_EVENTS], required=False,
        help_text="Nothing ticked, or 'every event': all of Switchboard's events (including events added later). "
                  "Pusher's (pusher.*) go only where ticked, in Pusher's format, signed with the app's Pusher secret.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["app", "url", "events", "enabled", "description"]

    def clean_url(self) -> str:
        url = self.cleaned_data.get("url", "")
        try:
            webhook_url_validate(url)
        except ValidationError as exc:
            raise _field_errors(exc, "url") from None
        return url

    def clean_events(self) -> list[str]:
        try:
            return webhook_events_clean(self.cleaned_data.get("events") or None)
        except ValidationError as exc:
            raise _field_errors(exc, "events") from None


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ["id", "app", "url", "event_list", "enabled", "created_at", "description", "deliveries_link"]
    list_filter = ["enabled", "app"]
    list_select_related = ["app"]
    search_fields = ["url", "description", "app__app_name"]
    ordering = ["app__app_name", "id"]
    actions = ["send_test_event"]

    def get_fields(self, request, obj=None):
        fields = ["app", "url", "events", "enabled", "description"]
        return fields if obj is None else [*fields, "secret_state", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["app", "secret_state", "created_at"]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            app_id = obj.app_id
            transaction.on_commit(lambda: webhook_events_forget(app_id))
            return
        data = form.cleaned_data
        endpoint, secret = webhook_endpoint_create(app_id=data["app"].pk, url=data["url"], events=data["events"],
                                                   description=data.get("description", ""),
                                                   enabled=data.get("enabled", True))
        obj.pk = endpoint.pk
        self.message_user(
            request,
            format_html("Signing secret of the new endpoint {}: <code id='new-webhook-secret'>{}</code> — copy it "
                        "now; it is shown only this once.", endpoint.url, secret),
            messages.WARNING,
        )

    def log_addition(self, request, obj, message):
        return super().log_addition(request, WebhookEndpoint.objects.get(pk=obj.pk), message)

    def delete_model(self, request, obj):
        app_id = obj.app_id
        super().delete_model(request, obj)
        transaction.on_commit(lambda: webhook_events_forget(app_id))

    def delete_queryset(self, request, queryset):
        super().delete_queryset(request, queryset)
        transaction.on_commit(webhook_events_forget)

    def get_deleted_objects(self, objs, request):
        # The stock confirmation page lists every related row: an endpoint's delivery records can
        # be millions. Say how many instead (the endpoint_id index counts them).
        endpoints = list(objs)
        deliveries = WebhookDelivery.objects.filter(endpoint__in=endpoints).count()
        return ([str(e) for e in endpoints], {"webhook endpoints": len(endpoints), "webhook deliveries": deliveries},
                set(), [])

    @admin.display(description="events")
    def event_list(self, obj: WebhookEndpoint) -> str:
        return "all" if WEBHOOK_ALL_EVENTS in obj.events else ", ".join(obj.events)

    @admin.display(description="signing secret")
    def secret_state(self, obj: WebhookEndpoint) -> str:
        return "set (shown once, when the endpoint was created)"

    @admin.display(description="deliveries")
    def deliveries_link(self, obj: WebhookEndpoint) -> str:
        url = reverse("admin:messaging_webhookdelivery_changelist") + f"?endpoint__id__exact={obj.pk}"
        return format_html('<a href="{}">deliveries</a>', url)

    @admin.action(description="Send a test event to the selected endpoints", permissions=["change"])
    def send_test_event(self, request, queryset):
        sent = [webhook_test_send(endpoint=endpoint) for endpoint in queryset.select_related("app")]
        self.message_user(request, f"Sent a webhook.test event to {len(sent)} endpoint(s); see their deliveries.")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "event", "app", "endpoint_url", "state", "attempts", "last_status",
                    "next_attempt_at", "delivered_at", "short_error"]
    # The app filter lists the apps (a small table); "only apps with deliveries" would scan this one.
    list_filter = ["state", "event", "endpoint__app"]
    list_select_related = ["endpoint", "endpoint__app", "request_endpoint", "request_endpoint__app"]
    show_full_result_count = False
    ordering = ["-created_at"]
    actions = ["requeue"]
    fields = ["id", "endpoint", "request_endpoint", "event", "state", "attempts", "last_status", "last_error", "created_at",
              "next_attempt_at", "delivered_at", "dead_at", "payload_json"]
    readonly_fields = fields

    @admin.display(description="app", ordering="endpoint__app__app_name")
    def app(self, obj: WebhookDelivery) -> str:
        return (obj.endpoint or obj.request_endpoint).app.app_name

    @admin.display(description="endpoint")
    def endpoint_url(self, obj: WebhookDelivery) -> str:
        return obj.endpoint.url if obj.endpoint else f"{obj.request_endpoint.name}: {obj.request_endpoint.webhook_url}"

    @admin.display(description="last error")
    def short_error(self, obj: WebhookDelivery) -> str:
        return obj.last_error[:80] + ("…" if len(obj.last_error) > 80 else "")

    @admin.display(description="payload (the body sent)")
    def payload_json(self, obj: WebhookDelivery) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2, ensure_ascii=False))

    @admin.action(description="Re-queue selected dead webhook deliveries (fresh attempts)", permissions=ACT)
    def requeue(self, request, queryset):
        count = webhook_deliveries_requeue(delivery_ids=list(queryset.values_list("id", flat=True)))
        self.message_user(request, f"Re-queued {count} dead webhook delivery(ies).")
