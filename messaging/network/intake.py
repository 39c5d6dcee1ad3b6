"""What a domain does with the deliveries, confirmations and receipts a neighbour forwards
(POST /internal/v1/forward, after messaging.network.transport has checked the call).

The payload is {"messages": [...], "receipts": [...]} (docs/protocol.md, "Between domains"). It is
validated strictly (anything malformed is refused with 400 and nothing of the call is stored); a
message this domain cannot take for a reason of its own (its app unknown here, over the hop limit)
is refused alone, in the answer's `refused` list by its index in the payload, and the rest of the
call is stored. Every message taken is stored in one transaction before the answer: the neighbour
marks its rows `forwarded` on our 2xx, so an answer must mean "stored here" for all but the
refused.

FAST items (`fast`) are never stored: messaging.network.fast_forward pushes them to the
recipients homed here and carries the others on.

A message is stored once per domain, keyed by (origin domain, id there) (message_forwarded_once):
a repeated call stores nothing new. A later call may bring other recipients of a message already
here (its rows were split over two calls, or re-routed): those get their deliveries added. The
recipients get ordinary deliveries, in payload order for each recipient (that is how the order of
one sender's messages to one recipient is kept across domains), routed once committed through
messaging.handoff: pushed here if their home is here, forwarded again otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps_registry.models import ClientApp
from foundation.db import hot_cursor
from messaging.delivery.sql import DEAD, FORWARDED, PENDING
from messaging.handoff import routing_enqueue
from messaging.models import MessageKind
from messaging.network import receipts
from messaging.network.fast_forward import fast_accept, fast_parse
from messaging.network.links import destination, link_received, route_blocked, route_holding, way_on
from messaging.network.presence_gossip import PresenceRefused, presence_accept, presence_parse
from messaging.network.selectors import WaitingHere
from messaging.network.transport import PeerRefused
from messaging.store import deliveries_append_sql, messages_insert_sql

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
    """The homes of an item's recipients this domain has no way on to now (links.way_on; its links
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
    presence: list[dict]  # domains' lists of online users (messaging.network.presence_gossip)


def payload_parse(*, sender: str, payload: dict) -> Parsed:
    """The call's messages (those to store, those refused alone) and receipts, or PeerRefused
    naming what is wrong with the call."""
    unknown = set(payload) - {"messages", "receipts", "fast", "blocked", "presence"}
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
    return Parsed(messages=taken, refused=refused, blocked=sorted(set(blocked)), presence=presence,
                  receipts=[receipts.receipt_parse(i, item, sender=sender) for i, item in enumerate(receipt_items)],
                  fast=[fast_parse(i, item, sender=sender) for i, item in enumerate(fast_items)])


_LOCK_SQL = """
SELECT k.ord, m.id FROM messaging_message m
  JOIN unnest(%(ord)s::int[], %(origin)s::text[], %(oid)s::bigint[]) AS k(ord, origin, oid)
    ON (m.origin_domain = k.origin AND m.origin_message_id = k.oid)
    OR (k.origin = %(here)s AND m.id = k.oid AND m.origin_message_id IS NULL)
 ORDER BY m.id FOR UPDATE OF m
"""

_STORE_SQL = f"""
WITH msgs AS (
    SELECT * FROM unnest(%(ord)s::int[], %(app)s::bigint[], %(sender)s::text[], %(kind)s::text[],
                         %(content)s::text[], %(reference)s::text[], %(confirm)s::bool[], %(cmid)s::text[],
                         %(origin)s::text[], %(confirms)s::bigint[], %(origin_id)s::bigint[], %(path)s::text[],
                         %(confirms_origin)s::text[])
           AS t(ord, app_id, sender, kind, content, reference, confirm, cmid, origin, confirms, origin_id, path,
                confirms_origin)
), rcpts AS (
    SELECT * FROM unnest(%(r_ord)s::int[], %(r_user)s::text[]) AS t(ord, recipient)
), {messages_insert_sql("msgs", forwarded=True)}, old AS (
    SELECT t.* FROM unnest(%(o_ord)s::int[], %(o_mid)s::bigint[], %(o_app)s::bigint[], %(o_user)s::text[])
                 AS t(ord, message_id, app_id, recipient)
     WHERE NOT EXISTS (SELECT 1 FROM messaging_delivery d
                        WHERE d.message_id = t.message_id AND d.recipient = t.recipient)
), fan AS MATERIALIZED (
    SELECT st.ord, st.id AS message_id, st.app_id, r.recipient FROM stored st JOIN rcpts r USING (ord)
    UNION ALL
    SELECT ord, message_id, app_id, recipient FROM old
), {deliveries_append_sql("fan")}
SELECT ARRAY(SELECT ord FROM stored), ARRAY(SELECT id FROM new_deliveries ORDER BY id)
"""


