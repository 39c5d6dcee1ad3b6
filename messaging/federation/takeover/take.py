"""A standby domain takes its home's users over when the home is lost, and hands them back (issue 27).

Who serves a home's users is the registry's Takeover row of the home and a standby
(apps_registry.takeover): while `held`, the app snapshots name the holder where the users of the
ranges it stands by for live, so every domain redirects their logins there and routes their
messages there. A standby takes over exactly those ranges (the copy it holds is of them alone): a
range with another standby is that one's to take, and one with none waits for its home.

Liveness. Every domain tells its neighbours, with each presence gossip round (every
PRESENCE_GOSSIP_SECONDS), its own clock and every other domain's last clock it heard, and the
Takeover rows it holds (messaging.federation.takeover.records). A domain records when it first heard each newer clock of
each domain (DomainHeard, by its own clock): "silent for" is how long no newer word of a domain came,
by whatever path (messaging.federation.takeover.liveness). The Takeover row with the higher epoch wins wherever it arrives,
if the neighbour that tells it may (`takeover_records.record_refusal`: its holder is the home's standby and not the
receiver, its epoch not ahead of the receiver's clock); a record refused is named in the answer.

Takeover (`takeover_watch`, beat every TAKEOVER_WATCH_SECONDS, at every domain that is a standby):
the home has been silent here for FAILOVER_SECONDS and its link from here is down for as long, and a
third domain (a neighbour of this one, asked at POST /internal/v1/witness) agrees it has been silent
there too, while none says it heard the home since. With only the home-standby link broken the home
is still heard through the others, so the standby never takes over. The holder then, in one
transaction, records the takeover and merges the copies it holds (StandbyCopy, StandbySubscription)
into its own mailboxes (messaging.federation.standby.mailbox_merge), and tells its neighbours at once.

While it holds them, the changes it makes to their mailboxes are fed back to the home (the standby
feed's triggers, migration messaging 0022) and wait there while the home is away.

Hand-back: when the home is heard again and the link to it is up (or an operator asks), the holder
first stops admitting the users (Takeover.returning_since; messaging.federation.takeover.fence) and closes their
connections with 1012, for HAND_BACK_GRACE_SECONDS: an ACK read in the moment it gives their
mailboxes up would never reach the home, which would push that message again. Then it sends the
feed to the home itself, on the watch's thread, in as many calls as HAND_BACK_DRAIN_SECONDS allow
(`feed_drain`: not behind the worker's queue). Then, with the
feed to the home held in turn (none is added in between: `feed_in_turn`), it makes sure the home has every change: what is
left of its feed goes in that same call when one call takes it, else it waits for the next look; and,
in the same transaction, re-seeds its copy (StandbyCopy) from the mailboxes it
held, clears those mailboxes and subscriptions, and records the hand-back; the users' next login is
redirected home. If the home falls silent again meanwhile, the holder admits them again. A home that learns it is held
closes its own users' connections the same way (a planned takeover).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from apps_registry.models import ClientApp, Domain, Takeover, UserDistribution
from apps_registry.selectors import takeover_records
from foundation import handoff
from foundation.db import hot_cursor
from foundation.transport.frames import CLOSE_RESTART
from messaging.federation.models import StandbyCopy, StandbyFeed, StandbySubscription
from messaging.federation.order import barriers_lift, held_release
from messaging.federation.standby.copy import (
    ANY_STANDBY,
    standby_ranges,
    user_in_ranges,
)
from messaging.federation.standby.feed_turn import feed_in_turn
from messaging.federation.standby.handback_feed import feed_drain, feed_send_last
from messaging.federation.standby.mailbox_merge import Copied, handback_in_turn, mailbox_merge, subscriptions_merge
from messaging.federation.standby.outgoing_copy import outgoing_take
from messaging.federation.takeover.fence import cut_off, fence_forget, fence_seconds
from messaging.federation.takeover.handback_order import counts_send, handback_counts
from messaging.federation.takeover.held_rows import (
    HELD_HERE,
    HELD_KEYS_SQL,
    RESEED_SQL,
    copy_again,
    given_back_marks_raise,
    in_ranges,
    mailboxes_reorder,
    queued_into_mailboxes,
    ranges_params,
    records_back_into_mailboxes,
    stored_as_taken_fed,
)
from messaging.federation.takeover.liveness import silent_here_for, silent_seconds, witnesses_agree
from messaging.federation.takeover.reclaim import reclaim_watch
from messaging.federation.takeover.records import changed_here, epoch_next, record_returned, retry_now
from presence.services import users_close_sync

log = logging.getLogger(__name__)

# Rows stored this long before a takeover began may stand after what the holder copies back.
REORDER_MARGIN_SECONDS = 60
REORDER_AFTER_SECONDS = 120  # and late arrivals are put in order for this long after a hand-back



def given_back(holder: str) -> dict:
    """At a home given its users back: what it was forwarding them meanwhile into their mailboxes
    (and what it forwarded them whose only mailbox row was the holder's), each origin's messages in
    its order, and their mailboxes to the standby again."""
    taken, reclaimed = (Takeover.objects.filter(home__name=settings.DOMAIN_NAME, holder__name=holder)
                        .values_list("taken_at", "reclaimed_at").first() or (None, None))
    with transaction.atomic():
        handback_in_turn(settings.DOMAIN_NAME, holder)
        queued = queued_into_mailboxes(holder, back=True)
        if queued is None:  # the link's sender is sending now: again in a moment
            transaction.on_commit(lambda: handoff.given_back_enqueue(holder, countdown=1.0))
            return {"queued": None}
        moved = 0
        if taken:
            since = taken - timedelta(seconds=REORDER_MARGIN_SECONDS)
            queued += records_back_into_mailboxes(holder, since)
            moved = mailboxes_reorder(holder, since, copy=False)  # (copy_again copies every row next)
            queued += given_back_marks_raise(holder, since)
        if reclaimed is None:  # the holder's own word (not a reclaim): what it stored for them is home
            queued += barriers_lift(holder)
        if queued:
            transaction.on_commit(lambda: handoff.routing_enqueue(queued))
        copied = copy_again(holder)
    return {"queued": len(queued), "reordered": moved, "copied": copied}


# --- takeover and hand-back -----------------------------------------------------------------------


# How long one look of a hand-back sends the feed to the home before its last call (feed_drain): the
# takeover watch's thread looks at no other home meanwhile, and a longer feed goes on at the next look.
HAND_BACK_DRAIN_SECONDS = 5.0


def takeover_watch() -> dict[str, str]:
    """One look at every home this domain stands by for: take it over, or hand it back, when due."""
    here = settings.DOMAIN_NAME
    out: dict[str, str] = reclaim_watch()
    if (moved := _late_reorder()) is not None:
        out[here] = f"{moved} rows of its users given back put in their origin's order"
    if (closed := _fence_close()) is not None:
        out[here] = f"cut off from the network: {closed} connections of users with a standby, or held here, closed"
    homes = sorted(set(UserDistribution.objects.filter(standby__name=here).values_list("domain__name", flat=True)))
    for home in homes:
        current = Takeover.objects.select_related("holder").filter(home__name=home, holder__name=here).first()
        if current is not None and current.held:
            if current.holder.name == here and (queued := queued_into_mailboxes(home)):
                handoff.routing_enqueue(queued)  # rows that joined the link to the home since the takeover
            # (a hand-back asked for by hand and begun goes on here too, or is given up the same way)
            if current.holder.name == here and (not current.manual or current.returning_since is not None):
                silent = silent_seconds(home)
                if silent is not None and silent < settings.LINK_DOWN_AFTER_SECONDS:  # it speaks again
                    retry_now(home)
                    out[home] = hand_back(home)["state"]
                elif current.returning_since is not None:
                    # Begun: it goes on between two of the home's gossip rounds, and is given up
                    # only when the home is silent for as long as it would fence itself off, and
                    # this domain hears others (one that hears nobody, as it starts again, cannot
                    # tell; it admits none of them meanwhile either).
                    if (silent is None or silent >= fence_seconds()) and not cut_off():
                        _returning_abandon(home)
                    else:
                        out[home] = hand_back(home)["state"]
            continue
        if not silent_here_for(home, settings.FAILOVER_SECONDS):
            continue
        agreed, why = witnesses_agree(home)
        out[home] = take_over(home, reason=why)["state"] if agreed else f"not taken: {why}"
    return out


def _late_reorder() -> int | None:
    """For REORDER_AFTER_SECONDS after this domain got its users back, each look (None: not given
    back lately): its records of messages it forwarded to the holder that have no mailbox row here
    put into the mailbox (as `given_back` does once: a forward that was on its way as the holder
    handed back was answered as a duplicate of the holder's own record of passing that message on,
    once it no longer served the user, after `given_back` had run: lost, in a fault run, 30 times in
    one hand-back), and what still comes late (a neighbour's link queue held back while it was
    away) into its origin's order."""
    lately = timezone.now() - timedelta(seconds=REORDER_AFTER_SECONDS)
    rows = list(Takeover.objects.filter(home__name=settings.DOMAIN_NAME, held=False, returned_at__gt=lately)
                .order_by("holder__name").values_list("holder__name", "taken_at"))
    if not rows:
        return None
    moved = 0
    for holder, taken in rows:  # each standby that gave back the ranges it held
        since = taken - timedelta(seconds=REORDER_MARGIN_SECONDS)
        with transaction.atomic():
            handback_in_turn(settings.DOMAIN_NAME, holder)
            if back := records_back_into_mailboxes(holder, since):
                log.warning("%s: %d messages it had forwarded to %s, which took them for duplicates, put in the"
                            " mailbox", settings.DOMAIN_NAME, len(back), holder)
            moved_here = mailboxes_reorder(holder, since)
            if routed := back + given_back_marks_raise(holder, since):  # (and what waited for those, in order now)
                transaction.on_commit(lambda routed=routed: handoff.routing_enqueue(routed))
        if moved_here:
            handoff.standby_senders_kick([holder])
        moved += moved_here
    return moved


def _fence_close() -> int | None:
    """Cut off from the network (messaging.federation.takeover.fence): close the connections of this domain's
    users that have a standby, which may take them over soon, and of the users it holds, whose home
    may take them back (messaging.federation.takeover.reclaim) (None: not cut off, or none such)."""
    fence_forget()
    here = settings.DOMAIN_NAME
    ranges = standby_ranges(here, ANY_STANDBY)
    for home in Takeover.objects.filter(holder__name=here, held=True).values_list("home__name", flat=True):
        for app, held in standby_ranges(home, here).items():
            ranges.setdefault(app, []).extend(held)
    if not ranges or not cut_off():
        return None
    return users_close_sync(ranges=ranges, code=CLOSE_RESTART,
                            reason=f"{settings.DOMAIN_NAME} is cut off from the network; reconnect")


def take_over(home: str, *, manual: bool = False, reason: str = "") -> dict:
    """Serve here the users of the ranges homed at `home` that this domain stands by for (and no
    others: those have another standby, or none): record it and merge the copy, which is of those
    users alone. Another standby of `home` may hold its own ranges meanwhile."""
    here = settings.DOMAIN_NAME
    ranges = standby_ranges(home)
    if not ranges:
        raise ValueError(f"{here} is not the standby of any range homed at {home}")
    with transaction.atomic():
        current = Takeover.objects.select_for_update().filter(home__name=home, holder__name=here).first()
        if current is not None and current.held:
            return {"state": "held"}
        Takeover.objects.update_or_create(home=Domain.objects.get(name=home), holder=Domain.objects.get(name=here),
                                          defaults={"held": True, "epoch": epoch_next(current),
                                                    "taken_at": timezone.now(), "returned_at": None, "manual": manual,
                                                    "reason": reason[:300], "learned_at": timezone.now()})
        # The copy is of those users (the home feeds each standby its own ranges); what a range's
        # standby before a change of it left here is not, and stays inert.
        apps = dict(ClientApp.objects.values_list("pk", "app_name"))
        copies = [Copied(app_id=c.app_id, recipient=c.recipient, origin_domain=c.origin_domain,
                         origin_message_id=c.origin_message_id, state=c.state, delivered_at=c.delivered_at,
                         dead_at=c.dead_at, expired_at=c.expired_at, origin_seq=c.origin_seq,
                         message={"sender": c.sender, "kind": c.kind, "content": c.content, "reference": c.reference,
                                  "confirmation_requested": c.confirmation_requested})
                  for c in StandbyCopy.objects.filter(home=home).order_by("app_id", "recipient", "seq").iterator()
                  if user_in_ranges(c.recipient, apps.get(c.app_id, ""), ranges)]
        merged = mailbox_merge(copies)
        sent_on = outgoing_take(home)  # what the home's users sent that waited on its links: before what they send here
        queued = queued_into_mailboxes(home) or []
        subscriptions_merge([{"app_id": app, "subscriber": sub, "channel": ch, "subscribed": True} for app, sub, ch
                             in StandbySubscription.objects.filter(home=home).values_list("app_id", "subscriber",
                                                                                          "channel")
                             if user_in_ranges(sub, apps.get(app, ""), ranges)])
    log.warning("%s took over %s's users (%s): %d deliveries merged, %d waiting here for %s put in their mailboxes,"
                " %d of their messages that waited there sent on", here, home, reason or "by hand", merged.appended,
                len(queued), home, sent_on)
    if queued:
        transaction.on_commit(lambda: handoff.routing_enqueue(queued))
    changed_here(home, here, True)
    _tell_now()
    try:
        unfed = stored_as_taken_fed(home)
    except DatabaseError:  # (a store that would not end, or a deadlock with one): the takeover stands
        log.exception("%s: feeding %s what was stored for its users as it took them over failed", here, home)
        unfed = 0
    if unfed:
        log.warning("%s: %d rows of %s's users made here as it took them over fed to %s as new", here, unfed, home,
                    home)
    return {"state": "taken", "merged": merged.appended, "queued": len(queued)}


def hand_back(home: str, *, manual: bool = False) -> dict:
    """Give `home` its users back once it has taken every change made here: first stop admitting
    them and close their connections ({"state": "closing"} for HAND_BACK_GRACE_SECONDS), then wait
    until the home has every change ({"state": "waiting"}), then hand back."""
    here = settings.DOMAIN_NAME
    since = _returning_start(home)
    if since is None:
        return {"state": "not held here"}
    if (left := settings.HAND_BACK_GRACE_SECONDS - (timezone.now() - since).total_seconds()) > 0:
        _users_close(home, f"{here} is handing your users back to {home}; reconnect")  # also those admitted since
        return {"state": "closing", "seconds_left": round(left, 1)}
    _held_out(home)
    feed_drain(standby=home, budget_seconds=HAND_BACK_DRAIN_SECONDS)  # on this look's thread, not the worker's queue
    with transaction.atomic(), hot_cursor() as cur:
        current = Takeover.objects.select_for_update().filter(home__name=home, holder__name=here).first()
        if current is None or not current.held:
            return {"state": "not held here"}
        # No change can join the feed between this look and the commit: whoever stores one waits.
        # What is left goes to the home now, in this call, when one call takes it: the users'
        # messages keep coming while they are handed back, so the feed is seldom empty at a look
        # (waiting for an empty one took up to two minutes under load).
        feed_in_turn(home)
        params = {"home": current.home_id, "standby": current.holder_id, "home_name": home, "here_name": here}
        cur.execute(HELD_KEYS_SQL, params)
        if cur.fetchone() is not None:  # held since `_held_out`: out at the next look, before the lock
            transaction.on_commit(lambda: _kick(home))
            log.info("%s: the hand-back of %s's users waits: rows held in order came in since the last look",
                     here, home)
            return {"state": "waiting", "held_for_order": True}
        if not feed_send_last(standby=home):
            waiting = StandbyFeed.objects.filter(standby=home).count()
            transaction.on_commit(lambda: _kick(home))
            log.info("%s: the hand-back of %s's users waits: %d changes not yet sent to it", here, home, waiting)
            return {"state": "waiting", "changes_waiting": waiting}
        if not counts_send(home, handback_counts(params, current.taken_at)):
            transaction.on_commit(lambda: _kick(home))
            return {"state": "waiting", "counts": "not sent"}
        cur.execute("SELECT set_config('switchboard.no_copy', 'on', true)")
        cur.execute(RESEED_SQL, params)
        cur.execute(f"DELETE FROM messaging_delivery WHERE id IN (SELECT d.id {HELD_HERE})", params)
        cleared = cur.rowcount
        cur.execute(f"DELETE FROM messaging_subscription WHERE id IN (SELECT s.id FROM messaging_subscription s"
                    f" {in_ranges('s', 'subscriber')})", params)
        cur.execute("SELECT set_config('switchboard.no_copy', '', true)")
        record_returned(current, manual=manual or current.manual)
    log.warning("%s handed %s's users back (%d deliveries it held)", here, home, cleared)
    changed_here(home, here, False)
    _tell_now()
    return {"state": "handed back", "deliveries": cleared}


def _held_out(home: str) -> int:
    """At a holder handing `home`'s users back: what it holds for them behind an earlier message of its
    origin (messaging.federation.order) into their mailboxes, and so home with the rest: the home may
    have that earlier one (stored there just before the loss, past the copy); left here, it waited
    NETWORK_ORDER_WAIT_SECONDS and came home after the users' later messages. In a transaction of its
    own, before the hand-back's: that one holds the feed to the home in turn, which a mailbox row's
    feed trigger waits for (taking the mailbox rows after it deadlocked with a store that held one)."""
    with transaction.atomic(), hot_cursor() as cur:
        cur.execute(HELD_KEYS_SQL, ranges_params(home, settings.DOMAIN_NAME))
        keys = [tuple(row) for row in cur.fetchall()]
        return len(held_release(keys)) if keys else 0


def _returning_start(home: str):
    """Since when this domain is handing `home`'s users back (from now, if it was not yet: their
    connections close, and no web node here admits them from its next look at the fence); None
    when it does not hold them."""
    with transaction.atomic():
        current = (Takeover.objects.select_for_update()
                   .filter(home__name=home, holder__name=settings.DOMAIN_NAME).first())
        if current is None or not current.held:
            return None
        if current.returning_since is None:
            current.returning_since = timezone.now()
            current.save(update_fields=["returning_since"])
            fence_forget()
            _tell_now()  # (the home may take its users back without this domain if it falls silent now)
        return current.returning_since


def _returning_abandon(home: str) -> None:
    """The home fell silent again while it was being handed back: admit its users here again."""
    if Takeover.objects.filter(home__name=home, holder__name=settings.DOMAIN_NAME, held=True,
                               returning_since__isnull=False).update(returning_since=None):
        fence_forget()
        log.warning("%s: %s is silent again; not handing its users back yet", settings.DOMAIN_NAME, home)


def _users_close(home: str, reason: str) -> int:
    return users_close_sync(ranges=standby_ranges(home, settings.DOMAIN_NAME), code=CLOSE_RESTART, reason=reason)


def _kick(home: str) -> None:
    handoff.standby_senders_kick([home])


def _tell_now() -> None:
    """Tell the neighbours now, not at the next gossip round (each passes it on with its own)."""
    transaction.on_commit(handoff.gossip_now)


def takeovers_shown() -> list[dict]:
    """Per home this domain knows of: who holds its users, since when, and the last hand-back."""
    return takeover_records()

