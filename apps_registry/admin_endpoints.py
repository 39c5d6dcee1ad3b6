"""The console's request endpoints (an inline of the app page): a new endpoint's webhook secret is
shown once, when it is saved, and never again."""

from __future__ import annotations

from django.contrib import admin, messages

from .models import RequestEndpoint


class RequestEndpointInline(admin.TabularInline):
    """The app's request endpoints (docs/protocol.md, "Requests"). A new endpoint's webhook secret is
    shown once, when it is saved."""

    model = RequestEndpoint
    fields = ["name", "webhook_url", "stream", "timeout_ms", "max_timeout_ms", "max_in_flight_per_user", "enabled"]
    extra = 0


def endpoint_secrets_show(model_admin: admin.ModelAdmin, request, formset) -> None:
    for endpoint in formset.new_objects:
        if endpoint.webhook_url:
            model_admin.message_user(request, f"Request endpoint {endpoint.name}: its webhook secret is "
                                              f"{endpoint.webhook_secret} (shown once; it signs the request.received "
                                              "calls).", messages.WARNING)