def _local_confirmed(items: list[Incoming]) -> dict[int, int]:
    """ord -> local id of the message a confirmation confirms, where that message was stored here
    first (and still is)."""
    here = settings.DOMAIN_NAME
    wanted = {}
    for m in items:
        domain, _, mid = m.confirms.rpartition(":")
        if m.confirms and domain == here:
            wanted[m.ord] = int(mid)
    if not wanted:
        return {}
    with hot_cursor() as cur:
        cur.execute("SELECT id FROM messaging_message WHERE id = ANY(%s::bigint[]) AND origin_message_id IS NULL",
                    [sorted(set(wanted.values()))])
        found = {row[0] for row in cur.fetchall()}
    return {o: mid for o, mid in wanted.items() if mid in found}


def _store_pass(items: list[Incoming], sender: str) -> tuple[set[int], list[int], int]:
    """One pass: lock the messages of `items` already here, then (one statement) insert the others
    and append the deliveries not there yet. Returns (ords handled, new delivery ids, pairs already
    there).

    The race this order prevents: two calls bringing the same message with a new recipient (two
    neighbours re-routing, or a retried call overlapping the first) must not both add that
    recipient. The existing message's row is locked first, so the second call waits for the first to
    commit, and its insert statement, started after the lock was granted, sees the first call's
    deliveries (READ COMMITTED takes a new snapshot per statement) and skips them. A message that is
    new to both calls is settled by the unique key: the second insert waits for the first and then
    inserts nothing; that message is handled in the next pass, as an existing one.
    """
    here = settings.DOMAIN_NAME
    with hot_cursor() as cur:
        cur.execute(_LOCK_SQL, {"ord": [m.ord for m in items], "origin": [m.origin for m in items],
                                "oid": [m.origin_id for m in items], "here": here})
        existing = dict(cur.fetchall())
    confirmed = _local_confirmed([m for m in items if m.ord not in existing])
    new = [m for m in items if m.ord not in existing]
    old = [m for m in items if m.ord in existing]
    params = {
        "ord": [m.ord for m in new], "app": [m.app_id for m in new], "sender": [m.sender for m in new],
        "kind": [m.kind for m in new], "content": [m.content for m in new], "reference": [m.reference for m in new],
        "confirm": [m.confirm for m in new], "cmid": [m.cmid for m in new], "origin": [m.origin for m in new],
        "confirms": [confirmed.get(m.ord) for m in new], "origin_id": [m.origin_id for m in new],
        "path": [",".join(m.path) for m in new],
        "confirms_origin": ["" if m.ord in confirmed else m.confirms for m in new],
        "r_ord": [m.ord for m in new for _ in m.recipients], "r_user": [r for m in new for r in m.recipients],
        "o_ord": [m.ord for m in old for _ in m.recipients], "o_mid": [existing[m.ord] for m in old for _ in m.recipients],
        "o_app": [m.app_id for m in old for _ in m.recipients], "o_user": [r for m in old for r in m.recipients],
    }
    with hot_cursor() as cur:
        cur.execute(_STORE_SQL, params)
        stored_ords, delivery_ids = cur.fetchone()
    revived = _revive([(existing[m.ord], r) for m in old for r in m.revive])
    revived += _take_back([(existing[m.ord], r) for m in old for r in m.recipients], sender)
    handled = {m.ord for m in old} | set(stored_ords)
    pairs = sum(len(m.recipients) for m in items if m.ord in handled)
    return handled, list(delivery_ids) + revived, pairs - len(delivery_ids) - len(revived)


