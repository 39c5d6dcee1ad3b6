"""Messages, per-recipient mailboxes and the delivery state machine.

Guarantees:
- A RELIABLE message and all of its Delivery rows are written in one transaction, before anything
  is acknowledged or routed (messaging.core.store).
- Each recipient has a Mailbox whose `last_seq` hands out gap-free, strictly increasing sequence
  numbers: the upsert that bumps it holds the mailbox row lock until the transaction ends, so a
  rolled-back message leaves no hole and two concurrent messages cannot take the same number.
- (app, sender, client_message_id) is unique: a retried send with the same clientMessageId is
  stored once.
- A confirmation confirms one message once: `confirms` is unique. It is a column of its own, not
  a clientMessageId, so no client input can collide with it.
- Delivery states move pending -> sent -> delivered, with retrying / dead / expired as side exits;
  every move is one conditional statement in messaging.core.delivery and stamps its time.
  State names live here only: SQL is built from the tuples below (`states_sql`), and the partial
  indexes use the same tuples, so a new state cannot leave a query or an index behind.
- A mailbox has no holes: delivery rows are never deleted one by one (the admin cannot delete
  them); only retention removes whole prefixes.
FAST messages never reach these tables. The channels' and webhooks' tables are declared in their
rooms (messaging.channels.models, messaging.webhooks.models) and registered here.

What `next_attempt_at` (the row's timer) means depends on the state:
- pending: NULL = parked in the mailbox, waiting for a fetch; a time = the routing deadline (set
  when stored, or the lease of a sweep hand-out): once it passes, the row is routed again, so a
  routing task lost with a crashed process never strands a message.
- sent: the confirmation deadline of the push (or of an ACK-mode fetch); once it passes, the
  attempt failed: `attempts` + 1, then retrying with backoff or dead.
- retrying: when the next attempt is due (and, once handed to routing, its lease); NULL = given
  back by a connection that closed before its client had it: waits for the recipient's next
  ACK-mode connection (pushed again on connect) or a fetch.
`attempts` counts failed attempts only: a recipient being offline, a connection closing before it
read or acknowledged, a node dying or Redis being away are not the recipient's failures.
`claim` is the token of the current claim of a `sent` row (a routing task or an ACK-mode fetch);
park, release and fail name it, so a late actor never moves a row someone else has claimed since.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps_registry.models import ClientApp


class MessageKind(models.TextChoices):
    DIRECT = "direct", "MESSAGE"
    GROUP = "group", "GROUP_MESSAGE"
    CONFIRMATION = "confirmation", "MESSAGE_CONFIRMATION"
    # A request's outcome (messaging.requests), to the client that asked, and a server's request to
    # a client. `reference` holds their request's ids as JSON (messaging.requests.outcome.meta).
    RESOLVE = "resolve", "RESOLVE"
    REJECT = "reject", "REJECT"
    SERVER_REQUEST = "server_request", "SERVER_REQUEST"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    DELIVERED = "delivered"
    RETRYING = "retrying"
    DEAD = "dead"
    EXPIRED = "expired"
    # A recipient homed in another domain (messaging.federation): queued on the link to `forward_to`,
    # then stored by that domain (which takes it on from there) until the home domain reports back
    # delivered (or dead). Neither is in the mailbox: the recipient never connects here.
    FORWARDING = "forwarding"
    FORWARDED = "forwarded"


# The mailbox: what FETCH_MISSING_MESSAGES returns and counts, and what may still move.
UNDELIVERED_STATES: tuple[str, ...] = (DeliveryState.PENDING.value, DeliveryState.SENT.value,
                                      DeliveryState.RETRYING.value)
# What a routing task (or an ACK-mode fetch) may claim.
CLAIMABLE_STATES: tuple[str, ...] = (DeliveryState.PENDING.value, DeliveryState.RETRYING.value)
# What a confirmation (a written frame, an ACK) may move to delivered: a late ACK of a dead letter
# still counts.
DELIVERABLE_STATES: tuple[str, ...] = (*UNDELIVERED_STATES, DeliveryState.DEAD.value)
# Rows retention ends.
EXPIRABLE_STATES = UNDELIVERED_STATES


def states_sql(states: tuple[str, ...] | str) -> str:
    """A state or a tuple of states as SQL text: `'sent'` or `('pending', 'sent')`.

    Literal on purpose (not a bound parameter): the planner matches it against the partial indexes'
    predicates, which are built from the same tuples.
    """
    if isinstance(states, str):
        return f"'{DeliveryState(states).value}'"
    return "(" + ", ".join(f"'{DeliveryState(s).value}'" for s in states) + ")"


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
    # A message that came from another domain (messaging.federation): its id in its origin domain (NULL
    # for one stored here first; message_forwarded_once makes an (origin domain, id) stored once), the
    # domains it passed through, origin first ("domain-01,domain-02"), and, for a confirmation, the
    # message it confirms as "<origin domain>:<id there>" where that message has no copy here.
    origin_message_id = models.BigIntegerField(null=True, blank=True)
    forward_path = models.CharField(max_length=800, blank=True, default="", db_default="")
    confirms_origin = models.CharField(max_length=100, blank=True, default="", db_default="")
    # A forwarded message that must follow another origin's message to a recipient at the
    # recipient's home: {recipient: [origin domain, seq]} as its origin sent it (`after`,
    # messaging.federation.order), carried on unchanged. NULL for nearly all.
    order_after = models.JSONField(null=True, blank=True)
    # Set on MESSAGE_CONFIRMATIONs only: the message this one confirms (at most one confirmation per
    # message: message_confirmed_once, partial so that ordinary messages add no index entry).
    confirms = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                                 db_index=False)
    created_at = models.DateTimeField(db_index=True)  # serves the admin's date ordering and expiry

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["app", "sender", "client_message_id"],
                condition=Q(client_message_id__isnull=False),
                name="message_client_id_once_per_sender",
            ),
            # Also what a confirmations' cascade looks its rows up by.
            models.UniqueConstraint(fields=["confirms"], condition=Q(confirms__isnull=False),
                                    name="message_confirmed_once"),
            # A forwarded message is stored once per domain, however often a hop repeats the call.
            # Also what receipts and confirmations find a domain's copy by.
            models.UniqueConstraint(fields=["origin_domain", "origin_message_id"],
                                    condition=Q(origin_message_id__isnull=False), name="message_forwarded_once"),
        ]
        indexes = [
            # The console's "messages of this sender" search, newest first.
            models.Index(fields=["sender", "-id"], name="message_sender_recent"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.get_kind_display()} from {self.sender}"


class Mailbox(models.Model):
    # No index of its own: mailbox_one_per_user leads with the app.
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    user_id = models.CharField(max_length=96)
    last_seq = models.BigIntegerField(default=0)
    # How many of the mailbox's messages were stored here first (not forwarded from another domain):
    # their Delivery.origin_seq, by which the recipient's home, where that is another domain, puts
    # them in order (messaging.federation.order). Gap-free, as last_seq is.
    origin_last_seq = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["app", "user_id"], name="mailbox_one_per_user")]

    def __str__(self) -> str:
        return f"mailbox of {self.user_id} (seq {self.last_seq})"


class Delivery(models.Model):
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="deliveries")
    # No index of its own: delivery_seq_unique_in_mailbox leads with the app (every index on this
    # table is written again by each state change, so none is kept twice).
    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    recipient = models.CharField(max_length=96)
    seq = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)  # the row's timer (see the module docstring)
    claim = models.BigIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    # The neighbouring domain a forwarding/forwarded delivery was queued on (messaging.federation).
    forward_to = models.CharField(max_length=64, blank=True, default="", db_default="")
    # A dead letter re-queued by an operator, on its way to a neighbour: the neighbour revives its own
    # dead copy rather than taking the call for a duplicate (messaging.federation.inbound); cleared once sent.
    revive = models.BooleanField(default=False, db_default=False)
    # The message's place among the messages to this recipient stored first at its origin domain
    # (Mailbox.origin_last_seq there): what the recipient's home puts each origin's messages in order
    # by (messaging.federation.order). Drawn here for a message stored here first, carried in (and on)
    # for one that came from another domain; NULL for rows older than that order, or from a domain
    # that does not send it.
    origin_seq = models.BigIntegerField(null=True, blank=True)
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
                condition=Q(state__in=UNDELIVERED_STATES),
            ),
            # The sweep: undelivered rows whose timer ran out. Parked rows (no timer) stay out, so
            # the mailboxes of offline users never weigh on it.
            models.Index(
                fields=["next_attempt_at"], name="delivery_timer_due",
                condition=Q(state__in=UNDELIVERED_STATES, next_attempt_at__isnull=False),
            ),
            # The console's "deliveries to this recipient" search, newest first (any state).
            models.Index(fields=["recipient", "-id"], name="delivery_recipient_recent"),
            # The dead-letter queue in the admin and the API, newest first. Deliberately partial:
            # a general (state, ...) index tempted the planner into scanning every undelivered
            # row for batch updates by id (see messaging.core.delivery.sql).
            models.Index(fields=["-dead_at"], name="delivery_dead_letters", condition=Q(state=DeliveryState.DEAD.value)),
            # A link's forwarding queue, each recipient's rows in mailbox order (messaging.federation):
            # partial, so only what waits on a link is in it.
            models.Index(fields=["forward_to", "app", "recipient", "seq"], name="delivery_link_queue",
                         condition=Q(state=DeliveryState.FORWARDING.value)),
            # What waits on any link, each recipient's oldest first: a new row queues behind its
            # recipient's waiting rows (messaging.federation.senders.queue) and an intermediate domain takes a
            # message behind them (selectors.WaitingHere). Without it that probe walked the
            # recipient's whole mailbox history (delivery_seq_unique_in_mailbox, filtered by state).
            models.Index(fields=["app", "recipient", "seq"], name="delivery_waiting",
                         condition=Q(state=DeliveryState.FORWARDING.value)),
            # What is in flight further on, each recipient's newest first: the way its next message
            # follows so as not to overtake it (messaging.federation.senders.queue.detours_of). Partial: a
            # recipient with a long history of delivered rows costs one probe, not a scan.
            models.Index(fields=["app", "recipient", "-seq"], name="delivery_in_flight",
                         condition=Q(state=DeliveryState.FORWARDED.value)),
        ]

    def __str__(self) -> str:
        return f"#{self.message_id} -> {self.recipient} [{self.state}]"


class DeadLetter(Delivery):
    """The dead-letter queue: deliveries that used up their attempts (admin console view)."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"


