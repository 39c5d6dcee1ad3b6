"""Tables of the event exchange (registered through messaging.models)."""

from __future__ import annotations

from django.db import models

from apps_registry.models import ClientApp


class Follow(models.Model):
    """`follower` follows `followee` in an app's event exchange (numeric user ids, as the event
    source names them). Written only by the engine, in batches, in the same transaction that moves
    the app's ExchangeState.applied_seq: the graph is always exactly that of the events up to it."""

    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    follower = models.BigIntegerField()
    followee = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Also serves "whom does X follow" (the REST API, the admin's search).
            models.UniqueConstraint(fields=["app", "follower", "followee"], name="follow_once"),
        ]
        indexes = [
            # "Who follows X": an S event's recipients at start-up, the REST API's followers list.
            models.Index(fields=["app", "followee", "follower"], name="follow_followers"),
        ]

    def __str__(self) -> str:
        return f"{self.follower} follows {self.followee}"


class ExchangeState(models.Model):
    """An app's exchange: every event up to `applied_seq` is applied (and in the graph); a gap
    (the first missing sequence number, since when, how many events wait behind it) is reported
    here as well as in the log and the metrics."""

    app = models.OneToOneField(ClientApp, on_delete=models.CASCADE, related_name="+")
    applied_seq = models.BigIntegerField(default=0)
    gap_seq = models.BigIntegerField(null=True, blank=True)
    gap_since = models.DateTimeField(null=True, blank=True)
    held = models.PositiveIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)  # sequence numbers given up after the gap timeout
    malformed = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "event exchange"

    def __str__(self) -> str:
        return f"exchange of app {self.app_id} at {self.applied_seq}"
