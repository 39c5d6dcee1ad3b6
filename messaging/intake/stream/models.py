"""The queue intake's table (registered through messaging.models)."""

from __future__ import annotations

from django.db import models

from apps_registry.models import ClientApp


class QueueCredential(models.Model):
    """An app's Redis ACL user for its intake stream (names.acl_user): at most one per app. Only the
    password's SHA-256 is kept, as Redis takes it (`#<hex>`): the password is shown once, when made.
    Redis forgets ACL users when it restarts without an ACL file; they are re-applied from these rows
    (credentials.queue_acl_sync: at a consumer's start and reconnect, and by beat)."""

    app = models.OneToOneField(ClientApp, on_delete=models.CASCADE, related_name="+")
    password_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "queue credential"
        constraints = [
            models.CheckConstraint(condition=models.Q(password_sha256__regex=r"^[0-9a-f]{64}$"),
                                   name="queuecredential_sha256_hex"),
        ]

    def __str__(self) -> str:
        return f"queue credential of app {self.app_id}"
