"""The console's Pusher credentials (apps_registry.pusher_credentials): one row per app, made with the
app. The app id and the key are shown (the key is public); the secret only once, when it is rotated
here ("Rotate the Pusher secret"), and never again (an export with secrets carries it too)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html

from .pusher_credentials import PusherCredentials
from .services import pusher_secret_rotate


@admin.register(PusherCredentials)
class PusherCredentialsAdmin(admin.ModelAdmin):
    list_display = ["app", "pusher_app_id", "key", "client_events", "enabled", "secret_rotated_at"]
    list_select_related = ["app"]
    search_fields = ["app__app_name", "pusher_app_id", "key"]
    fields = ["app", "pusher_app_id", "key", "secret_shown", "client_events", "enabled", "secret_rotated_at"]
    readonly_fields = ["app", "pusher_app_id", "key", "secret_shown", "secret_rotated_at"]
    actions = ["rotate_secret"]

    def has_add_permission(self, request) -> bool:
        return False  # made with the app

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # goes with the app

    @admin.display(description="secret")
    def secret_shown(self, obj: PusherCredentials) -> str:
        return "•••••••• (shown once, when rotated: select the app and 'Rotate the Pusher secret')"

    @admin.action(description="Rotate the Pusher secret", permissions=["change"])
    def rotate_secret(self, request, queryset) -> None:
        for creds in queryset.select_related("app"):
            secret = pusher_secret_rotate(credentials=creds)
            self.message_user(request, format_html(
                "New Pusher secret of {} (app_id {}, key {}): <code class='new-pusher-secret'>{}</code> — copy it "
                "now; it is shown only this once. The old one no longer works.",
                creds.app.app_name, creds.pusher_app_id, creds.key, secret), messages.WARNING)
