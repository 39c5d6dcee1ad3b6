"""Link probes: a signed ping to every neighbour over an enabled link (a liveness-only one too), so each link's state is live
without traffic (beat, every LINK_PROBE_SECONDS; the admin's "probe now").

The pings go out at once (transport.peer_calls_send), each bounded by LINK_PROBE_TIMEOUT_SECONDS
for the whole exchange, so one dead neighbour does not delay the others' verdicts. A neighbour that answers is up at once and, if it was down,
gets its queues sent now (foundation.handoff.link_recovered_enqueue) rather than at their next
retry; except where the last failure was a call it answered with an error (it answers pings but
fails the link's calls): those wait for the retry their failure earned (links.link_ping_answered). A disabled link is not probed (the admin shows it as disabled).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from foundation import handoff
from messaging.core.next_hop import neighbours
from messaging.federation.links import link_failed, link_ping_answered
from messaging.federation.models import LinkHealth
from messaging.federation.wire.transport import (
    PING_PATH,
    PeerCall,
    PeerError,
    liveness_peers,
    peer_call_prepare,
    peer_calls_send,
)


@dataclass(frozen=True)
class ProbeResult:
    peer: str
    ok: bool
    error: str = ""
    recovered: bool = False  # it was down and answers again
    held_back: bool = False  # it answers, but its last failure was a call it answered with an error


def _verdict(call: PeerCall, answer: dict | PeerError) -> str:
    """'' when the neighbour answered as itself, else why not."""
    if isinstance(answer, PeerError):
        return answer.reason
    answered_as = answer.get("domain") if isinstance(answer, dict) else None
    if answered_as != call.peer:
        # The URL configured for the neighbour reaches another domain (or something else).
        return f"{call.peer}: the ping was answered by {str(answered_as)[:64]}"
    return ""


def links_probe(*, peers: list[str] | None = None) -> list[ProbeResult]:
    """Ping every neighbour over an enabled link (or those of them among `peers`) and record each
    link's health. A disabled link is never probed: its failure would say nothing about the peer."""
    linked = liveness_peers()  # (a liveness-only link too: its health is the console's, and its gossip's)
    targets = linked if peers is None else sorted(set(peers) & set(linked))
    carrying = set(neighbours())
    was_down = set(LinkHealth.objects.filter(peer__in=targets, up=False).values_list("peer", flat=True))
    errors: dict[str, str] = {}
    calls: list[PeerCall] = []
    for peer in targets:
        try:
            calls.append(peer_call_prepare(peer=peer, path=PING_PATH, payload={}))
        except PeerError as exc:  # no link, disabled, no URL: nothing to send
            errors[peer] = exc.reason
    answers = peer_calls_send(calls, timeout=settings.LINK_PROBE_TIMEOUT_SECONDS) if calls else []
    for call, answer in zip(calls, answers, strict=True):
        errors[call.peer] = _verdict(call, answer)
    results = []
    for peer in targets:
        error = errors[peer]
        if error:
            link_failed(peer=peer, error=error)
            results.append(ProbeResult(peer, ok=False, error=error))
            continue
        clear = link_ping_answered(peer)
        recovered = clear and peer in was_down
        if recovered and peer in carrying:  # (a liveness-only link has no queue to send)
            handoff.link_recovered_enqueue(peer)
        results.append(ProbeResult(peer, ok=True, recovered=recovered, held_back=not clear))
    return results
