"""A home takes its users back from a holder gone silent (issue 46: a holder killed while handing
them back left them refused everywhere, 18-26 s in fault runs, until it was restarted and finished).

At the home, with each `takeover_watch` look: a holder of its users silent here, its link from here
down, and a third domain agreeing it is silent (`liveness.witnesses_agree`, the takeover's witness
the other way round), each for

- `fence_seconds()` while the holder is handing the users back (its record says so:
  `records._returning_news`): it admits none of them since it began (its fence), so nobody serves
  them; taking them back sooner only makes the holder's last changes come later;
- FAILOVER_SECONDS otherwise, the threshold a standby takes a home over at: a holder cut off from
  the network that long has stopped admitting the users it holds and closed their connections
  (`fence`, `take._fence_close`), as a home does before its standby takes it over.

The home then writes the record's next epoch (held no more), tells it around at once, and takes its
users as from a hand-back (`take.given_back`, and `take._late_reorder` for two minutes). Every
other domain takes the record (its holder is the home's standby: `records.record_refusal`); the
holder does not (only it records which users it holds). When it is back it finishes the hand-back
as ever: it sends the home what is left of its feed (merged there like any change of a holder's:
an ACK is never undone, a message is stored once), re-seeds its copy, clears the mailboxes, and
records the hand-back with a later epoch. What waited on other domains' links to the holder
meanwhile reaches the home through it, late: each origin's order holds it at the home
(messaging.federation.order), and the holder forwards what it stores after its hand-back.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps_registry.models import Takeover
from foundation import handoff
from messaging.federation.takeover.fence import cut_off, fence_seconds
from messaging.federation.takeover.liveness import silent_here_for, witnesses_agree
from messaging.federation.takeover.records import changed_here, record_returned

log = logging.getLogger(__name__)


def reclaim_seconds(returning: bool) -> float:
    """How long a holder of this domain's users must be silent before it takes them back."""
    return fence_seconds() if returning else settings.FAILOVER_SECONDS


def reclaim_watch() -> dict[str, str]:
    """At a home: take its users back from each holder silent long enough (keyed "<holder> holds")."""
    here = settings.DOMAIN_NAME
    out: dict[str, str] = {}
    held = list(Takeover.objects.filter(home__name=here, held=True)
                .values_list("holder__name", "returning_since").order_by("holder__name"))
    if not held or cut_off():  # (cut off: it hears nobody, and admits none of them either)
        return out
    for holder, returning_since in held:
        threshold = reclaim_seconds(returning_since is not None)
        if not silent_here_for(holder, threshold):
            continue
        agreed, why = witnesses_agree(holder, threshold)
        out[f"{holder} holds"] = take_back(holder, reason=why)["state"] if agreed else f"not taken back: {why}"
    return out


def take_back(holder: str, *, reason: str) -> dict:
    """Serve this domain's users `holder` holds here again: the record's next epoch, held no more."""
    here = settings.DOMAIN_NAME
    with transaction.atomic():
        current = Takeover.objects.select_for_update().filter(home__name=here, holder__name=holder).first()
        if current is None or not current.held:
            return {"state": "not held"}
        returning = current.returning_since is not None
        record_returned(current, reason=f"taken back by {here}: {holder} "
                                        f"{'silent while handing back' if returning else 'silent'}"[:300],
                        reclaimed_at=timezone.now())  # (its users' messages from elsewhere wait behind it: order)
        changed_here(here, holder, False)  # (given_back, after the commit)
        transaction.on_commit(handoff.gossip_now)
    log.warning("%s took its users back from %s, silent%s (%s)", here, holder,
                " while handing them back" if returning else "", reason)
    return {"state": "taken back"}
