"""Where a reliable message is stored: the message rows, a mailbox sequence and a delivery row per
recipient, for a whole batch of messages in one statement (so one transaction and one round trip),
before anything is acknowledged. Once committed, the deliveries are handed to routing through the
door of foundation.handoff (or the web node's routing batcher, given as `route`).

A web node gathers what its connections send within a few milliseconds and stores it with one
`messages_store` call (group commit, messaging.intake.group_commit); everything else stores one message at a
time with `message_send`. Both go through the same statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps_registry.models import MESSAGE_ID_BLOCK_BITS
from foundation.db import hot_cursor
from foundation.handoff import Route, routing_enqueue
from messaging.models import DeliveryState, MessageKind, states_sql


@dataclass(frozen=True)
class OutgoingMessage:
    app_id: int
    sender: str
    recipients: tuple[str, ...]
    content: str
    kind: str = MessageKind.DIRECT
    reference: str = ""
    confirmation_requested: bool = False
    client_message_id: str | None = None
    origin_domain: str = ""
    message_id: int | None = None  # drawn already (an idempotency claim's answer names it); else at the insert


@dataclass(frozen=True)
class SendResult:
    message_id: int
    delivery_ids: tuple[int, ...]
    duplicate: bool  # the clientMessageId was seen before: nothing new was stored or routed


DRAWN_ID_SQL = "nextval('messaging_message_id_seq'::regclass)"


def carried_id_sql(origin_id: str) -> str:
    """SQL: the id a message that came from another domain takes here, `origin_id` being its id where
    it was stored first (docs/architecture.md, "One id per message").

    That id itself where it lies in another domain's block (apps_registry Domain.number): blocks are
    disjoint, so it is no id this domain draws, and the message is stored once per origin
    (message_forwarded_once), so no other copy takes it. An id in block 0 (from a domain with no
    number, or drawn before it had one) or in this domain's own block (two domains given one number
    by mistake), or one another message here already has, is not carried: the copy draws an id here,
    as every copy did before, rather than be lost to the collision.
    """
    bits = MESSAGE_ID_BLOCK_BITS
    return f"""CASE WHEN {origin_id} >> {bits} > 0
                     AND {origin_id} >> {bits} <> (SELECT last_value >> {bits} FROM messaging_message_id_seq)
                     AND NOT EXISTS (SELECT 1 FROM messaging_message x WHERE x.id = {origin_id})
                    THEN {origin_id} ELSE {DRAWN_ID_SQL} END"""


def messages_insert_sql(messages: str, *, forwarded: bool = False, given_ids: bool = False) -> str:
    """CTEs that store the messages of relation `messages`, ending in `stored` (ord, id, app_id).

    `messages` has columns (ord, app_id, sender, kind, content, reference, confirm, cmid, origin,
    confirms) and, when `forwarded` (a message that came from another domain, messaging.federation),
    also (origin_id, path, confirms_origin, order_after). Ids are drawn before the insert, so each input row
    knows its message id (with `given_ids`, a row's `given_id` when it has one: drawn from the same
    sequence before; a forwarded message keeps its origin's id, `carried_id_sql`); a row that
    collides with a stored one (the same clientMessageId from the same sender, a second
    confirmation of one message, a forwarded message already stored here) inserts nothing.
    """
    extra_cols = ", origin_message_id, forward_path, confirms_origin, order_after" if forwarded else ""
    extra_vals = ", s.origin_id, s.path, s.confirms_origin, s.order_after" if forwarded else ""
    if forwarded:
        id_of = carried_id_sql("origin_id")
    else:
        id_of = f"coalesce(given_id, {DRAWN_ID_SQL})" if given_ids else DRAWN_ID_SQL
    return f"""
    ids AS MATERIALIZED (
        SELECT ord, {id_of} AS id FROM {messages}
    ), new_msgs AS (
        INSERT INTO messaging_message (id, app_id, sender, kind, content, reference, confirmation_requested,
                                       client_message_id, origin_domain, confirms_id, created_at{extra_cols})
        SELECT ids.id, s.app_id, s.sender, s.kind, s.content, s.reference, s.confirm, s.cmid, s.origin,
               s.confirms, now(){extra_vals}
          FROM {messages} s JOIN ids USING (ord) ORDER BY s.ord
        ON CONFLICT DO NOTHING
        RETURNING id, app_id
    ), stored AS MATERIALIZED (
        SELECT ids.ord, n.id, n.app_id FROM new_msgs n JOIN ids USING (id)
    )"""


def deliveries_append_sql(fan: str, *, origin_seq: bool = False) -> str:
    """CTEs that append a delivery per row of relation `fan` (ord, message_id, app_id, recipient,
    and `origin_seq` where the messages came from another domain, carrying it: Delivery.origin_seq)
    to each recipient's mailbox, ending in `new_deliveries` (id, message_id).

    - every mailbox is bumped once per statement, by the number of its new deliveries, in
      (app, user) order: the upsert holds each mailbox row lock until commit, so sequences are
      gap-free and increasing, and two statements locking overlapping mailboxes queue up in one
      global order instead of deadlocking;
    - within a statement, one recipient's new deliveries take its sequence numbers in `ord` order;
    - messages stored here first (no `origin_seq` given) also take the next numbers of the
      mailbox's own count (Mailbox.origin_last_seq) as their origin_seq, the same way.
    """
    pending = states_sql(DeliveryState.PENDING)
    own = "0" if origin_seq else "count(*)"
    in_order = "mb.last_seq - count(*) OVER w + row_number() OVER (w ORDER BY f.ord)"
    own_seq = "f.origin_seq" if origin_seq else "mb.origin_last_seq - count(*) OVER w + row_number() OVER (w ORDER BY f.ord)"
    return f"""
    mb AS (
        INSERT INTO messaging_mailbox (app_id, user_id, last_seq, origin_last_seq)
        SELECT app_id, recipient, count(*), {own} FROM {fan} GROUP BY app_id, recipient ORDER BY app_id, recipient
        ON CONFLICT (app_id, user_id) DO UPDATE SET last_seq = messaging_mailbox.last_seq + EXCLUDED.last_seq,
            origin_last_seq = messaging_mailbox.origin_last_seq + EXCLUDED.origin_last_seq
        RETURNING app_id, user_id, last_seq, origin_last_seq
    ), new_deliveries AS (
        INSERT INTO messaging_delivery (message_id, app_id, recipient, seq, state, attempts, last_error,
                                        created_at, next_attempt_at, origin_seq)
        SELECT f.message_id, f.app_id, f.recipient, {in_order},
               {pending}, 0, '', now(), now() + make_interval(secs => {float(settings.ROUTING_DEADLINE_SECONDS)}),
               {own_seq}
          FROM {fan} f JOIN mb ON mb.app_id = f.app_id AND mb.user_id = f.recipient
        WINDOW w AS (PARTITION BY f.app_id, f.recipient)
        RETURNING id, message_id
    )"""


def mailbox_append_sql(messages: str, recipients: str, *, given_ids: bool = False) -> str:
    """CTEs that store the messages of relation `messages` (`messages_insert_sql`) and append a
    delivery per row of `recipients` (ord, recipient) to each recipient's mailbox
    (`deliveries_append_sql`). Shared by sends and by confirmations. The CTEs end in `stored`
    (ord, id, app_id) and `new_deliveries` (id, message_id); a message that inserts nothing appends
    nothing."""
    return f"""{messages_insert_sql(messages, given_ids=given_ids)}, fan AS MATERIALIZED (
        SELECT st.ord, st.id AS message_id, st.app_id, r.recipient FROM stored st JOIN {recipients} r USING (ord)
    ), {deliveries_append_sql("fan")}"""


_STORE_SQL = f"""
WITH msgs AS (
    SELECT * FROM unnest(%(ord)s::int[], %(app)s::bigint[], %(sender)s::text[], %(kind)s::text[],
                         %(content)s::text[], %(reference)s::text[], %(confirm)s::bool[], %(cmid)s::text[],
                         %(origin)s::text[], %(confirms)s::bigint[], %(given)s::bigint[])
           AS t(ord, app_id, sender, kind, content, reference, confirm, cmid, origin, confirms, given_id)
), rcpts AS (
    SELECT * FROM unnest(%(r_ord)s::int[], %(r_user)s::text[]) AS t(ord, recipient)
), {mailbox_append_sql("msgs", "rcpts", given_ids=True)}
SELECT st.ord, st.id, coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{{}}')
  FROM stored st LEFT JOIN new_deliveries d ON d.message_id = st.id
 GROUP BY st.ord, st.id
"""


def messages_store(*, messages: Sequence[OutgoingMessage], route: Route = routing_enqueue) -> list[SendResult]:
    """Store a batch of messages in one statement; one result per message, in input order.

    Inside a caller's transaction, the new deliveries go to `route` when it commits; otherwise the
    statement has already committed and they go right away.
    """
    if not messages:
        return []
    params: dict[str, list] = {k: [] for k in ("ord", "app", "sender", "kind", "content", "reference", "confirm",
                                                "cmid", "origin", "confirms", "given", "r_ord", "r_user")}
    for ord_, m in enumerate(messages):
        params["ord"].append(ord_)
        params["app"].append(m.app_id)
        params["sender"].append(m.sender)
        params["kind"].append(str(m.kind))
        params["content"].append(m.content)
        params["reference"].append(m.reference or "")
        params["confirm"].append(m.confirmation_requested)
        params["cmid"].append(m.client_message_id)
        params["origin"].append(m.origin_domain)
        params["confirms"].append(None)
        params["given"].append(m.message_id)
        # Sorted and de-duplicated: a recipient gets one delivery per message.
        for recipient in sorted(set(m.recipients)):
            params["r_ord"].append(ord_)
            params["r_user"].append(recipient)
    with hot_cursor() as cur:
        cur.execute(_STORE_SQL, params)
        stored = {row[0]: (row[1], tuple(row[2])) for row in cur.fetchall()}
        results = []
        for ord_, m in enumerate(messages):
            if ord_ in stored:
                message_id, delivery_ids = stored[ord_]
                results.append(SendResult(message_id=message_id, delivery_ids=delivery_ids, duplicate=False))
                continue
            # A repeated clientMessageId (or one repeated inside this very batch): the same outcome
            # as the first time, and nothing new.
            cur.execute(
                "SELECT id FROM messaging_message WHERE app_id = %s AND sender = %s AND client_message_id = %s",
                [m.app_id, m.sender, m.client_message_id],
            )
            row = cur.fetchone()
            if row is None:  # a duplicate whose original was removed by retention in between
                raise RuntimeError(f"message {m.client_message_id!r} of {m.sender} was neither stored nor found")
            results.append(SendResult(message_id=row[0], delivery_ids=(), duplicate=True))
    delivery_ids = [d for r in results for d in r.delivery_ids]
    if delivery_ids:
        transaction.on_commit(lambda: route(delivery_ids))
    return results


def message_send(
    *,
    app_id: int,
    sender: str,
    recipients: list[str],
    content: str,
    kind: str = MessageKind.DIRECT,
    reference: str = "",
    confirmation_requested: bool = False,
    client_message_id: str | None = None,
    origin_domain: str = "",
) -> SendResult:
    """One message (the REST API, the admin, tests): `messages_store` with a batch of one."""
    return messages_store(messages=[OutgoingMessage(
        app_id=app_id, sender=sender, recipients=tuple(recipients), content=content, kind=kind, reference=reference,
        confirmation_requested=confirmation_requested, client_message_id=client_message_id,
        origin_domain=origin_domain,
    )])[0]
