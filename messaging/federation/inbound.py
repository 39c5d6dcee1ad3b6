"""What a domain does with the deliveries, confirmations and receipts a neighbour forwards
(POST /internal/v1/forward, after messaging.federation.wire.transport has checked the call).

The payload is {"messages": [...], "receipts": [...]} (docs/protocol.md, "Between domains"), read
by messaging.federation.wire.forward_payload. It is validated strictly (anything malformed is refused with 400 and nothing of the call is stored); a
message this domain cannot take for a reason of its own (its app unknown here, over the hop limit)
is refused alone, in the answer's `refused` list by its index in the payload, and the rest of the
call is stored. Every message taken is stored in one transaction before the answer: the neighbour
marks its rows `forwarded` on our 2xx, so an answer must mean "stored here" for all but the
refused.

FAST items (`fast`) are never stored: messaging.federation.senders.fast_forward pushes them to the
recipients homed here and carries the others on.

A message is stored once per domain, keyed by (origin domain, id there) (message_forwarded_once):
a repeated call stores nothing new. A later call may bring other recipients of a message already
here (its rows were split over two calls, or re-routed): those get their deliveries added. The
recipients get ordinary deliveries, in payload order for each recipient (that is how the order of
one sender's messages to one recipient is kept across domains), routed once committed through
foundation.handoff: pushed here if their home is here, forwarded again otherwise.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from psycopg.types.json import Jsonb

from foundation.db import hot_cursor
from foundation.handoff import routing_enqueue
from messaging.core.delivery.sql import DEAD, FORWARDED, PENDING, in_mailbox_sql
from messaging.core.next_hop import destination
from messaging.core.store import deliveries_append_sql, messages_insert_sql
from messaging.federation.links import link_received, route_blocked, route_holding
from messaging.federation.order import Arrival, Placed, arrivals_put_in_order
from messaging.federation.presence_gossip import presence_accept
from messaging.federation.senders import receipts
from messaging.federation.senders.fast_forward import fast_accept
from messaging.federation.takeover.records import network_accept
from messaging.federation.wire.forward_payload import Incoming, payload_parse

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
                         %(confirms_origin)s::text[], %(order_after)s::jsonb[])
           AS t(ord, app_id, sender, kind, content, reference, confirm, cmid, origin, confirms, origin_id, path,
                confirms_origin, order_after)
), rcpts AS (
    SELECT * FROM unnest(%(r_ord)s::int[], %(r_user)s::text[], %(r_oseq)s::bigint[]) AS t(ord, recipient, origin_seq)
), {messages_insert_sql("msgs", forwarded=True)}, old AS (
    SELECT t.* FROM unnest(%(o_ord)s::int[], %(o_mid)s::bigint[], %(o_app)s::bigint[], %(o_user)s::text[],
                           %(o_oseq)s::bigint[])
                 AS t(ord, message_id, app_id, recipient, origin_seq)
     WHERE NOT EXISTS (SELECT 1 FROM messaging_delivery d
                        WHERE d.message_id = t.message_id AND d.recipient = t.recipient)
), fan AS MATERIALIZED (
    SELECT st.ord, st.id AS message_id, st.app_id, r.recipient, r.origin_seq FROM stored st JOIN rcpts r USING (ord)
    UNION ALL
    SELECT ord, message_id, app_id, recipient, origin_seq FROM old
), {deliveries_append_sql("fan", origin_seq=True)}
SELECT ARRAY(SELECT ord FROM stored ORDER BY ord), ARRAY(SELECT id FROM stored ORDER BY ord),
       ARRAY(SELECT id FROM new_deliveries ORDER BY id)
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


def _store_pass(items: list[Incoming], sender: str) -> tuple[set[int], list[int], int, int]:
    """One pass: lock the messages of `items` already here, then (one statement) insert the others
    and append the deliveries not there yet; the recipients homed here whose origin sent its
    sequence go in by the origin's order (messaging.federation.order), held where an earlier one is
    still on its way. Returns (ords handled, new delivery ids, pairs already there, pairs held).

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
        "order_after": [Jsonb({r: list(v) for r, v in m.after.items()}) if m.after else None for m in new],
        "confirms_origin": ["" if m.ord in confirmed else m.confirms for m in new],
        "r_ord": [m.ord for m in new for r in m.recipients if r not in m.in_order],
        "r_user": [r for m in new for r in m.recipients if r not in m.in_order],
        "r_oseq": [m.seqs.get(r) for m in new for r in m.recipients if r not in m.in_order],
        "o_ord": [m.ord for m in old for r in m.recipients if r not in m.in_order],
        "o_mid": [existing[m.ord] for m in old for r in m.recipients if r not in m.in_order],
        "o_app": [m.app_id for m in old for r in m.recipients if r not in m.in_order],
        "o_user": [r for m in old for r in m.recipients if r not in m.in_order],
        "o_oseq": [m.seqs.get(r) for m in old for r in m.recipients if r not in m.in_order],
    }
    with hot_cursor() as cur:
        cur.execute(_STORE_SQL, params)
        stored_ords, stored_ids, delivery_ids = cur.fetchone()
    ids = {**{m.ord: existing[m.ord] for m in old}, **dict(zip(stored_ords, stored_ids, strict=True))}
    placed = arrivals_put_in_order(
        [Arrival(ids[m.ord], m.app_id, r, m.origin, m.seqs[r], m.sender, m.after.get(r)) for m in items if m.ord in ids
         for r in m.in_order],
        maybe_here=set(existing.values()))
    revived = _revive([(existing[m.ord], r) for m in old for r in m.revive])
    revived += _served_here_again([(existing[m.ord], r) for m in old for r in m.served_here if r not in m.in_order])
    revived += _take_back([(existing[m.ord], r) for m in old for r in m.recipients], sender)
    handled = {m.ord for m in old} | set(stored_ords)
    pairs = sum(len(m.recipients) for m in items if m.ord in handled)
    new_ids = list(delivery_ids) + placed.delivery_ids
    return handled, new_ids + revived, pairs - len(new_ids) - placed.held - len(revived), placed.held


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


