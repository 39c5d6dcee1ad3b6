"""The records the recipient's home keeps its order in (messaging.federation.order): each key's mark
(OrderMark: how far its origin's messages to its recipient are in the mailbox, and its barrier),
what waits behind a gap (HeldInOrder), and the mailbox appends. Statements only: what goes in when is
decided in messaging.federation.order."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from foundation.db import hot_cursor
from messaging.core.delivery.sql import FORWARDED, in_mailbox_sql
from messaging.core.store import deliveries_append_sql

Key = tuple[int, str, str]  # (app id, recipient, origin domain)


@dataclass(frozen=True)
class Arrival:
    """One (message, recipient) come from another domain for a recipient homed here."""

    message_id: int
    app_id: int
    recipient: str
    origin: str
    origin_seq: int
    sender: str = ""  # (a barrier looks at where it is homed)
    after: tuple[str, int] | None = None  # (origin, seq): not in before that origin's message seq to the recipient

    @property
    def key(self) -> Key:
        return (self.app_id, self.recipient, self.origin)


@dataclass(frozen=True)
class Mark:
    last: int
    held: int
    blocked_by: str = ""
    blocked_until: datetime | None = None
    after_origin: str = ""  # (the other kind of barrier: after that origin's message after_seq,
    after_seq: int | None = None  # for this key's messages from after_from on)
    after_from: int | None = None

    def standing(self, now: datetime) -> bool:
        """A barrier of either kind whose wait is not over."""
        return bool(self.blocked_by or self.after_origin) and self.blocked_until is not None and self.blocked_until > now

    def blocked(self, now: datetime) -> bool:
        return bool(self.blocked_by) and self.standing(now)


@dataclass(frozen=True)
class Placed:
    delivery_ids: list[int]  # appended to mailboxes now (routed once the transaction commits)
    held: int  # arrivals held for an earlier one


@dataclass(frozen=True)
class Held:
    held_id: int
    message_id: int
    origin_seq: int
    after: tuple[str, int] | None = None  # (its message's `after` for this recipient, as Arrival's)


_APPEND_SQL = f"""
WITH fan AS MATERIALIZED (
    SELECT * FROM unnest(%(ord)s::int[], %(mid)s::bigint[], %(app)s::bigint[], %(user)s::text[], %(oseq)s::bigint[])
           AS t(ord, message_id, app_id, recipient, origin_seq)
     -- (not one already in the mailbox: a held arrival whose message a merge put there meanwhile,
     -- messaging.federation.standby.mailbox_merge, is let go without a second row)
     WHERE NOT {in_mailbox_sql("t")}
), {deliveries_append_sql("fan", origin_seq=True)}
SELECT ARRAY(SELECT id FROM new_deliveries ORDER BY id)
"""


def mailbox_append(in_order: list[tuple[int, int, str, int | None]]) -> list[int]:
    """(message id, app id, recipient, origin seq) appended to the mailboxes in list order: the new
    delivery ids."""
    if not in_order:
        return []
    with hot_cursor() as cur:
        cur.execute(_APPEND_SQL, {"ord": list(range(len(in_order))), "mid": [m for m, _, _, _ in in_order],
                                  "app": [a for _, a, _, _ in in_order], "user": [r for _, _, r, _ in in_order],
                                  "oseq": [s for _, _, _, s in in_order]})
        return list(cur.fetchone()[0])


def key_columns(keys: list[Key]) -> list[list]:
    """Keys as the three arrays the statements unnest: app ids, recipients, origins."""
    return [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]]


def marks_lock(keys: list[Key]) -> dict[Key, Mark]:
    """Each key's mark (last seq, rows held, its barrier), created at 0 where there is none, locked
    until commit (in key order: two calls for overlapping recipients queue up rather than deadlock)."""
    with hot_cursor() as cur:
        cur.execute(
            """
            INSERT INTO messaging_ordermark (app_id, recipient, origin_domain, last_seq, held, blocked_by)
            SELECT app_id, recipient, origin, 0, 0, ''
              FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS k(app_id, recipient, origin)
             ORDER BY app_id, recipient, origin
            ON CONFLICT (app_id, recipient, origin_domain) DO UPDATE SET last_seq = messaging_ordermark.last_seq
            RETURNING app_id, recipient, origin_domain, last_seq, held, blocked_by, blocked_until, after_origin, after_seq,
                      after_from
            """,
            key_columns(keys),
        )
        return {(a, r, o): Mark(last, held, by, until, ao, aseq, afrom)
                for a, r, o, last, held, by, until, ao, aseq, afrom in cur.fetchall()}


def marks_read(keys: list[Key]) -> dict[Key, int]:
    """How far each key is in the mailboxes (not locked: a key that moves on meanwhile lifts what
    waits on it at its own commit, `dependents_lift`, or at the next sweep)."""
    if not keys:
        return {}
    with hot_cursor() as cur:
        cur.execute("SELECT m.app_id, m.recipient, m.origin_domain, m.last_seq FROM messaging_ordermark m"
                    " JOIN unnest(%s::bigint[], %s::text[], %s::text[]) AS k(app_id, recipient, origin)"
                    " ON m.app_id = k.app_id AND m.recipient = k.recipient AND m.origin_domain = k.origin",
                    key_columns(keys))
        return {(a, r, o): last for a, r, o, last in cur.fetchall()}


def held_of(keys: list[Key]) -> dict[Key, list[Held]]:
    if not keys:
        return {}
    with hot_cursor() as cur:
        cur.execute(
            """
            SELECT h.app_id, h.recipient, h.origin_domain, h.id, h.message_id, h.origin_seq,
                   m.order_after -> h.recipient ->> 0, (m.order_after -> h.recipient ->> 1)::bigint
              FROM messaging_heldinorder h
              JOIN unnest(%s::bigint[], %s::text[], %s::text[]) AS k(app_id, recipient, origin)
                ON h.app_id = k.app_id AND h.recipient = k.recipient AND h.origin_domain = k.origin
              JOIN messaging_message m ON m.id = h.message_id
             ORDER BY h.origin_seq
            """,
            key_columns(keys),
        )
        out: dict[Key, list[Held]] = defaultdict(list)
        for a, r, o, held_id, message_id, seq, after_origin, after_seq in cur.fetchall():
            after = (after_origin, after_seq) if after_origin is not None and after_seq is not None else None
            out[a, r, o].append(Held(held_id, message_id, seq, after))
        return out


def marks_write(marks: dict[Key, Mark]) -> None:
    with hot_cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_ordermark m SET last_seq = k.last_seq, held = k.held, blocked_by = k.blocked_by,
                                             blocked_until = k.blocked_until, after_origin = k.after_origin,
                                             after_seq = k.after_seq, after_from = k.after_from
              FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::int[], %s::text[],
                          %s::timestamptz[], %s::text[], %s::bigint[], %s::bigint[])
                   AS k(app_id, recipient, origin, last_seq, held, blocked_by, blocked_until, after_origin, after_seq,
                        after_from)
             WHERE m.app_id = k.app_id AND m.recipient = k.recipient AND m.origin_domain = k.origin
            """,
            [*key_columns(list(marks)), [v.last for v in marks.values()], [v.held for v in marks.values()],
             [v.blocked_by for v in marks.values()], [v.blocked_until for v in marks.values()],
             [v.after_origin for v in marks.values()], [v.after_seq for v in marks.values()],
             [v.after_from for v in marks.values()]],
        )


