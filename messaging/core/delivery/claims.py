"""Claims: one actor at a time acts on a delivery it pushes.

A routing task (or an ACK-mode fetch, messaging.core.delivery.fetch) claims the rows it is about to push
(pending/retrying -> sent under a fresh claim token). Then, always naming the claim, so nothing is
done to a row someone has re-claimed since:

- park: the recipient is offline (or its connection is gone): back to its mailbox, no timer;
- release: the push never reached a reader (Redis away, a socket closed before the frame left the
  node or before its ACK): no attempt counted;
- the other outcomes are delivered (messaging.core.delivery.delivered) and failed
  (messaging.core.delivery.retry).

No attempt is counted for a claim: only a failure counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings

from foundation.db import hot_cursor
from messaging.core.delivery.sql import CLAIMABLE, FORWARDED, PENDING, RETRYING, SENT, in_mailbox_sql, lock_sql


@dataclass(frozen=True)
class ClaimedRow:
    delivery_id: int
    recipient: str
    seq: int
    message_id: int
    sender: str
    kind: str
    content: str
    reference: str
    stored_at: float  # epoch seconds
    forward_to: str = ""  # a record of a message sent to another domain (not a mailbox row) when set


def deliveries_claim(*, delivery_ids: list[int], token: int) -> list[ClaimedRow]:
    """pending/retrying -> sent under `token` for the rows this caller wins; returns them with
    what is needed to build their frames. No attempt is counted: only a failure counts.

    One statement: rows are locked by primary key in id order (two overlapping batches cannot
    deadlock, and a duplicate task after a worker crash finds them already `sent`), then updated.
    """
    if not delivery_ids:
        return []
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")}),
            claimed AS (
                UPDATE messaging_delivery d
                   SET state = {SENT}, claim = %(token)s, sent_at = now(),
                       next_attempt_at = now() + make_interval(secs => %(ack)s)
                  FROM locked l
                 WHERE d.id = l.id AND d.state IN {CLAIMABLE}
                RETURNING d.id, d.recipient, d.seq, d.message_id, d.forward_to
            )
            SELECT c.id, c.recipient, c.seq, m.id, m.sender, m.kind, m.content, m.reference,
                   extract(epoch FROM m.created_at)::float8, c.forward_to
              FROM claimed c JOIN messaging_message m ON m.id = c.message_id
            """,
            {"ids": sorted(set(delivery_ids)), "token": token, "ack": float(settings.DELIVERY_ACK_TIMEOUT)},
        )
        return [ClaimedRow(*row) for row in cur.fetchall()]


