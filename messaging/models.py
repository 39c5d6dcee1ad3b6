"""Messages, per-recipient mailboxes and the delivery state machine.

Guarantees:
- A RELIABLE message and all of its Delivery rows are written in one transaction, before anything
  is acknowledged or routed (messaging.services.persist).
- Each recipient has a Mailbox whose `last_seq` hands out gap-free, strictly increasing sequence
  numbers: the upsert that bumps it holds the mailbox row lock until the transaction ends, so a
  rolled-back message leaves no hole and two concurrent messages cannot take the same number.
- (app, sender, client_message_id) is unique: a retried send with the same clientMessageId is
  stored once.
- Delivery states move pending -> sent -> delivered, with retrying / dead / expired as side exits;
  every move is a function in messaging.services.deliveries and stamps its time.
FAST messages never reach these tables.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps_registry.models import ClientApp


class MessageKind(models.TextChoices):
    DIRECT = "direct", "MESSAGE"
    GROUP = "group", "GROUP_MESSAGE"
    CONFIRMATION = "confirmation", "MESSAGE_CONFIRMATION"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    DELIVERED = "delivered"
    RETRYING = "retrying"
    DEAD = "dead"
    EXPIRED = "expired"


UNDELIVERED_STATES = (DeliveryState.PENDING, DeliveryState.SENT, DeliveryState.RETRYING)


class Message(models.Model):
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="messages")
    sender = models.CharField(max_length=96)
    kind = models.CharField(max_length=16, choices=MessageKind.choices, default=MessageKind.DIRECT)
    content = models.TextField()
    reference = models.CharField(max_length=256, blank=True, default="")
    confirmation_requested = models.BooleanField(default=False)
    # NULL, not "": the unique constraint must not treat "no id" as one shared id.
    client_message_id = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    origin_domain = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(db_index=True)  # serves the admin's date ordering and expiry

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["app", "sender", "client_message_id"],
                condition=Q(client_message_id__isnull=False),
                name="message_client_id_once_per_sender",
            ),
        ]
        indexes = [
            # The console's "messages of this sender" search, newest first.
            models.Index(fields=["sender", "-id"], name="message_sender_recent"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.get_kind_display()} from {self.sender}"


class Mailbox(models.Model):
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+")
    user_id = models.CharField(max_length=96)
    last_seq = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["app", "user_id"], name="mailbox_one_per_user")]

    def __str__(self) -> str:
        return f"mailbox of {self.user_id} (seq {self.last_seq})"


class Delivery(models.Model):
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="deliveries")
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+")
    recipient = models.CharField(max_length=96)
    seq = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(fields=["app", "recipient", "seq"], name="delivery_seq_unique_in_mailbox"),
        ]
        indexes = [
            # FETCH_MISSING_MESSAGES: a recipient's undelivered rows in mailbox order, and the count left.
            models.Index(
                fields=["app", "recipient", "seq"], name="delivery_undelivered_mailbox",
                condition=Q(state__in=["pending", "sent", "retrying"]),
            ),
            # The retry sweep: rows whose timer ran out.
            models.Index(
                fields=["next_attempt_at"], name="delivery_retry_due",
                condition=Q(state__in=["sent", "retrying"]),
            ),
            # The console's "deliveries to this recipient" search, newest first (any state).
            models.Index(fields=["recipient", "-id"], name="delivery_recipient_recent"),
            # The dead-letter queue in the admin and the API, newest first. Deliberately partial:
            # a general (state, ...) index tempted the planner into scanning every undelivered
            # row for batch updates by id (see messaging.services.deliveries).
            models.Index(fields=["-dead_at"], name="delivery_dead_letters", condition=Q(state="dead")),
        ]

    def __str__(self) -> str:
        return f"#{self.message_id} -> {self.recipient} [{self.state}]"


class DeadLetter(Delivery):
    """The dead-letter queue: deliveries that used up their attempts (admin console view)."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
