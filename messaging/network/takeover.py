"""A standby domain takes its home's users over when the home is lost, and hands them back (issue 27).

Who serves a home's users is the registry's Takeover row (apps_registry.takeover): while `held`, the
app snapshots name the holder where the users live, so every domain redirects their logins there and
routes their messages there.

Liveness. Every domain tells its neighbours, with each presence gossip round (every
PRESENCE_GOSSIP_SECONDS), its own clock and every other domain's last clock it heard, and the
Takeover rows it holds (`network_gossip`). A domain records when it first heard each newer clock of
each domain (DomainHeard, by its own clock): "silent for" is how long no newer word of a domain came,
by whatever path (messaging.network.liveness). The Takeover row with the higher epoch wins wherever it arrives,
if the neighbour that tells it may (`record_refusal`: its holder is the home's standby and not the
receiver, its epoch not ahead of the receiver's clock); a record refused is named in the answer.

Takeover (`takeover_watch`, beat every TAKEOVER_WATCH_SECONDS, at every domain that is a standby):
the home has been silent here for FAILOVER_SECONDS and its link from here is down for as long, and a
third domain (a neighbour of this one, asked at POST /internal/v1/witness) agrees it has been silent
there too, while none says it heard the home since. With only the home-standby link broken the home
is still heard through the others, so the standby never takes over. The holder then, in one
transaction, records the takeover and merges the copies it holds (StandbyCopy, StandbySubscription)
into its own mailboxes (messaging.network.mailbox_merge), and tells its neighbours at once.

While it holds them, the changes it makes to their mailboxes are fed back to the home (the standby
feed's triggers, migration messaging 0022) and wait there while the home is away.

Hand-back: when the home is heard again and the link to it is up (or an operator asks), the holder
first stops admitting the users (Takeover.returning_since; messaging.network.fence) and closes their
connections with 1012, for HAND_BACK_GRACE_SECONDS: an ACK read in the moment it gives their
mailboxes up would never reach the home, which would push that message again. Then, with the
feed's table locked (none is added in between), it makes sure the home has every change: what is
left of its feed goes in that same call when one call takes it, else it waits for its sender; and,
in the same transaction, re-seeds its copy (StandbyCopy) from the mailboxes it
held, clears those mailboxes and subscriptions, and records the hand-back; the users' next login is
redirected home. If the home falls silent again meanwhile, the holder admits them again. A home that learns it is held
closes its own users' connections the same way (a planned takeover).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps_registry.models import Domain, Takeover, UserDistribution
from apps_registry.selectors import MAX_TAKEOVERS, app_snapshots_clear, takeover_records
from foundation.db import hot_cursor
from foundation.transport.frames import CLOSE_RESTART
from messaging import handoff
from messaging.network.fence import cut_off, fence_forget, fence_seconds
from messaging.network.held_rows import (
    HELD_HERE,
    RESEED_SQL,
    copy_again,
    in_ranges,
    mailboxes_reorder,
    queued_into_mailboxes,
    records_back_into_mailboxes,
)
from messaging.network.liveness import heard_apply, heard_versions, silent_seconds, witnesses_agree
from messaging.network.mailbox_merge import Copied, mailbox_merge, subscriptions_merge
from messaging.network.models import LinkHealth, StandbyCopy, StandbyFeed, StandbySubscription
from messaging.network.outgoing_copy import outgoing_take
from messaging.network.standby import ANY_STANDBY, feed_send_last, standby_ranges
from messaging.network.transport import PeerRefused
from presence.services import users_close_sync

log = logging.getLogger(__name__)

# Rows stored this long before a takeover began may stand after what the holder copies back.
REORDER_MARGIN_SECONDS = 60
REORDER_AFTER_SECONDS = 120  # and late arrivals are put in order for this long after a hand-back



# --- the records, told around ---------------------------------------------------------------------


def network_gossip() -> dict:
    """What this domain tells each neighbour of the network's state, with its presence round."""
    return {"heard": heard_versions(),
            "takeovers": takeover_records()}


