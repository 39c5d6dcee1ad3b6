"""Tables of the domain network (registered through messaging.models)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from messaging.channels.models import CHANNEL_NAME_MAX, ChannelMessage


class LinkHealth(models.Model):
    """This domain's live view of its link to one neighbour: up, or down since when; the last error;
    what was forwarded each way. Keyed by the neighbour's name, not the DomainLink row, so a config
    pull that recreates links keeps the history. Written by calls and probes (messaging.federation.links);
    `retry_at` is when the link's queue may be tried again after a failure (backoff), and
    `last_failure_kind` what the last failure was: the neighbour out of reach (no answer, a probe's
    or a call's), or a call it answered with an error. A probe that is answered clears the backoff
    of the first (the neighbour is back), never that of the second (it answers pings but fails the
    link's calls: they wait for the retry their failure earned). `blocked` is what the neighbour
    told about its own onward links (messaging.federation.links.route_blocked)."""

    peer = models.CharField(max_length=64, unique=True)
    up = models.BooleanField(default=True)
    down_since = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    last_ok_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)  # in a row; 0 once a call succeeds
    retry_at = models.DateTimeField(null=True, blank=True)
    last_failure_kind = models.CharField(max_length=8, blank=True, default="", db_default="",
                                         choices=[("reach", "out of reach"), ("call", "a call answered with an error")])
    forwarded_out = models.BigIntegerField(default=0)
    forwarded_in = models.BigIntegerField(default=0)
    # Domains this neighbour said it has no way on to (it refused or handed back an item for them):
    # {domain: unix time until which items for it are routed another way where one exists}.
    blocked = models.JSONField(default=dict, blank=True)
    # Domains this neighbour has no other way to than through here (it sent items for them with
    # `hold`): what it sends for them waits here rather than being handed back. {domain: unix time}.
    holding = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "link health"
        verbose_name_plural = "link health"

    def __str__(self) -> str:
        return f"link to {self.peer} ({'up' if self.up else 'down'})"


class ChannelForward(models.Model):
    """A channel publish on its way to one neighbour (the flood, messaging.federation): one row per
    (publish, neighbour), written in the transaction that stores the publish, gone once the neighbour
    has stored it; a row that used its attempts stays with `dead_at` and the reason."""

    publish = models.ForeignKey(ChannelMessage, on_delete=models.CASCADE, related_name="+")
    peer = models.CharField(max_length=64)
    # The domains the publish passed through, origin first, ending with this one ("domain-01,domain-02"):
    # the next hop's hop count, and the domains it must not be sent back to (messaging.federation.flood).
    path = models.CharField(max_length=800, blank=True, default="", db_default="")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    dead_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["publish", "peer"], name="channel_forward_once_per_peer")]
        indexes = [
            # A link's flood queue in publish order.
            models.Index(fields=["peer", "id"], name="channel_forward_queue", condition=Q(dead_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"publish {self.publish_id} -> {self.peer}"


class ReceiptForward(models.Model):
    """A receipt on its way back to its message's origin domain (messaging.federation.senders.receipts),
    waiting on the link to `peer`, its next hop: written in the transaction that made the delivery
    delivered or dead here (or that took the receipt in, passing through), gone once the neighbour
    has applied it or taken it on. A receipt never dies of attempts: while its link fails it waits,
    counting them, and the console lists it (Link health, Receipts waiting). It never goes back to a
    domain it passed through: where only such a way is left, it waits here (`peer` "")."""

    # The next hop towards origin_domain; "" while no link leads there but back the way the receipt
    # came, or none at all (the sweep looks again).
    peer = models.CharField(max_length=64, blank=True)
    # The domains the receipt passed through, where it was written first, ending with this one
    # ("domain-03,domain-02"): never sent back to one of them, and given up past the hop limit.
    path = models.CharField(max_length=800, blank=True, default="", db_default="")
    origin_domain = models.CharField(max_length=64)
    origin_message_id = models.BigIntegerField()
    recipient = models.CharField(max_length=96)
    state = models.CharField(max_length=16)  # what became of the delivery: delivered or dead
    at = models.DateTimeField()  # when, at the recipient's home
    domain = models.CharField(max_length=64)  # where it happened
    error = models.CharField(max_length=400, blank=True, default="")  # why it died
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # A link's receipt queue in the order the receipts were written.
            models.Index(fields=["peer", "id"], name="receipt_forward_queue"),
        ]

    def __str__(self) -> str:
        return f"{self.state} receipt of {self.origin_domain}:{self.origin_message_id} for {self.recipient} -> {self.peer}"

    def as_payload(self) -> dict:
        return {"origin_domain": self.origin_domain, "origin_message_id": self.origin_message_id,
                "recipient": self.recipient, "state": self.state, "at": self.at.isoformat(),
                "domain": self.domain, "error": self.error, "path": [d for d in self.path.split(",") if d]}


class OrderMark(models.Model):
    """How far the messages one origin domain sent to one recipient homed here have been put into
    the recipient's mailbox, by the origin's own sequence for that recipient (messaging.federation.order):
    the next one expected is `last_seq` + 1. A message that comes before it (by a faster way than
    an earlier one still on its way) waits in HeldInOrder. Written in the transaction that stores
    what the origin sent; never goes back."""

    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+", db_index=False)
    recipient = models.CharField(max_length=96)
    origin_domain = models.CharField(max_length=64)
    last_seq = models.BigIntegerField(default=0)
    held = models.PositiveIntegerField(default=0)  # rows waiting in HeldInOrder (0: nothing to look up)
    # A barrier (messaging.federation.order): until `blocked_until`, or until `blocked_by` (a holder
    # this domain took its users back from while it was silent) has finished its hand-back, every
    # arrival of this origin for this recipient waits, whatever its sequence: a sender homed at that
    # holder sent the recipient earlier messages that are still there.
    blocked_by = models.CharField(max_length=64, blank=True, default="", db_default="")
    blocked_until = models.DateTimeField(null=True, blank=True)
    # A barrier of the other kind, until `blocked_until` too: an arrival of this origin said it comes
    # after `after_origin`'s message `after_seq` to this recipient (a sender's messages from two
    # origins, around a takeover or a hand-back), which has not been put in yet.
    after_origin = models.CharField(max_length=64, blank=True, default="", db_default="")
    after_seq = models.BigIntegerField(null=True, blank=True)
    # ... from this origin's message of this place on: what comes before it goes in as ever (it may be
    # what the other origin's message waits for, around a second takeover: the two would wait on each other)
    after_from = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["app", "recipient", "origin_domain"], name="order_mark_once")]
        # (the sweep and a hand-back look for barriers often; there are seldom any)
        indexes = [models.Index(fields=["blocked_by"], condition=~models.Q(blocked_by=""), name="order_mark_blocked"),
                   models.Index(fields=["after_origin"], condition=~models.Q(after_origin=""), name="order_mark_after")]

    def __str__(self) -> str:
        return f"{self.origin_domain} -> {self.recipient}: up to {self.last_seq}"


class HeldInOrder(models.Model):
    """A message stored here, for a recipient homed here, that came before an earlier one of its
    origin's (a gap in the origin's sequence, OrderMark): not in the mailbox yet. It goes in when the
    gap is filled, or when its wait is over (NETWORK_ORDER_WAIT_SECONDS: the earlier message is taken
    for lost on the way, and arrives late if ever). Stored durably: the neighbour that brought it has
    been told it is stored here."""

    message = models.ForeignKey("messaging.Message", on_delete=models.CASCADE, related_name="+")
    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+", db_index=False)
    recipient = models.CharField(max_length=96)
    origin_domain = models.CharField(max_length=64)
    origin_seq = models.BigIntegerField()
    held_at = models.DateTimeField()

    class Meta:
        verbose_name = "message held in order"
        verbose_name_plural = "messages held in order"
        constraints = [models.UniqueConstraint(fields=["app", "recipient", "origin_domain", "origin_seq"],
                                               name="held_in_order_once")]
        indexes = [models.Index(fields=["held_at"], name="held_in_order_oldest")]

    def __str__(self) -> str:
        return f"{self.origin_domain}#{self.origin_seq} -> {self.recipient} (held)"


class StandbyFeed(models.Model):
    """A change to a delivery of a user homed here who has a standby domain (UserDistribution.standby),
    to be copied there (messaging.federation.standby.copy): written by the database itself, in the
    transaction that made the change (the triggers of migration 0021, so no code path that stores a
    message or moves a delivery's state can forget it), gone once the standby has it. `new`: the
    delivery was appended (its message goes too); otherwise its state changed. A row without a
    delivery is a durable subscription of such a user made (`subscribed`) or ended."""

    standby = models.CharField(max_length=64)
    delivery_id = models.BigIntegerField(null=True, blank=True)
    new = models.BooleanField()
    app_id = models.BigIntegerField(null=True, blank=True)  # a subscription's
    subscriber = models.CharField(max_length=96, blank=True, default="", db_default="")
    channel = models.CharField(max_length=CHANNEL_NAME_MAX, blank=True, default="", db_default="")
    subscribed = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    last_error = models.CharField(max_length=500, blank=True, default="", db_default="")
    # A message one of those users sent to a user homed elsewhere, queued on a link here (`new`) or
    # gone from the link (sent on, dead, routed again): the standby's StandbyOutgoing.
    outgoing = models.BooleanField(default=False, db_default=False)

    class Meta:
        indexes = [models.Index(fields=["standby", "id"], name="standby_feed_queue")]

    def __str__(self) -> str:
        if self.delivery_id is None:
            return f"{self.subscriber} {'subscribed to' if self.subscribed else 'left'} {self.channel} -> {self.standby}"
        return f"{'new' if self.new else 'state of'} delivery {self.delivery_id} -> {self.standby}"


class StandbyCopy(models.Model):
    """A standby's copy of one delivery of a user homed at another domain (`home`), as that domain
    last sent it (messaging.federation.standby.copy): the message and its state. Inert: nothing routes,
    delivers or expires it here; it is what the standby's mailbox for that user starts from when it
    takes the user over."""

    home = models.CharField(max_length=64)
    home_delivery_id = models.BigIntegerField()
    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+", db_index=False)
    recipient = models.CharField(max_length=96)
    seq = models.BigIntegerField()  # in the user's mailbox at the home
    origin_seq = models.BigIntegerField(null=True, blank=True)
    sender = models.CharField(max_length=96)
    kind = models.CharField(max_length=16)
    content = models.TextField()
    reference = models.CharField(max_length=256, blank=True, default="")
    confirmation_requested = models.BooleanField(default=False)
    client_message_id = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001  (as Message)
    origin_domain = models.CharField(max_length=64)  # where the message was stored first
    origin_message_id = models.BigIntegerField()  # its id there
    state = models.CharField(max_length=16)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()  # at the home
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    copied_at = models.DateTimeField()  # when this copy was last written here

    class Meta:
        verbose_name = "standby copy"
        constraints = [
            # A message is one message everywhere by where it was stored first and its id there: the
            # home's copies, the holder's copies back and a forwarded message all meet on it.
            models.UniqueConstraint(fields=["app", "recipient", "origin_domain", "origin_message_id"],
                                    name="standby_copy_once_per_message"),
        ]
        indexes = [models.Index(fields=["app", "recipient", "seq"], name="standby_copy_mailbox")]

    def __str__(self) -> str:
        return f"copy of {self.home}'s delivery {self.home_delivery_id} to {self.recipient} [{self.state}]"


class StandbySubscription(models.Model):
    """A standby's copy of a durable subscription of a user homed at another domain (`home`)
    (messaging.federation.standby.copy). Inert, like StandbyCopy."""

    home = models.CharField(max_length=64)
    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+", db_index=False)
    subscriber = models.CharField(max_length=96)
    channel = models.CharField(max_length=CHANNEL_NAME_MAX)
    copied_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["app", "subscriber", "channel"], name="standby_subscription_once")]

    def __str__(self) -> str:
        return f"copy of {self.subscriber} -> {self.channel} (home {self.home})"


class DomainHeard(models.Model):
    """When this domain last heard that `domain` was alive: a newer `version` (that domain's own
    clock, told in the network's gossip, messaging.federation.takeover.take) arrived at `heard_at` (this
    domain's clock, so no two clocks are compared). What a standby and its witnesses judge a home's
    loss by, whatever path the gossip took."""

    domain = models.CharField(max_length=64, unique=True)
    version = models.BigIntegerField()
    heard_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.domain} heard at {self.heard_at:%H:%M:%S}"


class StandbyOutgoing(models.Model):
    """A standby's copy of a message a user homed at `home` sent to a user homed elsewhere, while it
    waits on one of the home's links (messaging.federation.standby.outgoing_copy): gone once the home sent it
    on. Inert until a takeover: then the standby sends on, as the home would have, what the lost home
    had not sent yet, before the user's own next messages from here (one sender's messages to one
    recipient stay in order)."""

    home = models.CharField(max_length=64)
    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+", db_index=False)
    origin_message_id = models.BigIntegerField()  # the message's id at the home (its origin)
    recipient = models.CharField(max_length=96)
    origin_seq = models.BigIntegerField(null=True, blank=True)  # its place among the home's messages to the recipient
    sender = models.CharField(max_length=96)
    kind = models.CharField(max_length=16)
    content = models.TextField()
    reference = models.CharField(max_length=256, blank=True, default="")
    confirmation_requested = models.BooleanField(default=False)
    copied_at = models.DateTimeField()

    class Meta:
        verbose_name = "standby copy of an outgoing message"
        constraints = [models.UniqueConstraint(fields=["home", "origin_message_id", "recipient"],
                                               name="standby_outgoing_once")]

    def __str__(self) -> str:
        return f"{self.home}'s message {self.origin_message_id} to {self.recipient}, waiting there"


class OrderAfter(models.Model):
    """At an origin: what the messages it stores first from users homed at `senders_home` to
    `recipient` must follow, at the recipient's home (messaging.federation.order): `origin_domain`'s
    message `seq` to that recipient. Each forwarded message of those says so (`after` in the payload),
    until `until` (none: for as long as the row is here).

    Two kinds, for a sender whose messages to one recipient leave from two origins:
    - at a standby, for its home's users (`senders_home` = `origin_domain` = the home): the highest
      place among the home's messages to the recipient its outgoing copy showed
      (messaging.federation.standby.outgoing_copy). What those users send from here while it holds
      them goes in after what the home had sent or queued for the recipient;
    - at a home its holder gave its users back to (`senders_home` = here, `origin_domain` = the
      holder): the holder's count for the recipient at the hand-back, for NETWORK_ORDER_WAIT_SECONDS.
      What the users send from home goes in after what they sent from the holder."""

    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+", db_index=False)
    recipient = models.CharField(max_length=96)
    senders_home = models.CharField(max_length=64)
    origin_domain = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "order to follow"
        verbose_name_plural = "orders to follow"
        constraints = [models.UniqueConstraint(fields=["app", "recipient", "senders_home", "origin_domain"],
                                               name="order_after_once")]

    def __str__(self) -> str:
        return f"{self.senders_home}'s users -> {self.recipient}: after {self.origin_domain}'s #{self.seq}"
