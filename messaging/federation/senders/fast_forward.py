"""FAST messages to users homed in other domains: carried hop by hop to the recipient's home and
pushed to its live connections there, with FAST's promise and no more (never stored, never
retried: a neighbour that does not answer, or a recipient who is not connected at home, does not
get it).

The sending domain hands the item to a worker (foundation.handoff.fast_forward_enqueue; a call waits
on a neighbour, never on a client's socket or a request). `fast_forward` groups the recipients by
their next hop (messaging.core.next_hop.next_hop, never back through a domain the item passed) and makes one signed
call per hop, `{"fast": [item]}` on /internal/v1/forward, within FORWARD_TIMEOUT_SECONDS. The
receiver (`fast_accept`, from messaging.federation.inbound) pushes to the recipients homed there and
hands the others on the same way. An item carries its `path` (origin first, the calling domain
last) and goes at most FORWARD_HOP_LIMIT hops.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.conf import settings
from prometheus_client import Counter

from apps_registry.selectors import app_snapshot
from messaging.core.delivery.fast import fast_item, message_fast_send
from messaging.core.next_hop import next_hop
from messaging.federation.wire.transport import FORWARD_PATH, PeerError, PeerRefused, peer_call

log = logging.getLogger(__name__)

FAST_FORWARDED = Counter("switchboard_fast_forwarded_total",
                         "FAST items carried to a neighbour, by outcome (sent, failed: dropped, as FAST is)",
                         ["outcome"])


def fast_forward(item: dict) -> dict[str, str]:
    """Carry a FAST item one hop towards each of its recipients' homes (the task's body); returns
    each hop's outcome ("sent", or why not). Nothing is kept or retried."""
    app = app_snapshot(item["app"])
    if app is None:
        return {}
    by_hop: dict[str, list[str]] = defaultdict(list)
    for recipient in item["recipients"]:
        home = app.home_of(recipient)
        hop = next_hop(home, visited=item["path"], back=False) if home and home != settings.DOMAIN_NAME else None
        if hop:
            by_hop[hop].append(recipient)
    outcomes = {}
    for hop, recipients in sorted(by_hop.items()):
        try:
            peer_call(peer=hop, path=FORWARD_PATH, payload={"fast": [{**item, "recipients": recipients}]})
        except PeerError as exc:
            FAST_FORWARDED.labels("failed").inc(len(recipients))
            log.info("FAST item for %d recipient(s) not carried to %s: %s", len(recipients), hop, exc.reason)
            outcomes[hop] = exc.reason
            continue
        FAST_FORWARDED.labels("sent").inc(len(recipients))
        outcomes[hop] = "sent"
    return outcomes


def fast_parse(ord_: int, item, *, sender: str) -> dict:
    """A FAST item of a call from `sender`, checked (PeerRefused 400 otherwise)."""
    where = f"fast[{ord_}]"
    if not isinstance(item, dict):
        raise PeerRefused(400, f"{where} must be an object")
    for key, max_len in (("app", 64), ("sender", 96), ("content", 1_000_000), ("reference", 256)):
        if not isinstance(item.get(key), str) or len(item[key]) > max_len or (key in ("app", "sender") and not item[key]):
            raise PeerRefused(400, f"{where}: {key} must be a string of at most {max_len} characters")
    recipients, path = item.get("recipients"), item.get("path")
    if (not isinstance(recipients, list) or not recipients
            or not all(isinstance(r, str) and r and len(r) <= 96 for r in recipients)):
        raise PeerRefused(400, f"{where}: recipients must be a non-empty list of user ids")
    if (not isinstance(path, list) or not path or path[-1] != sender
            or not all(isinstance(d, str) and d and len(d) <= 64 and "," not in d for d in path)):
        raise PeerRefused(400, f"{where}: path must be a list of domain names ending with the calling domain")
    return fast_item(app_name=item["app"], sender=item["sender"], content=item["content"],
                     reference=item["reference"], recipients=recipients, path=path)


def fast_accept(items: list[dict]) -> int:
    """FAST items a neighbour carried here: pushed to the recipients homed here (the connections
    reached are returned), handed on towards the others. An app unknown here, or an item past
    the hop limit, goes no further (FAST: nothing to refuse or keep)."""
    reached = 0
    for item in items:
        app = app_snapshot(item["app"])
        if app is None or len(item["path"]) > settings.FORWARD_HOP_LIMIT:
            continue
        users = [r for r in item["recipients"] if app.home_of(r) is not None]  # the app's users only
        if users:
            reached += message_fast_send(app=app, sender=item["sender"], recipients=users, content=item["content"],
                                         reference=item["reference"], path=item["path"])
    return reached
