"""How long each domain has been silent, as this domain heard it, and the witness a standby asks
before it takes a home over (messaging.federation.takeover.take).

Every domain tells its neighbours, with each gossip round, its own clock and every other domain's
last clock it heard (messaging.federation.takeover.records.network_gossip). A domain records, by its own clock,
when each newer clock of each domain reached it (DomainHeard): "silent for" is how long no newer
word of a domain came, by whatever path, so no two clocks are ever compared.

A domain tells its own clock only while it serves: while its own address answers `/healthz`
(`domain_serves`). Its workers can be back before its web nodes (a restarted domain's web node
may take many seconds more to start on a busy machine); a domain heard from then would hold off its
standby's takeover while none of its users could log in anywhere (issue 46, item 3).
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from apps_registry.models import Domain
from apps_registry.selectors import domain_call_url
from foundation.db import hot_cursor
from messaging.federation.models import DomainHeard, LinkHealth
from messaging.federation.wire.transport import (
    WITNESS_PATH,
    PeerError,
    PeerRefused,
    liveness_peers,
    peer_call_prepare,
    peer_calls_send,
)

log = logging.getLogger(__name__)
SERVES_TIMEOUT_SECONDS = 1.0

# --- liveness ------------------------------------------------------------------------------------


def heard_versions(*, speaking: bool = True) -> dict[str, int]:
    """Every domain's last clock heard here, and (`speaking`) this domain's own now."""
    heard = dict(DomainHeard.objects.values_list("domain", "version"))  # (never this domain: heard_apply)
    if speaking:
        heard[settings.DOMAIN_NAME] = time.time_ns()
    return heard


def domain_serves() -> bool:
    """Whether this domain's own address (its first http(s) URL in the registry) answers /healthz:
    a web node of it serves. True where the registry names no address for it (nothing to ask)."""
    urls = Domain.objects.filter(name=settings.DOMAIN_NAME).values_list("urls", flat=True).first()
    base = domain_call_url(urls)
    if base is None:
        return True
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=SERVES_TIMEOUT_SECONDS) as answer:  # noqa: S310
            return answer.status == 200
    except (OSError, urllib.error.URLError) as exc:
        log.info("%s does not serve yet (%s/healthz: %s): not telling its own clock", settings.DOMAIN_NAME,
                 base, exc)
        return False


def heard_apply(heard: dict[str, int]) -> None:
    """Record, by this domain's clock, each domain whose clock in `heard` is newer than the last heard."""
    items = [(d, v) for d, v in heard.items() if d != settings.DOMAIN_NAME]
    if not items:
        return
    with hot_cursor() as cur:
        cur.execute("""
            INSERT INTO messaging_domainheard AS h (domain, version, heard_at)
            SELECT d, v, now() FROM unnest(%s::text[], %s::bigint[]) AS t(d, v) ORDER BY d
            ON CONFLICT (domain) DO UPDATE SET version = EXCLUDED.version, heard_at = now()
             WHERE h.version < EXCLUDED.version""", [[d for d, _ in items], [v for _, v in items]])


def heard_of(domain: str) -> tuple[int | None, float | None]:
    """The last clock of `domain` heard here, and how long ago it came (None, None: never heard of)."""
    row = DomainHeard.objects.filter(domain=domain).values_list("version", "heard_at").first()
    if row is None:
        return None, None
    return row[0], max(0.0, (timezone.now() - row[1]).total_seconds())


def silent_seconds(domain: str) -> float | None:
    """How long no newer word of `domain` has reached this domain (None: never heard of)."""
    return heard_of(domain)[1]


# --- the witness --------------------------------------------------------------------------------


def witness_answer(*, sender: str, payload: dict) -> dict:
    """POST /internal/v1/witness {"home": name}: the last clock of it heard here, and how long ago."""
    home = payload.get("home")
    if set(payload) != {"home"} or not isinstance(home, str) or not 0 < len(home) <= 64:
        raise PeerRefused(400, "the payload is {\"home\": <domain name>}")
    version, silent = heard_of(home)
    return {"home": home, "silent_seconds": silent, "version": version}