def network_parse(item) -> dict:
    if (not isinstance(item, dict) or set(item) - {"heard", "takeovers"} or not isinstance(item.get("heard", {}), dict)
            or not isinstance(item.get("takeovers", []), list) or len(item.get("takeovers", [])) > MAX_TAKEOVERS
            or len(item.get("heard", {})) > MAX_TAKEOVERS):
        raise PeerRefused(400, "network must be {\"heard\": {domain: clock}, \"takeovers\": [...]}")
    heard = item.get("heard", {})
    if not all(isinstance(d, str) and 0 < len(d) <= 64 and isinstance(v, int) and not isinstance(v, bool)
               and 0 <= v < 2**63 for d, v in heard.items()):
        raise PeerRefused(400, "network.heard must map domain names to whole numbers")
    records = []
    for i, r in enumerate(item.get("takeovers", [])):
        if (not isinstance(r, dict) or not isinstance(r.get("home"), str) or not isinstance(r.get("holder"), str)
                or not isinstance(r.get("held"), bool) or not isinstance(r.get("epoch"), int)
                or isinstance(r.get("epoch"), bool) or not 0 < r["epoch"] < 2**63
                or not isinstance(r.get("taken_at"), str) or parse_datetime(r["taken_at"]) is None):
            raise PeerRefused(400, f"network.takeovers[{i}] must be a takeover record")
        records.append(r)
    return {"heard": heard, "takeovers": records}


def epoch_ceiling() -> int:
    """The highest epoch this domain believes: an epoch is its writer's clock in microseconds
    (`_epoch_next`), so an honest one is never further ahead of this domain's clock than the two
    clocks are apart (signed calls already refuse clocks FORWARD_MAX_SKEW_SECONDS apart). One
    further ahead than TAKEOVER_EPOCH_MAX_AHEAD_SECONDS would beat every record its holder writes
    until then (2^63-1 for ever: the next epoch would not fit a bigint, and takeovers of that home
    would fail); such a record is refused, and such a row (stored before this rule) counts as no
    epoch at all, so the next genuine record replaces it."""
    return time.time_ns() // 1000 + int(settings.TAKEOVER_EPOCH_MAX_AHEAD_SECONDS * 1_000_000)


def _epoch_of(current: Takeover | None) -> int:
    return current.epoch if current is not None and current.epoch <= epoch_ceiling() else 0


@dataclass
class Accepted:
    """What a neighbour's takeover records did here: how many changed a record, and those refused
    (`{"index": i, "reason": …}`, by their index in the call; the forwarding call's answer lists
    them as `takeovers_refused`)."""

    changed: int = 0
    refused: list[dict] = field(default_factory=list)


def record_refusal(record: dict, *, here: str, standbys: set[tuple[str, str]], holder_now: str | None) -> str | None:
    """Why a newer takeover record a neighbour tells must not be taken (None: it may). The records
    carry no signature of their writer (only each hop's link signs the call that carries them), so
    what the receiver checks is what its own configuration and clock say every genuine record is:

    - its holder is a standby of its home here (only a standby takes a home over: `take_over`), or,
      for a hand-back, the domain this domain knows holds that home (its standby may have changed
      since it took the home over);
    - its holder is not this domain: only this domain writes what it holds (`take_over`,
      `hand_back`); a neighbour cannot make it hold users it never merged, or give back users it holds;
    - its epoch is no further ahead of this domain's clock than TAKEOVER_EPOCH_MAX_AHEAD_SECONDS
      (`epoch_ceiling`)."""
    home, holder, epoch = record["home"], record["holder"], record["epoch"]
    if epoch > epoch_ceiling():
        return (f"epoch {epoch} is more than {settings.TAKEOVER_EPOCH_MAX_AHEAD_SECONDS:g} s ahead of {here}'s clock "
                "(an epoch is its writer's clock in microseconds)")
    if holder == home:
        return f"{home} cannot hold its own users"
    if holder == here:
        return f"only {here} records which users {here} holds"
    if (home, holder) not in standbys and (record["held"] or holder != holder_now):
        return f"{holder} is not a standby of {home}'s users here"
    return None