def not_here_yet(arrivals: list[Arrival]) -> list[Arrival]:
    """The arrivals with neither a delivery nor a held row here (a repeated call brings the others).
    This domain's record of a message it passed on does not count: the message came back to a
    recipient served here now (round a fault, or from its holder), and goes into the mailbox."""
    with hot_cursor() as cur:
        cur.execute(
            f"""
            SELECT t.ord FROM unnest(%s::int[], %s::bigint[], %s::text[]) AS t(ord, message_id, recipient)
             WHERE NOT EXISTS (SELECT 1 FROM messaging_delivery d
                                WHERE d.message_id = t.message_id AND d.recipient = t.recipient
                                  AND (d.forward_to = '' OR d.state <> {FORWARDED}))
               AND NOT EXISTS (SELECT 1 FROM messaging_heldinorder h
                                WHERE h.message_id = t.message_id AND h.recipient = t.recipient)
            """,
            [list(range(len(arrivals))), [a.message_id for a in arrivals], [a.recipient for a in arrivals]],
        )
        return [arrivals[ord_] for (ord_,) in sorted(cur.fetchall())]


def held_write(to_hold: list[Arrival], released: list[int]) -> None:
    with hot_cursor() as cur:
        if to_hold:
            cur.execute(
                """
                INSERT INTO messaging_heldinorder (message_id, app_id, recipient, origin_domain, origin_seq, held_at)
                SELECT *, now() FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::bigint[])
                ON CONFLICT DO NOTHING
                """,
                [[a.message_id for a in to_hold], [a.app_id for a in to_hold], [a.recipient for a in to_hold],
                 [a.origin for a in to_hold], [a.origin_seq for a in to_hold]],
            )
        if released:
            cur.execute("DELETE FROM messaging_heldinorder WHERE id = ANY(%s::bigint[])", [released])