def _route_again(pairs: list[tuple[int, str]], *, where: str, params: list, set_also: str = "") -> list[int]:
    """Copies here of (message, recipient) matching `where`, pending again (routed once this
    transaction commits, the routing deadline as their timer), with `set_also`: their ids."""
    if not pairs:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            UPDATE messaging_delivery d
               SET state = {PENDING}, claim = NULL, next_attempt_at = now() + make_interval(secs => %s)
                   {", " + set_also if set_also else ""}
              FROM unnest(%s::bigint[], %s::text[]) AS t(message_id, recipient)
             WHERE d.message_id = t.message_id AND d.recipient = t.recipient AND {where}
            RETURNING d.id
            """,
            [float(settings.ROUTING_DEADLINE_SECONDS), [m for m, _ in pairs], [r for _, r in pairs], *params],
        )
        return [row[0] for row in cur.fetchall()]


def _revive(pairs: list[tuple[int, str]]) -> list[int]:
    """Dead copies here of (message, recipient) that an operator re-queued at the origin: a fresh
    set of attempts, routed again (and passed on with `revive` where their home is further on)."""
    return _route_again(pairs, set_also="attempts = 0, dead_at = NULL, revive = true, "
                                        "last_error = 're-queued by an operator'",
                        where=f"d.state = {DEAD}", params=[])


def _take_back(pairs: list[tuple[int, str]], sender: str) -> list[int]:
    """Copies here of (message, recipient) this domain had passed on to `sender`, which now sends
    them back: it had no way on for them (a hand-back), or routed them back here round a broken
    link. They are routed again from here (where `sender` said it has no way on, around it), with
    the attempts they have; a call `sender` merely repeats never finds such a copy (its copy went on
    elsewhere, or is still here waiting)."""
    return _route_again(pairs, where=f"d.state = {FORWARDED} AND d.forward_to = %s", params=[sender])


def _revive_passed_on(items: list[Incoming], delivery_ids: list[int]) -> None:
    """A re-queued dead letter new here (it came another way than the first time) gets a new
    delivery marked `revive`, which carries the re-queue on to where the copy that died is."""
    pairs = [(m.origin, m.origin_id, r) for m in items for r in m.revive]
    if pairs and delivery_ids:
        with hot_cursor() as cur:
            cur.execute("UPDATE messaging_delivery d SET revive = true FROM unnest(%s::text[], %s::bigint[], %s::text[])"
                        " AS t(origin, oid, recipient), messaging_message m WHERE m.origin_domain = t.origin"
                        " AND m.origin_message_id = t.oid AND d.message_id = m.id AND d.recipient = t.recipient"
                        " AND d.id = ANY(%s::bigint[])", [*map(list, zip(*pairs, strict=True)), delivery_ids])


def messages_store_forwarded(items: list[Incoming], *, sender: str) -> tuple[int, int]:
    """Store a call's messages (inside the caller's transaction); (new deliveries, duplicates).
    Routing gets the new deliveries once the transaction commits."""
    delivery_ids: list[int] = []
    duplicates = 0
    todo = items
    for _ in range(2):
        if not todo:
            break
        handled, ids, dups = _store_pass(todo, sender)
        delivery_ids += ids
        duplicates += dups
        todo = [m for m in todo if m.ord not in handled]
    # Neither stored nor here after two passes: the message collided with another unique key (a
    # second confirmation of one message, message_confirmed_once): a duplicate, not an error.
    duplicates += sum(len(m.recipients) for m in todo)
    _revive_passed_on(items, delivery_ids)
    if delivery_ids:
        transaction.on_commit(lambda: routing_enqueue(delivery_ids))
    return len(delivery_ids), duplicates


def forward_accept(*, sender: str, payload: dict) -> dict:
    """Store (messages) and apply (receipts) what `sender` forwards, all before answering
    {"stored": new deliveries, "duplicates": deliveries already here, "receipts": receipts applied,
    "refused": [{"index": i, "reason": ...}] (messages refused alone), and, for a call with FAST
    items, "fast": connections reached here}."""
    parsed = payload_parse(sender=sender, payload=payload)
    route_blocked(peer=sender, targets=parsed.blocked)
    route_holding(peer=sender, targets={home for m in parsed.messages if m.hold for r in m.recipients
                                        if (home := destination(r))})
    with transaction.atomic():
        stored, duplicates = messages_store_forwarded(parsed.messages, sender=sender)
        applied = receipts.receipts_apply(parsed.receipts)
    link_received(peer=sender, count=len(parsed.messages) + len(parsed.receipts) + len(parsed.fast))
    answer = {"stored": stored, "duplicates": duplicates, "receipts": applied, "refused": parsed.refused}
    if parsed.fast:
        answer["fast"] = fast_accept(parsed.fast)  # after the commit: connections reached here
    if parsed.presence:
        answer["presence"] = presence_accept(parsed.presence)
    return answer