def _served_here_again(pairs: list[tuple[int, str]]) -> list[int]:
    """This domain's records of messages it passed on to recipients it serves again now (it holds
    them for their lost home, or got them back from their holder), with no row in their mailbox
    here: the message came back (round a fault, or from the holder), and the record becomes the
    mailbox row, at its place (the standby feed takes it as new, migration 0023). Without this the
    record would answer "already here" and the message would reach no one."""
    return _route_again(pairs, where=f"d.state = {FORWARDED} AND d.forward_to <> '' AND NOT {in_mailbox_sql('d')}",
                        params=[], set_also="forward_to = ''")


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


def _repeats_in_order(items: list[Incoming]) -> Placed:
    """Messages that repeat one stored here under another identity (a sender's clientMessageId
    sent again at another domain after a doubt: its first send was stored here by the domain that
    served the sender then, which was lost before it answered) still take their places in their
    origin's order for the recipients homed here, as the message they repeat: without that their
    origin's next messages waited NETWORK_ORDER_WAIT_SECONDS for one that never comes, and went
    in after the sender's later ones (three in one fault run). The message it repeats goes into
    the mailbox only where it is not there already."""
    if not items:
        return Placed([], 0)
    with hot_cursor() as cur:
        cur.execute(
            """
            SELECT t.ord, m.id FROM unnest(%s::int[], %s::bigint[], %s::text[], %s::text[]) AS t(ord, app_id, sender, cmid)
              JOIN messaging_message m ON m.app_id = t.app_id AND m.sender = t.sender AND m.client_message_id = t.cmid
            """,
            [[m.ord for m in items], [m.app_id for m in items], [m.sender for m in items], [m.cmid for m in items]],
        )
        repeated = dict(cur.fetchall())
    arrivals = [Arrival(repeated[m.ord], m.app_id, r, m.origin, m.seqs[r], m.sender, m.after.get(r))
                for m in items if m.ord in repeated for r in m.in_order]
    return arrivals_put_in_order(arrivals) if arrivals else Placed([], 0)


def messages_store_forwarded(items: list[Incoming], *, sender: str) -> tuple[int, int]:
    """Store a call's messages (inside the caller's transaction); (deliveries new here, held in
    order among them; duplicates). Routing gets the new deliveries once the transaction commits."""
    delivery_ids: list[int] = []
    duplicates = held = 0
    here = settings.DOMAIN_NAME
    for m in items:
        m.served_here = [r for r in m.recipients if destination(r) is None]
        # (a message stored here first that came back keeps the place it took here: not ordered again)
        m.in_order = [r for r in m.served_here if r in m.seqs and m.origin != here]
    todo = items
    for _ in range(2):
        if not todo:
            break
        handled, ids, dups, waiting = _store_pass(todo, sender)
        delivery_ids += ids
        duplicates += dups
        held += waiting
        todo = [m for m in todo if m.ord not in handled]
    # Neither stored nor here after two passes: the message collided with another unique key (a
    # second confirmation of one message, message_confirmed_once; the same clientMessageId of the
    # same sender, stored here under another origin): a duplicate, not an error. Its place in its
    # origin's order is taken all the same, by the message it repeats.
    placed = _repeats_in_order([m for m in todo if m.in_order])
    delivery_ids += placed.delivery_ids
    held += placed.held
    duplicates += sum(len(m.recipients) for m in todo)
    _revive_passed_on(items, delivery_ids)
    if delivery_ids:
        transaction.on_commit(lambda: routing_enqueue(delivery_ids))
    return len(delivery_ids) + held, duplicates


def forward_accept(*, sender: str, payload: dict) -> dict:
    """Store (messages) and apply (receipts) what `sender` forwards, all before answering
    {"stored": new deliveries, "duplicates": deliveries already here, "receipts": receipts applied,
    "refused": [{"index": i, "reason": ...}] (messages refused alone), for a call with FAST
    items "fast": connections reached here, and where takeover records of its `network` were
    refused, "takeovers_refused": [{"index": i, "reason": ...}]}."""
    parsed = payload_parse(sender=sender, payload=payload)
    route_blocked(peer=sender, targets=parsed.blocked)
    route_holding(peer=sender, targets={home for m in parsed.messages if m.hold for r in m.recipients
                                        if (home := destination(r))})
    taken = None
    if parsed.network is not None:  # first: a takeover told here routes the messages of this call
        taken = network_accept(parsed.network, sender=sender)
    with transaction.atomic():
        stored, duplicates = messages_store_forwarded(parsed.messages, sender=sender)
        applied = receipts.receipts_apply(parsed.receipts)
    link_received(peer=sender, count=len(parsed.messages) + len(parsed.receipts) + len(parsed.fast))
    answer = {"stored": stored, "duplicates": duplicates, "receipts": applied, "refused": parsed.refused}
    if parsed.fast:
        answer["fast"] = fast_accept(parsed.fast)  # after the commit: connections reached here
    if parsed.presence:
        answer["presence"] = presence_accept(parsed.presence)
    if taken is not None and taken.refused:
        answer["takeovers_refused"] = taken.refused
    return answer