def network_accept(network: dict, *, sender: str) -> Accepted:
    """Take the takeovers newer than those held here (and their effects) that `sender` may tell
    (`record_refusal`), then the clocks heard (in that order: a home that hears its neighbours again
    has heard of its takeover first)."""
    here = settings.DOMAIN_NAME
    out = Accepted()
    domains = dict(Domain.objects.values_list("name", "pk"))
    held_here = ({home: (epoch, holder) for home, epoch, holder in
                  Takeover.objects.values_list("home__name", "epoch", "holder__name")} if network["takeovers"] else {})
    standbys: set[tuple[str, str]] | None = None
    ceiling = epoch_ceiling()
    for index, r in enumerate(network["takeovers"]):
        epoch, holder_now = held_here.get(r["home"], (0, None))
        if r["home"] not in domains or r["holder"] not in domains or (epoch <= ceiling and epoch >= r["epoch"]):
            continue  # (no lock taken for what is known: every forward call from a holder tells it)
        if standbys is None:
            standbys = set(UserDistribution.objects.filter(standby__isnull=False)
                           .values_list("domain__name", "standby__name"))
        if (why := record_refusal(r, here=here, standbys=standbys, holder_now=holder_now)) is not None:
            log.warning("%s: takeover record %d from %s refused: %s", here, index, sender, why)
            out.refused.append({"index": index, "reason": why})
            continue
        with transaction.atomic():
            current = Takeover.objects.select_for_update().filter(home_id=domains[r["home"]]).first()
            if _epoch_of(current) >= r["epoch"]:
                continue
            returned = parse_datetime(r["returned_at"]) if isinstance(r.get("returned_at"), str) else None
            Takeover.objects.update_or_create(home_id=domains[r["home"]], defaults={
                "holder_id": domains[r["holder"]], "held": r["held"], "epoch": r["epoch"],
                "taken_at": parse_datetime(r["taken_at"]), "returned_at": returned,
                "manual": bool(r.get("manual")), "reason": str(r.get("reason", ""))[:300],
                "learned_at": timezone.now()})
        out.changed += 1
        _changed(r["home"], r["holder"], r["held"])
    heard_apply(network["heard"])
    return out


def _changed(home: str, holder: str, held: bool) -> None:
    """Who serves `home`'s users changed: this process sees it at once (others within
    TAKEOVER_LOOK_SECONDS), and the connections of those users on the side that no longer serves
    them close (1012)."""
    app_snapshots_clear()
    here = settings.DOMAIN_NAME
    if home == here and not held:
        transaction.on_commit(lambda: handoff.given_back_enqueue(holder))  # (a task: no lock held meanwhile)
    if home != here and not held:
        # The home serves again: what waits here on the link to it goes now, not after the backoff
        # its calls earned while it was away (it would land after what the holder copied back).
        _retry_now(home)
        transaction.on_commit(lambda: handoff.forward_links_kick([home]))
    if (home == here and held) or (holder == here and not held):
        closed = users_close_sync(ranges=standby_ranges(home, holder), code=CLOSE_RESTART,
                                  reason=f"your users are served by {holder if held else home} now; reconnect")
        log.warning("%s: %s's users %s; %d connections closed", here, home,
                    f"held by {holder}" if held else "handed back", closed)


def given_back(holder: str) -> dict:
    """At a home given its users back: what it was forwarding them meanwhile into their mailboxes
    (and what it forwarded them whose only mailbox row was the holder's), each origin's messages in
    its order, and their mailboxes to the standby again."""
    taken = Takeover.objects.filter(home__name=settings.DOMAIN_NAME).values_list("taken_at", flat=True).first()
    with transaction.atomic():
        queued = queued_into_mailboxes(holder, back=True)
        if queued is None:  # the link's sender is sending now: again in a moment
            transaction.on_commit(lambda: handoff.given_back_enqueue(holder, countdown=1.0))
            return {"queued": None}
        if taken:
            queued += records_back_into_mailboxes(holder, taken - timedelta(seconds=REORDER_MARGIN_SECONDS))
        if queued:
            transaction.on_commit(lambda: handoff.routing_enqueue(queued))
        moved = (mailboxes_reorder(holder, taken - timedelta(seconds=REORDER_MARGIN_SECONDS), copy=False)
                 if taken else 0)  # (copy_again copies every row next)
        copied = copy_again(holder)
    return {"queued": len(queued), "reordered": moved, "copied": copied}


# --- takeover and hand-back -----------------------------------------------------------------------


def _down_for(peer: str) -> float:
    row = LinkHealth.objects.filter(peer=peer).values_list("up", "down_since").first()
    if row is None or row[0] or row[1] is None:
        return 0.0
    return (timezone.now() - row[1]).total_seconds()


