"""The home's side of "two domains never serve the same users at once": a domain cut off from the
network stops serving its users that have a standby, before that standby may take them over.

A domain is cut off when no newer word of any other domain has reached it (DomainHeard, the
network's gossip: messaging.federation.takeover.take) for FENCE_SECONDS: half the failover threshold, and
never less than three gossip rounds. A standby takes over only after FAILOVER_SECONDS of silence,
so by then its home has stopped admitting those users (AUTH_CLIENT refused, no redirect: the client
retries) and closed their connections (takeover_watch, 1012). A domain that has just started is cut
off until the first gossip reaches it, so it cannot admit users a standby took over while it was
away before it has heard so. A domain in no network (no neighbour), or in a network of two (no third
domain could witness a takeover), is never cut off.

The holder's side, for the moment of a hand-back: while it hands a home's users back
(Takeover.returning_since, messaging.federation.takeover.take.hand_back), and for a snapshot's lifetime
after (a web node may still think them served here), it admits none of them either.

Read at most every FENCE_CACHE_SECONDS per process (two queries), so a login costs no query. A web
node's /readyz reads the same cache (`logins_fenced`): it is ready only when it would admit them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps_registry.models import Domain, DomainLink, Takeover, UserDistribution
from apps_registry.selectors import SNAPSHOT_TTL
from messaging.federation.models import DomainHeard

FENCE_CACHE_SECONDS = 1.0


@dataclass(frozen=True)
class Fence:
    cut_off: bool  # from the network: this domain's users with a standby are not admitted
    returning: frozenset[str]  # the homes whose users this domain is handing back: not admitted either


_cache: tuple[float, Fence] | None = None
_lock = threading.Lock()
process_started = time.monotonic()  # (imported as a web node starts: its login path reads the fence)


def fence_seconds() -> float:
    return max(settings.FAILOVER_SECONDS / 2, 3 * settings.PRESENCE_GOSSIP_SECONDS)


def _cut_off_now() -> bool:
    here = settings.DOMAIN_NAME
    if Domain.objects.count() < 3 or not DomainLink.objects.filter(Q(n1__name=here) | Q(n2__name=here),
                                                                   enabled=True).exists():
        return False  # no network, or no third domain to witness a takeover: nobody takes its users
    last = DomainHeard.objects.order_by("-heard_at").values_list("heard_at", flat=True).first()
    return last is None or (timezone.now() - last).total_seconds() > fence_seconds()


def fence() -> Fence:
    """Which of this domain's users it does not admit now (cached for FENCE_CACHE_SECONDS)."""
    global _cache
    now = time.monotonic()
    with _lock:
        if _cache is not None and now - _cache[0] < FENCE_CACHE_SECONDS:
            return _cache[1]
    # Returning: being handed back, or handed back so lately that a web node's app snapshot may
    # still say the users are served here (SNAPSHOT_TTL): none of them is admitted here meanwhile.
    lately = timezone.now() - timedelta(seconds=SNAPSHOT_TTL + FENCE_CACHE_SECONDS)
    value = Fence(cut_off=_cut_off_now(), returning=frozenset(
        Takeover.objects.filter(Q(held=True, returning_since__isnull=False) | Q(held=False, returned_at__gt=lately),
                                holder__name=settings.DOMAIN_NAME).values_list("home__name", flat=True)))
    with _lock:
        _cache = (now, value)
    return value


def cut_off() -> bool:
    """Whether this domain is cut off from the network now (cached for FENCE_CACHE_SECONDS)."""
    return fence().cut_off


def logins_fenced() -> bool:
    """Whether this web node refuses users it serves for being cut off from the network (the fence
    AUTH_CLIENT reads, messaging.gateway.authentication, from this process's same cache): it is cut
    off, and it serves users with a standby (a range homed here that has one, or a home's users
    held here)."""
    if not fence().cut_off:
        return False
    here = settings.DOMAIN_NAME
    return (UserDistribution.objects.filter(domain__name=here, standby__isnull=False).exists()
            or Takeover.objects.filter(holder__name=here, held=True).exists())


def starting_fenced() -> bool:
    """/readyz's "network": this web node started less than fence_seconds() ago and refuses those
    logins (`logins_fenced`): a fresh domain is cut off until the first gossip reaches it, and used
    to answer ready a gossip round before it admitted them. Only while it starts: what ends a
    cut-off is the neighbours' calls reaching this domain, and where they come through a load
    balancer that sends nothing to a node that is not ready, a readiness that waited for them would
    never end (a partition of a running domain would become an outage). Past the window a node
    still cut off is ready, and its refusals say why (1013, retry)."""
    return time.monotonic() - process_started < fence_seconds() and logins_fenced()


def fence_known() -> Fence | None:
    """The cached answer when it is fresh (no I/O: safe on an event loop); None when only a query can tell."""
    with _lock:
        if _cache is not None and time.monotonic() - _cache[0] < FENCE_CACHE_SECONDS:
            return _cache[1]
    return None


def fence_forget() -> None:
    global _cache
    with _lock:
        _cache = None
