"""Channels and topology: a channel is an address many users can subscribe to (the signal seed's
Address-to-Address topology). `@<userId>` is a user's own channel: subscribing user A to `@B` is "A
follows B". Tables of the messaging app (registered through messaging.models).
"""

from __future__ import annotations

from django.db import models

from apps_registry.models import ClientApp

# The longest channel name (messaging.channels.names): a Pusher channel's, `pusher.` and 200 characters
# each escaped in at most two.
CHANNEL_NAME_MAX = len("pusher.") + 400


class Channel(models.Model):
    """A channel of one app. `last_offset` hands out gap-free, increasing offsets: the upsert that
    bumps it holds the channel row lock until the transaction ends (as a mailbox's `last_seq`)."""

    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=CHANNEL_NAME_MAX)
    last_offset = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["app", "name"], name="channel_name_once_per_app")]

    def __str__(self) -> str:
        return f"{self.name} (offset {self.last_offset})"


class ChannelMessage(models.Model):
    """A channel's history: what was published, in offset order, kept for the app's retention.
    Retention removes the oldest first, so the offsets that remain have no holes."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="history", db_index=False)
    offset = models.BigIntegerField()
    content = models.TextField()
    publisher = models.CharField(max_length=128, blank=True, default="")
    # A publish that came from another domain (messaging.federation): where it was first published and
    # its offset there. Offsets are each domain's own; channel_publish_forwarded_once stores a
    # publish once per domain however often the flood brings it.
    origin_domain = models.CharField(max_length=64, blank=True, default="", db_default="")
    origin_offset = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Also serves history reads: a channel's messages after an offset, in order.
            models.UniqueConstraint(fields=["channel", "offset"], name="channel_message_offset_once"),
            models.UniqueConstraint(fields=["channel", "origin_domain", "origin_offset"],
                                    condition=models.Q(origin_offset__isnull=False),
                                    name="channel_publish_forwarded_once"),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id}@{self.offset}"


class Subscription(models.Model):
    """A durable subscription a server made: `subscriber` gets what is published on `channel`
    wherever and whenever it is connected (live connections join the channel on connect)."""

    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    subscriber = models.CharField(max_length=96)
    channel = models.CharField(max_length=CHANNEL_NAME_MAX)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Also serves "the channels of this user" (what a connection joins on connect).
            models.UniqueConstraint(fields=["app", "subscriber", "channel"], name="subscription_once"),
        ]
        indexes = [
            # "The subscribers of this channel" (the REST API's member list).
            models.Index(fields=["app", "channel", "subscriber"], name="subscription_members"),
        ]

    def __str__(self) -> str:
        return f"{self.subscriber} -> {self.channel}"