def takeover_watch() -> dict[str, str]:
    """One look at every home this domain stands by for: take it over, or hand it back, when due."""
    here = settings.DOMAIN_NAME
    out: dict[str, str] = {}
    if (moved := _late_reorder()) is not None:
        out[here] = f"{moved} rows of its users given back put in their origin's order"
    if (closed := _fence_close()) is not None:
        out[here] = f"cut off from the network: {closed} connections of users with a standby closed"
    homes = sorted(set(UserDistribution.objects.filter(standby__name=here).values_list("domain__name", flat=True)))
    for home in homes:
        current = Takeover.objects.select_related("holder").filter(home__name=home).first()
        if current is not None and current.held:
            if current.holder.name == here and (queued := queued_into_mailboxes(home)):
                handoff.routing_enqueue(queued)  # rows that joined the link to the home since the takeover
            # (a hand-back asked for by hand and begun goes on here too, or is given up the same way)
            if current.holder.name == here and (not current.manual or current.returning_since is not None):
                silent = silent_seconds(home)
                if silent is not None and silent < settings.LINK_DOWN_AFTER_SECONDS:  # it speaks again
                    _retry_now(home)
                    out[home] = hand_back(home)["state"]
                elif current.returning_since is not None:
                    # Begun: it goes on between two of the home's gossip rounds, and is given up
                    # only when the home is silent for as long as it would fence itself off.
                    if silent is None or silent >= fence_seconds():
                        _returning_abandon(home)
                    else:
                        out[home] = hand_back(home)["state"]
            continue
        silent = silent_seconds(home)
        if (silent is not None and silent < settings.FAILOVER_SECONDS) or _down_for(home) < settings.FAILOVER_SECONDS:
            continue
        agreed, why = witnesses_agree(home)
        out[home] = take_over(home, reason=why)["state"] if agreed else f"not taken: {why}"
    return out


def _late_reorder() -> int | None:
    """For REORDER_AFTER_SECONDS after this domain got its users back: what still comes late (a
    neighbour's link queue held back while it was away) into its origin's order, each look (None:
    not given back lately)."""
    lately = timezone.now() - timedelta(seconds=REORDER_AFTER_SECONDS)
    row = (Takeover.objects.filter(home__name=settings.DOMAIN_NAME, held=False, returned_at__gt=lately)
           .values_list("holder__name", "taken_at").first())
    if row is None:
        return None
    with transaction.atomic():
        moved = mailboxes_reorder(row[0], row[1] - timedelta(seconds=REORDER_MARGIN_SECONDS))
    if moved:
        handoff.standby_senders_kick([row[0]])
    return moved


def _fence_close() -> int | None:
    """Cut off from the network (messaging.network.fence): close the connections of this domain's
    users that have a standby, which may take them over soon (None: not cut off, or none such)."""
    fence_forget()
    ranges = standby_ranges(settings.DOMAIN_NAME, ANY_STANDBY)
    if not ranges or not cut_off():
        return None
    return users_close_sync(ranges=ranges, code=CLOSE_RESTART,
                            reason=f"{settings.DOMAIN_NAME} is cut off from the network; reconnect")


def _retry_now(home: str) -> None:
    """A held home that speaks again (its gossip arrives) is called now: the backoff its link earned
    while it was away (a probe alone never clears it) would hold the changes it must take first, and
    so the hand-back, for up to the backoff's length. A call that fails earns it again."""
    LinkHealth.objects.filter(peer=home, retry_at__gt=timezone.now() + timedelta(seconds=2)).update(retry_at=None)


