"""Takeover records, told around (issue 27; messaging.federation.takeover.take takes and hands back).

Every domain tells its neighbours, with each presence gossip round, the Takeover rows it holds and
the clocks it heard (`network_gossip`); a forwarding call carries the records changed lately too.
A receiver takes a record newer than the one it holds (the higher epoch wins) only if the neighbour
that tells it may (`record_refusal`, docs/architecture.md "Who may tell a takeover"): the records
carry no signature of their writer, so the receiver checks what its own configuration and clock say
every genuine record is. What changed is acted on here (`changed_here`): snapshots forgotten,
connections of users no longer served here closed, a home given its users back told to take them.
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
from foundation import handoff
from foundation.transport.frames import CLOSE_RESTART
from messaging.federation.models import LinkHealth
from messaging.federation.standby.copy import standby_ranges
from messaging.federation.takeover.liveness import heard_apply, heard_versions
from messaging.federation.wire.transport import PeerRefused
from presence.services import users_close_sync

log = logging.getLogger(__name__)


def network_gossip(*, speaking: bool = True) -> dict:
    """What this domain tells each neighbour of the network's state, with its presence round (its
    own clock only while `speaking`: messaging.federation.takeover.liveness.domain_serves)."""
    return {"heard": heard_versions(speaking=speaking),
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
                or not isinstance(r.get("taken_at"), str) or parse_datetime(r["taken_at"]) is None
                or not isinstance(r.get("returning", False), bool)):
            raise PeerRefused(400, f"network.takeovers[{i}] must be a takeover record")
        records.append(r)
    return {"heard": heard, "takeovers": records}


def epoch_ceiling() -> int:
    """The highest epoch this domain believes: an epoch is its writer's clock in microseconds
    (`epoch_next`), so an honest one is never further ahead of this domain's clock than the two
    clocks are apart (signed calls already refuse clocks FORWARD_MAX_SKEW_SECONDS apart). One
    further ahead than TAKEOVER_EPOCH_MAX_AHEAD_SECONDS would beat every record its holder writes
    until then (2^63-1 for ever: the next epoch would not fit a bigint, and takeovers of that home
    would fail); such a record is refused, and such a row (stored before this rule) counts as no
    epoch at all, so the next genuine record replaces it."""
    return time.time_ns() // 1000 + int(settings.TAKEOVER_EPOCH_MAX_AHEAD_SECONDS * 1_000_000)


def epoch_of(current: Takeover | None) -> int:
    return current.epoch if current is not None and current.epoch <= epoch_ceiling() else 0


def epoch_next(current: Takeover | None) -> int:
    """After `current`'s epoch and at least this domain's clock in microseconds (a row with an epoch
    past `epoch_ceiling` counts as none: its next would not fit a bigint, or beat honest records)."""
    return max(epoch_of(current), time.time_ns() // 1000) + 1


def record_returned(current: Takeover, **also) -> None:
    """`current` (locked by the caller) handed back: held no more, at its next epoch, learned now;
    `also`: other fields to set with it."""
    now = timezone.now()
    fields = {"held": False, "returned_at": now, "epoch": epoch_next(current), "learned_at": now,
              "returning_since": None, **also}
    for name, value in fields.items():
        setattr(current, name, value)
    current.save(update_fields=list(fields))


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
      for a hand-back, a domain this domain knows took that home over (`holder_now`: the record's
      holder when this domain has a row of that home and holder; its standby may have changed since);
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
    # One record per home and holder: each standby's takeover is of its own ranges.
    held_here = ({(home, holder): (epoch, returning is not None) for home, holder, epoch, returning in
                  Takeover.objects.values_list("home__name", "holder__name", "epoch", "returning_since")}
                 if network["takeovers"] else {})
    standbys: set[tuple[str, str]] | None = None
    ceiling = epoch_ceiling()
    for index, r in enumerate(network["takeovers"]):
        known = (r["home"], r["holder"]) in held_here
        (epoch, returning), holder_now = held_here.get((r["home"], r["holder"]), (0, False)), r["holder"] if known else None
        news = r["holder"] != here and _returning_news(r, returning)
        if r["home"] not in domains or r["holder"] not in domains or (
                epoch <= ceiling and (epoch > r["epoch"] or (epoch == r["epoch"] and not news))):
            continue  # (no lock taken for what is known: every forward call from a holder tells it)
        if standbys is None:
            standbys = set(UserDistribution.objects.filter(standby__isnull=False)
                           .values_list("domain__name", "standby__name"))
        if (why := record_refusal(r, here=here, standbys=standbys, holder_now=holder_now)) is not None:
            log.warning("%s: takeover record %d from %s refused: %s", here, index, sender, why)
            out.refused.append({"index": index, "reason": why})
            continue
        with transaction.atomic():
            current = Takeover.objects.select_for_update().filter(home_id=domains[r["home"]],
                                                                  holder_id=domains[r["holder"]]).first()
            if epoch_of(current) > r["epoch"]:
                continue
            if epoch_of(current) == r["epoch"]:  # the same record, now being handed back
                if _returning_news(r, current.returning_since is not None):
                    current.returning_since = timezone.now()
                    current.save(update_fields=["returning_since"])
                    out.changed += 1
                continue
            returned = parse_datetime(r["returned_at"]) if isinstance(r.get("returned_at"), str) else None
            Takeover.objects.update_or_create(home_id=domains[r["home"]], holder_id=domains[r["holder"]], defaults={
                "held": r["held"], "epoch": r["epoch"],
                "taken_at": parse_datetime(r["taken_at"]), "returned_at": returned,
                "manual": bool(r.get("manual")), "reason": str(r.get("reason", ""))[:300],
                "learned_at": timezone.now(), "reclaimed_at": None,  # (the holder's own word: it is back)
                "returning_since": timezone.now() if r["held"] and r.get("returning") else None})
        out.changed += 1
        changed_here(r["home"], r["holder"], r["held"])
    heard_apply(network["heard"])
    return out


def _returning_news(record: dict, returning_known: bool) -> bool:
    """Whether `record` tells, at the epoch known here, that its holder has begun handing the users
    back (`take._returning_start` changes no epoch: a home that took its users back from a holder gone
    silent meanwhile wrote a later one, which a holder that comes back and begins again must not beat).
    Only the start is news: a hand-back given up is not told (the home's reclaim, `reclaim`, waits
    for the holder's silence all the same)."""
    return bool(record["held"] and record.get("returning")) and not returning_known


def changed_here(home: str, holder: str, held: bool) -> None:
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
        retry_now(home)
        transaction.on_commit(lambda: handoff.forward_links_kick([home]))
    if (home == here and held) or (holder == here and not held):
        closed = users_close_sync(ranges=standby_ranges(home, holder), code=CLOSE_RESTART,
                                  reason=f"your users are served by {holder if held else home} now; reconnect")
        log.warning("%s: %s's users %s; %d connections closed", here, home,
                    f"held by {holder}" if held else "handed back", closed)


def retry_now(home: str) -> None:
    """A held home that speaks again (its gossip arrives) is called now: the backoff its link earned
    while it was away (a probe alone never clears it) would hold the changes it must take first, and
    so the hand-back, for up to the backoff's length. A call that fails earns it again."""
    LinkHealth.objects.filter(peer=home, retry_at__gt=timezone.now() + timedelta(seconds=2)).update(retry_at=None)
