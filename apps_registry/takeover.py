"""Who serves a domain's users: the registry's record of a takeover (messaging.federation.takeover.take).

One row per home domain and standby that has ever taken it over, kept after the hand-back (the
console shows the last takeover and hand-back with their times). While `held`, the users of the
ranges homed at `home` whose standby is `holder` are served by `holder`, and only those: the app
snapshots (apps_registry.selectors) name the holder as where they live, so logins are redirected
there and messages for them routed there. A range with another standby is that standby's to take
over (two standbys of one home may each hold their own ranges at once); a range with none waits for
its home.

Every domain holds the same rows: the holder writes them, and the network's gossip carries them to
every domain; a row with a higher `epoch` replaces a lower one wherever it arrives, so every domain
ends with the holder's last word however the gossip travelled. Never written by the meta pull (it is
the network's state, not its configuration).
"""

from __future__ import annotations

from django.db import models


class Takeover(models.Model):
    home = models.ForeignKey("apps_registry.Domain", on_delete=models.CASCADE, related_name="takeovers")
    holder = models.ForeignKey("apps_registry.Domain", on_delete=models.CASCADE, related_name="+")
    held = models.BooleanField(help_text="The holder serves the home's users it stands by for now.")
    epoch = models.PositiveBigIntegerField(help_text="Grows with every change; the higher wins everywhere.")
    taken_at = models.DateTimeField()
    returned_at = models.DateTimeField(null=True, blank=True)
    manual = models.BooleanField(default=False, help_text="Asked for by an operator (planned maintenance): "
                                                          "handed back only when asked for too.")
    reason = models.CharField(max_length=300, blank=True, default="")
    # When this domain learned the row's current state (its own clock; not told around): a held home
    # keeps the rows it had stored before then parked, and forwards those stored since to the holder.
    learned_at = models.DateTimeField(null=True, blank=True)
    # At the holder (its own clock; not told around): since when it is handing the users back. From
    # then on it admits none of them (they retry) and has closed their connections, so no ACK reaches
    # it in the moment it gives their mailboxes up (one read there would be lost at home).
    returning_since = models.DateTimeField(null=True, blank=True)
    # At the home (its own clock; not told around): when it took its users back from this holder gone
    # silent (messaging.federation.takeover.reclaim), until the holder's own later record comes (it is
    # back and has finished its hand-back: what it stored for those users is home). Meanwhile what
    # the holder's users send those users from elsewhere waits behind it (messaging.federation.order,
    # "barriers"): their earlier messages are on the silent holder.
    reclaimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Only a holder writes its row (take_over, hand_back), and the gossip replaces a row by
            # the higher epoch: one row per home and holder, so each standby's word is its own.
            models.UniqueConstraint(fields=["home", "holder"], name="takeover_once_per_home_and_holder"),
        ]

    def __str__(self) -> str:
        return f"{self.home.name} {'held by' if self.held else 'handed back by'} {self.holder.name}"