def _epoch_next(current: Takeover | None) -> int:
    """After `current`'s epoch and at least this domain's clock in microseconds (a row with an epoch
    past `epoch_ceiling` counts as none: its next would not fit a bigint, or beat honest records)."""
    return max(_epoch_of(current), time.time_ns() // 1000) + 1


def take_over(home: str, *, manual: bool = False, reason: str = "") -> dict:
    """Serve `home`'s users here (this domain must be their standby): record it and merge the copy."""
    here = settings.DOMAIN_NAME
    ranges = standby_ranges(home)
    if not ranges:
        raise ValueError(f"{here} is not the standby of any range homed at {home}")
    with transaction.atomic():
        current = Takeover.objects.select_for_update().filter(home__name=home).first()
        if current is not None and current.held:
            return {"state": "held" if current.holder.name == here else f"held by {current.holder.name}"}
        Takeover.objects.update_or_create(home=Domain.objects.get(name=home), defaults={
            "holder": Domain.objects.get(name=here), "held": True, "epoch": _epoch_next(current),
            "taken_at": timezone.now(), "returned_at": None, "manual": manual, "reason": reason[:300],
            "learned_at": timezone.now()})
        copies = [Copied(app_id=c.app_id, recipient=c.recipient, origin_domain=c.origin_domain,
                         origin_message_id=c.origin_message_id, state=c.state, delivered_at=c.delivered_at,
                         dead_at=c.dead_at, expired_at=c.expired_at, origin_seq=c.origin_seq,
                         message={"sender": c.sender, "kind": c.kind, "content": c.content, "reference": c.reference,
                                  "confirmation_requested": c.confirmation_requested})
                  for c in StandbyCopy.objects.filter(home=home).order_by("app_id", "recipient", "seq").iterator()]
        merged = mailbox_merge(copies)
        sent_on = outgoing_take(home)  # what the home's users sent that waited on its links: before what they send here
        queued = queued_into_mailboxes(home) or []
        subscriptions_merge([{"app_id": app, "subscriber": sub, "channel": ch, "subscribed": True} for app, sub, ch
                             in StandbySubscription.objects.filter(home=home).values_list("app_id", "subscriber",
                                                                                          "channel")])
    log.warning("%s took over %s's users (%s): %d deliveries merged, %d waiting here for %s put in their mailboxes,"
                " %d of their messages that waited there sent on", here, home, reason or "by hand", merged.appended,
                len(queued), home, sent_on)
    if queued:
        transaction.on_commit(lambda: handoff.routing_enqueue(queued))
    _changed(home, here, True)
    _tell_now()
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
    with transaction.atomic(), hot_cursor() as cur:
        current = Takeover.objects.select_for_update().select_related("holder").filter(home__name=home).first()
        if current is None or not current.held or current.holder.name != here:
            return {"state": "not held here"}
        # No change can join the feed between this look and the commit: whoever stores one waits.
        # What is left goes to the home now, in this call, when one call takes it: the users'
        # messages keep coming while they are handed back, so the feed is seldom empty at a look
        # (waiting for an empty one took up to two minutes under load).
        cur.execute("LOCK TABLE messaging_standbyfeed IN SHARE ROW EXCLUSIVE MODE")
        if not feed_send_last(standby=home):
            waiting = StandbyFeed.objects.filter(standby=home).count()
            transaction.on_commit(lambda: _kick(home))
            return {"state": "waiting", "changes_waiting": waiting}
        cur.execute("SELECT set_config('switchboard.no_copy', 'on', true)")
        params = {"home": current.home_id, "standby": current.holder_id, "home_name": home, "here_name": here}
        cur.execute(RESEED_SQL, params)
        cur.execute(f"DELETE FROM messaging_delivery WHERE id IN (SELECT d.id {HELD_HERE})", params)
        cleared = cur.rowcount
        cur.execute(f"DELETE FROM messaging_subscription WHERE id IN (SELECT s.id FROM messaging_subscription s"
                    f" {in_ranges('s', 'subscriber')})", params)
        cur.execute("SELECT set_config('switchboard.no_copy', '', true)")
        current.held, current.returned_at, current.epoch = False, timezone.now(), _epoch_next(current)
        current.manual, current.learned_at, current.returning_since = manual or current.manual, timezone.now(), None
        current.save(update_fields=["held", "returned_at", "epoch", "manual", "learned_at", "returning_since"])
    log.warning("%s handed %s's users back (%d deliveries it held)", here, home, cleared)
    _changed(home, here, False)
    _tell_now()
    return {"state": "handed back", "deliveries": cleared}


def _returning_start(home: str):
    """Since when this domain is handing `home`'s users back (from now, if it was not yet: their
    connections close, and no web node here admits them from its next look at the fence); None
    when it does not hold them."""
    with transaction.atomic():
        current = Takeover.objects.select_for_update().select_related("holder").filter(home__name=home).first()
        if current is None or not current.held or current.holder.name != settings.DOMAIN_NAME:
            return None
        if current.returning_since is None:
            current.returning_since = timezone.now()
            current.save(update_fields=["returning_since"])
            fence_forget()
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