# --- the server REST API ------------------------------------------------------------------------


class IdempotencyKey(models.Model):
    """A server's `Idempotency-Key` on a send, kept for API_IDEMPOTENCY_HOURS (messaging.core.idempotency).

    (app, key) is unique: of two requests with one key, the database lets exactly one claim it, in
    the same transaction as its send, so a second message can never be stored under that key. The
    answer is stored with the claim; `fingerprint` (a digest of the method, path and body) tells a
    true retry from another request reusing the key.
    """

    app = models.ForeignKey(ClientApp, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # Also serves the lookup of a retried key.
            models.UniqueConstraint(fields=["app", "key"], name="idempotency_key_once_per_app"),
        ]
        indexes = [
            # The expiry task's delete of keys older than their lifetime.
            models.Index(fields=["created_at"], name="idempotency_key_expiry"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status_code})"


# The tables declared in messaging's rooms belong to this app: importing them registers them.
from messaging.channels.models import Channel, ChannelMessage, Subscription  # noqa: E402
from messaging.exchange.models import ExchangeState, Follow  # noqa: E402
from messaging.federation.models import (  # noqa: E402
    ChannelForward,
    HeldInOrder,
    LinkHealth,
    OrderAfter,
    OrderMark,
    ReceiptForward,
    StandbyCopy,
    StandbyFeed,
    StandbySubscription,
)
from messaging.intake.stream.models import QueueCredential  # noqa: E402
from messaging.requests.models import ClosedSession, Request  # noqa: E402
from messaging.webhooks.models import (  # noqa: E402
    WEBHOOK_ALL_EVENTS,
    WEBHOOK_OPEN_STATES,
    WEBHOOK_SUBSCRIBABLE_EVENTS,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    WebhookState,
    webhook_events_all,
    webhook_secret_new,
    webhook_states_sql,
)

__all__ = [
    "CLAIMABLE_STATES", "ClosedSession", "DELIVERABLE_STATES", "EXPIRABLE_STATES", "UNDELIVERED_STATES", "WEBHOOK_ALL_EVENTS",
    "WEBHOOK_OPEN_STATES", "WEBHOOK_SUBSCRIBABLE_EVENTS", "Channel", "ChannelForward", "ChannelMessage", "DeadLetter", "Delivery",
    "DeliveryState", "ExchangeState", "Follow", "HeldInOrder", "IdempotencyKey", "LinkHealth", "Mailbox", "Message",
    "MessageKind", "OrderAfter", "OrderMark", "QueueCredential", "ReceiptForward", "Request", "StandbyCopy", "StandbyFeed", "StandbySubscription",
    "Subscription", "WebhookDelivery",
    "WebhookEndpoint", "WebhookEvent", "WebhookState", "states_sql", "webhook_events_all", "webhook_secret_new",
    "webhook_states_sql",
]
