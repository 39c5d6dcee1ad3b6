"""The console's page of queue credentials (Messaging › Queue credentials): add one for an app
(its password is shown once, on the page that follows), rotate or revoke the selected ones. Every
change goes through intake.stream.credentials; the page shows what the app's backend needs."""

from __future__ import annotations

import redis
from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from foundation.transport.queue_names import acl_user, dead_key, intake_key, queue_client, queue_db
from messaging.intake.stream.credentials import (
    CredentialExists,
    NoCredential,
    queue_credential_create,
    queue_credential_revoke,
    queue_credential_rotate,
)
from messaging.intake.stream.models import QueueCredential


class QueueCredentialCreateForm(forms.ModelForm):
    class Meta:
        model = QueueCredential
        fields = ["app"]


@admin.register(QueueCredential)
class QueueCredentialAdmin(admin.ModelAdmin):
    list_display = ["app", "redis_user", "stream", "created_at", "rotated_at"]
    list_select_related = ["app"]
    search_fields = ["app__app_name"]
    ordering = ["app__app_name"]
    actions = ["rotate", "revoke"]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = QueueCredentialCreateForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        return ["app"] if obj is None else ["app", "redis_user", "stream", "dead_letters", "created_at", "rotated_at"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.get_fields(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # revoked with the action, which removes the Redis user too

    def save_model(self, request, obj, form, change):
        if change:
            return  # nothing on the page is editable
        try:
            credential, password = queue_credential_create(app=form.cleaned_data["app"])
        except CredentialExists as exc:
            self.message_user(request, str(exc), messages.ERROR)
            obj.pk = QueueCredential.objects.get(app=form.cleaned_data["app"]).pk
            return
        obj.pk = credential.pk
        self._password_shown(request, credential, password)

    def log_addition(self, request, obj, message):
        return super().log_addition(request, QueueCredential.objects.get(pk=obj.pk), message)

    def _password_shown(self, request, credential: QueueCredential, password: str) -> None:
        db = f" -n {queue_db()}" if queue_db() else ""
        self.message_user(request, format_html(
            "Queue credential of {}: user <code>{}</code>, password <code class='new-queue-password'>{}</code> — copy "
            "it now; it is shown only this once. <code>redis-cli --user {} --pass …{} XADD {} '*' to {}-1002 "
            "content hello</code>", credential.app.app_name, acl_user(credential.app.app_name), password,
            acl_user(credential.app.app_name), db, intake_key(credential.app.app_name), credential.app.app_name,
        ), messages.WARNING)

    @admin.display(description="Redis user")
    def redis_user(self, obj: QueueCredential) -> str:
        return acl_user(obj.app.app_name)

    @admin.display(description="stream")
    def stream(self, obj: QueueCredential) -> str:
        return intake_key(obj.app.app_name)

    @admin.display(description="newest dead letters")
    def dead_letters(self, obj: QueueCredential) -> str:
        try:
            newest = queue_client().xrevrange(dead_key(obj.app.app_name), count=5)
        except redis.RedisError:
            return "(Redis unavailable)"
        if not newest:
            return "none"
        return format_html_join("", "<div><code>{}</code> {}</div>", (
            (fields.get(b"entry", b"").decode(errors="replace"), fields.get(b"reason", b"").decode(errors="replace"))
            for _, fields in newest))

    @admin.action(description="Rotate the selected credentials (new passwords, shown once)", permissions=["change"])
    def rotate(self, request, queryset):
        for credential in queryset.select_related("app"):
            try:
                rotated, password = queue_credential_rotate(app=credential.app)
            except NoCredential as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            self._password_shown(request, rotated, password)

    @admin.action(description="Revoke the selected credentials (their Redis users are deleted)",
                  permissions=["change"])
    def revoke(self, request, queryset):
        apps = [credential.app for credential in queryset.select_related("app")]
        for app in apps:
            try:
                queue_credential_revoke(app=app)
            except NoCredential:
                pass  # revoked meanwhile
        self.message_user(request, f"Revoked {len(apps)} queue credential(s).")