def claimed_update(set_sql: str, pairs: list[tuple[int, int]], extra: dict | None = None,
                    returning: str = "d.id") -> list:
    """Apply `set_sql` to rows still `sent` under the claim named for them; returns the ids moved
    (or the `returning` columns of each)."""
    if not pairs:
        return []
    ids = [p[0] for p in pairs]
    tokens = [p[1] for p in pairs]
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH wanted AS (SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS t(id, claim)),
            locked AS MATERIALIZED ({lock_sql("id = ANY(%(ids)s::bigint[])")})
            UPDATE messaging_delivery d SET {set_sql}
              FROM locked l, wanted w, apps_registry_clientapp a
             WHERE d.id = l.id AND w.id = d.id AND a.id = d.app_id AND d.state = {SENT} AND d.claim = w.claim
            RETURNING {returning}
            """,
            {"ids": ids, "tokens": tokens, **(extra or {})},
        )
        rows = cur.fetchall()
    return [row[0] for row in rows] if returning == "d.id" else rows


def deliveries_park(*, claims: list[tuple[int, int]]) -> list[int]:
    """(delivery id, claim token) pairs whose recipient is offline: back to the mailbox, parked
    (no timer) until a fetch. Being offline is not a failed attempt."""
    return claimed_update(f"state = {PENDING}, next_attempt_at = NULL, claim = NULL", claims)


def deliveries_unacked_for_many(*, users: Sequence[tuple[int, str]]) -> dict[tuple[int, str], list[int]]:
    """deliveries_unacked_for for many (app id, user id) pairs in one statement (a node's reconnect
    storm); a user with nothing unacked is absent. The rows are locked in id order, as every batch
    transition locks them."""
    found: dict[tuple[int, str], list[int]] = {}
    if not users:
        return found
    apps, recipients = zip(*set(users), strict=True)
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED (
                SELECT d.id FROM messaging_delivery d
                  JOIN unnest(%s::bigint[], %s::text[]) AS w(app_id, recipient)
                    ON d.app_id = w.app_id AND d.recipient = w.recipient
                 WHERE d.state IN ({SENT}, {RETRYING})
                 ORDER BY d.id FOR UPDATE OF d
            )
            UPDATE messaging_delivery d SET state = {RETRYING}, next_attempt_at = now(), claim = NULL
              FROM locked l WHERE d.id = l.id AND d.state IN ({SENT}, {RETRYING})
            RETURNING d.id, d.app_id, d.recipient
            """,
            [list(apps), list(recipients)],
        )
        for delivery_id, app_id, recipient in sorted(cur.fetchall()):
            found.setdefault((app_id, recipient), []).append(delivery_id)
    return found


def deliveries_release(*, claims: list[tuple[int, int]], park: bool = True) -> list[int]:
    """Claimed rows that were never handed to their reader: no attempt counted.

    `park`: the reader went away (a socket closed before the frame left the node, or before its
    ACK): retrying without a timer, waiting for the recipient's next ACK-mode connection (which
    gets it pushed again, with the same id) or a fetch. Otherwise (Redis away after the claim:
    the push could not be made at all) pending and due for routing at once.
    """
    if park:
        return claimed_update(f"state = {RETRYING}, next_attempt_at = NULL, claim = NULL", claims)
    return claimed_update(f"state = {PENDING}, next_attempt_at = now(), claim = NULL", claims)


def deliveries_unacked_for(*, app_id: int, user_id: str) -> list[int]:
    """What an ACK-mode user was sent but never acknowledged (given back by its closed connection, or
    left `sent` by a crashed node) and retries waiting for it: redelivered on reconnect, with the
    same ids, no attempt counted."""
    with hot_cursor() as cur:
        cur.execute(
            f"""
            WITH locked AS MATERIALIZED (
                {lock_sql(f"app_id = %s AND recipient = %s AND state IN ({SENT}, {RETRYING})")}
            )
            UPDATE messaging_delivery d SET state = {RETRYING}, next_attempt_at = now(), claim = NULL
              FROM locked l WHERE d.id = l.id AND d.state IN ({SENT}, {RETRYING})
            RETURNING d.id
            """,
            [app_id, user_id],
        )
        return sorted(row[0] for row in cur.fetchall())


def records_already_in_mailbox(*, rows: list[ClaimedRow], token: int) -> set[int]:
    """Of claimed rows that are records of a message sent to another domain (`forward_to`), now to
    be pushed here (the recipient is served here again, say its domain was just handed back its
    users), those whose message already has a row in the recipient's mailbox here (it came back the
    other way): marked forwarded, never pushed (the mailbox row is). Returns their ids."""
    records = [r for r in rows if r.forward_to]
    if not records:
        return set()
    with hot_cursor() as cur:
        cur.execute(
            f"""
            SELECT t.id FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS t(id, message_id, recipient)
             WHERE {in_mailbox_sql("t")}
            """,
            [[r.delivery_id for r in records], [r.message_id for r in records], [r.recipient for r in records]])
        doubled = {row[0] for row in cur.fetchall()}
    claimed_update(f"state = {FORWARDED}, claim = NULL, next_attempt_at = NULL",
                   [(i, token) for i in sorted(doubled)])
    return doubled
