"""A neighbour's forwarding call (POST /internal/v1/forward), read: its messages (those to store,
those refused alone, with the reason), receipts, FAST items, presence lists and the domains the
caller has no way on to. Strict: anything malformed refuses the whole call (PeerRefused, 400) and
nothing of it is stored (docs/protocol.md, "Between domains"). messaging.federation.inbound stores
what is read here."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from apps_registry.models import ClientApp
from messaging.core.next_hop import destination, way_on
from messaging.federation.presence_gossip import PresenceRefused, presence_parse
from messaging.federation.selectors import WaitingHere
from messaging.federation.senders import receipts
from messaging.federation.senders.fast_forward import fast_parse
from messaging.federation.takeover.records import network_parse
from messaging.federation.wire.transport import PeerRefused
from messaging.models import MessageKind

KINDS = tuple(k.value for k in MessageKind)
MAX_ITEMS = 10_000


@dataclass
class Incoming:
    ord: int
    app_id: int
    sender: str
    kind: str
    content: str
    reference: str
    confirm: bool
    cmid: str | None
    origin: str
    origin_id: int
    path: list[str]
    confirms: str
    recipients: list[str]
    revive: list[str]  # recipients whose dead copy here an operator's re-queue brings back
    hold: bool = False  # the sender has no other way: taken even where this domain has no way on now
    seqs: dict[str, int] = field(default_factory=dict)  # recipient -> its mailbox seq at the origin
    # recipient -> (another origin, seq): at the recipient's home, in only after that origin's message seq
    after: dict[str, tuple[str, int]] = field(default_factory=dict)
    served_here: list[str] = field(default_factory=list)  # recipients whose mailbox is here now
    in_order: list[str] = field(default_factory=list)  # of those, the ones put in order (messaging.federation.order)


def _refuse(reason: str, status: int = 400) -> PeerRefused:
    return PeerRefused(status, reason)


def _text(item: dict, key: str, where: str, *, max_len: int, empty: bool = True, null: bool = False) -> str | None:
    value = item.get(key)
    if value is None and null:
        return None
    if not isinstance(value, str) or len(value) > max_len or (not empty and not value):
        raise _refuse(f"{where}: {key} must be a{'' if empty else ' non-empty'} string of at most {max_len} characters")
    return value


def _whole(item: dict, key: str, where: str) -> int:
    value = item.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _refuse(f"{where}: {key} must be a positive whole number")
    return value


def _message_parse(ord_: int, item, *, sender_domain: str, apps: dict[str, int]) -> Incoming:
    where = f"messages[{ord_}]"
    if not isinstance(item, dict):
        raise _refuse(f"{where} must be an object")
    app_name = _text(item, "app", where, max_len=64, empty=False)
    kind = _text(item, "kind", where, max_len=16, empty=False)
    if kind not in KINDS:
        raise _refuse(f"{where}: kind must be one of {', '.join(KINDS)}")
    confirm = item.get("confirmation_requested")
    if not isinstance(confirm, bool):
        raise _refuse(f"{where}: confirmation_requested must be true or false")
    path = item.get("path")
    if (not isinstance(path, list) or not path
            or not all(isinstance(d, str) and d and len(d) <= 64 and "," not in d for d in path)):
        raise _refuse(f"{where}: path must be a non-empty list of domain names")
    origin = _text(item, "origin_domain", where, max_len=64, empty=False)
    if path[0] != origin or path[-1] != sender_domain:
        raise _refuse(f"{where}: path must run from the origin domain ({origin}) to the calling domain ({sender_domain})")
    recipients = item.get("recipients")
    if (not isinstance(recipients, list) or not recipients
            or not all(isinstance(r, str) and r and len(r) <= 96 for r in recipients)):
        raise _refuse(f"{where}: recipients must be a non-empty list of user ids")
    confirms = _text(item, "confirms", where, max_len=100)
    if confirms:
        c_domain, _, c_id = confirms.rpartition(":")
        if not c_domain or not c_id.isascii() or not c_id.isdigit():
            raise _refuse(f"{where}: confirms must be \"<origin domain>:<message id>\"")
    incoming = Incoming(
        ord=ord_, app_id=0, sender=_text(item, "sender", where, max_len=96, empty=False), kind=kind,
        content=_text(item, "content", where, max_len=1_000_000), reference=_text(item, "reference", where, max_len=256),
        confirm=confirm, cmid=_text(item, "client_message_id", where, max_len=128, null=True), origin=origin,
        origin_id=_whole(item, "origin_message_id", where), path=path, confirms=confirms,
        recipients=sorted(set(recipients)), revive=[],
    )
    revive = item.get("revive", [])
    if not isinstance(revive, list) or not set(revive) <= set(incoming.recipients):
        raise _refuse(f"{where}: revive must be a list of the message's recipients")
    incoming.revive = sorted(set(revive))
    hold = item.get("hold", False)
    if not isinstance(hold, bool):
        raise _refuse(f"{where}: hold must be true or false")
    incoming.hold = hold
    seqs = item.get("seqs", {})
    if (not isinstance(seqs, dict) or not set(seqs) <= set(incoming.recipients)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in seqs.values())):
        raise _refuse(f"{where}: seqs must map recipients of the message to positive whole numbers")
    incoming.seqs = seqs
    after = item.get("after", {})
    if (not isinstance(after, dict) or not set(after) <= set(incoming.recipients)
            or not all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and 0 < len(v[0]) <= 64
                       and isinstance(v[1], int) and not isinstance(v[1], bool) and v[1] > 0 for v in after.values())):
        raise _refuse(f"{where}: after must map recipients of the message to [origin domain, positive whole number]")
    incoming.after = {r: (v[0], v[1]) for r, v in after.items()}
    incoming.app_id = apps.get(app_name, 0)
    return incoming


def _refusal(item: Incoming, app_name: str) -> str:
    """Why this domain does not take a well-formed message ('' if it does): reasons of the message's
    own, which refuse it alone."""
    if not item.app_id:
        return f"app {app_name!r} is not known in {settings.DOMAIN_NAME}"
    if len(item.path) > settings.FORWARD_HOP_LIMIT:
        return f"hop limit ({settings.FORWARD_HOP_LIMIT}) exceeded: {len(item.path)} hops"
    return ""


class _WayOn:
    """The homes of an item's recipients this domain has no way on to now (messaging.core.next_hop.way_on; its links
    there are down, or lead only back). Such an item is refused with `blocked` (its sender routes it
    another way, or keeps it), unless its recipient's earlier messages wait here: it waits behind
    them rather than overtake them another way (the sweep hands the queue back as a whole)."""

    def __init__(self):
        self.known: dict[tuple[str, tuple[str, ...]], bool] = {}
        self.queued = WaitingHere()

    def blocked(self, item: Incoming) -> list[str]:
        out = set()
        for recipient in item.recipients:
            home = destination(recipient)
            if home is None:
                continue
            key = (home, tuple(item.path))
            if key not in self.known:
                self.known[key] = way_on(home, visited=item.path) is None
            if self.known[key] and not self.queued.waiting(item.app_id, recipient):
                out.add(home)
        return sorted(out)


@dataclass
class Parsed:
    messages: list[Incoming]  # those to store
    refused: list[dict]  # {"index", "reason"} of those refused alone
    receipts: list[dict]
    fast: list[dict]  # FAST items: pushed here, or carried on (never stored)
    blocked: list[str]  # the domains the caller has no way on to now (it hands back their items)
    presence: list[dict]  # domains' lists of online users (messaging.federation.presence_gossip)
    network: dict | None = None  # clocks heard and takeovers (messaging.federation.takeover.take)


def payload_parse(*, sender: str, payload: dict) -> Parsed:
    """The call's messages (those to store, those refused alone) and receipts, or PeerRefused
    naming what is wrong with the call."""
    unknown = set(payload) - {"messages", "receipts", "fast", "blocked", "presence", "network"}
    if unknown:
        raise _refuse(f"unknown field(s): {', '.join(sorted(unknown))}")
    blocked = payload.get("blocked", [])
    if (not isinstance(blocked, list) or len(blocked) > 1000
            or not all(isinstance(d, str) and d and len(d) <= 64 for d in blocked)):
        raise _refuse("blocked must be a list of domain names")
    messages, receipt_items = payload.get("messages", []), payload.get("receipts", [])
    fast_items = payload.get("fast", [])
    if not isinstance(messages, list) or not isinstance(receipt_items, list) or not isinstance(fast_items, list):
        raise _refuse("messages, receipts and fast must be lists")
    if len(messages) + len(receipt_items) + len(fast_items) > MAX_ITEMS:
        raise _refuse(f"more than {MAX_ITEMS} items in one call", 413)
    names = {m.get("app") for m in messages if isinstance(m, dict) and isinstance(m.get("app"), str)}
    apps = dict(ClientApp.objects.filter(app_name__in=names).values_list("app_name", "pk"))
    parsed = [_message_parse(i, item, sender_domain=sender, apps=apps) for i, item in enumerate(messages)]
    taken, refused = [], []
    ways = _WayOn()
    for incoming, item in zip(parsed, messages, strict=True):
        reason = _refusal(incoming, item["app"])
        stuck = [] if reason or incoming.hold else ways.blocked(incoming)
        if reason:
            refused.append({"index": incoming.ord, "reason": reason})
        elif stuck:
            refused.append({"index": incoming.ord, "blocked": stuck,
                            "reason": f"{settings.DOMAIN_NAME} has no way on to {', '.join(stuck)} now"})
        else:
            taken.append(incoming)
    presence = payload.get("presence", [])
    if not isinstance(presence, list) or len(presence) > MAX_ITEMS:
        raise _refuse(f"presence must be a list of at most {MAX_ITEMS} lists")
    try:
        presence = [presence_parse(i, item) for i, item in enumerate(presence)]
    except PresenceRefused as exc:
        raise _refuse(str(exc)) from None
    network = network_parse(payload["network"]) if "network" in payload else None
    return Parsed(messages=taken, refused=refused, blocked=sorted(set(blocked)), presence=presence, network=network,
                  receipts=[receipts.receipt_parse(i, item, sender=sender) for i, item in enumerate(receipt_items)],
                  fast=[fast_parse(i, item, sender=sender) for i, item in enumerate(fast_items)])