def link_down_for(peer: str) -> float:
    """How long the link to `peer` has been down, from the last answer before it went down (not from
    the first call that failed after it: that came up to a probe period later)."""
    row = LinkHealth.objects.filter(peer=peer).values_list("up", "down_since", "last_ok_at").first()
    if row is None or row[0] or row[1] is None:
        return 0.0
    up, down_since, last_ok = row
    since = last_ok if last_ok is not None and last_ok < down_since else down_since
    return (timezone.now() - since).total_seconds()


OWN_SILENCE_ROUNDS = 2


def own_silence(threshold: float) -> float:
    """How long a domain must have been silent here, at the least, before a third domain is asked
    about it: two gossip rounds (each live neighbour's word comes every round), or `threshold` if
    that is shorter. The threshold itself is counted from the first domain that heard its last word
    (`witnesses_agree`): a domain that has just started heard that word again from its neighbours,
    later than anyone."""
    return min(threshold, OWN_SILENCE_ROUNDS * settings.PRESENCE_GOSSIP_SECONDS)


def silent_here_for(domain: str, threshold: float) -> bool:
    """Whether `domain`'s link from here has been down for `threshold` seconds and it has been silent
    here for `own_silence(threshold)` (then a third domain is asked: `witnesses_agree`)."""
    silent = silent_seconds(domain)
    return (silent is None or silent >= own_silence(threshold)) and link_down_for(domain) >= threshold


@dataclass(frozen=True)
class _Word:
    """What one domain (this one, or a witness) last heard of the domain asked about."""

    who: str
    version: int | None  # its last clock (None: never heard of it)
    silent: float | None  # how long ago that came


def _silence(words: list[_Word]) -> tuple[float | None, list[str]]:
    """How long the domain asked about has said nothing newer anywhere: since the first of `words`
    to hear its newest clock heard it (None: nobody ever heard of it); and who holds that clock."""
    heard = [w for w in words if w.version is not None and w.silent is not None]
    if not heard:
        return None, []
    newest = max(w.version for w in heard)
    latest = [w for w in heard if w.version == newest]
    return max(w.silent for w in latest), [w.who for w in latest]


def witnesses_agree(home: str, threshold: float | None = None) -> tuple[bool, str]:
    """Whether `home` (a home, or a holder its home takes its users back from) has said nothing newer,
    here or at a third domain, for `threshold` (FAILOVER_SECONDS) since the first of them heard its
    last word. Each witness answers with the last clock of `home` it heard and how long ago
    (`witness_answer`): one that heard a newer clock than the others counts from its own hearing of
    it, so a word heard at a witness alone holds it off; a domain that heard the last word late (it
    was started since) waits for no more than the one that heard it first. A witness that answers
    without its clock (an older version) must have been silent for `threshold` itself."""
    threshold = settings.FAILOVER_SECONDS if threshold is None else threshold
    calls = []
    for peer in (p for p in liveness_peers() if p != home):  # (over liveness-only links too)
        try:
            calls.append(peer_call_prepare(peer=peer, path=WITNESS_PATH, payload={"home": home}))
        except PeerError:
            continue
    version, silent = heard_of(home)
    words = [_Word(settings.DOMAIN_NAME, version, silent)]
    agree, heard = [], []
    for call, answer in zip(calls, peer_calls_send(calls, timeout=settings.LINK_PROBE_TIMEOUT_SECONDS), strict=True):
        if isinstance(answer, PeerError):
            continue
        silent_there = answer.get("silent_seconds")
        if not (silent_there is None or isinstance(silent_there, (int, float))):
            continue
        if "version" not in answer:  # (a witness of an older version: its own silence, as before)
            (agree if silent_there is None or silent_there >= threshold else heard).append(call.peer)
            continue
        there = answer["version"]
        words.append(_Word(call.peer, there if isinstance(there, int) else None, silent_there))
        agree.append(call.peer)
    if not agree and not heard:
        return False, f"no third domain answered about {home}"
    since, latest = _silence(words)
    if since is not None and since < threshold:
        heard += [w for w in latest if w != settings.DOMAIN_NAME and w not in heard]
        agree = [a for a in agree if a not in heard]
    if heard:
        return False, f"{', '.join(heard)} heard {home} within {threshold:g} s"
    if since is not None and since < threshold:
        return False, f"{home} heard here within {threshold:g} s"
    return True, f"{home} silent for {threshold:g} s here and at {', '.join(agree)}"
