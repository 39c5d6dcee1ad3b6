"""The rows of the users a takeover moves, in SQL (messaging.federation.takeover.take): the deliveries of a
home's users standing by at a holder, what waited on a link for them, the holder's re-seed of its
copy at the hand-back, and the home's copy-again after it. Each statement names the users by the
ranges homed at %(home)s whose standby is %(standby)s (domain ids)."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from apps_registry.models import Domain
from foundation import handoff
from foundation.db import hot_cursor
from foundation.locks import one_at_a_time
from messaging.core.delivery.sql import DELIVERED, FORWARDED, FORWARDING, PENDING, in_mailbox_sql
from messaging.federation.order import held_let_go, marks_raise
from messaging.federation.senders.outbox import link_lock_key


def in_ranges(table: str, user: str) -> str:
    """SQL: `table`'s rows whose `user` is in a range homed at %(home)s with standby %(standby)s."""
    return f"""JOIN apps_registry_userdistribution ud ON ud.app_id = {table}.app_id AND ud.domain_id = %(home)s
                                            AND ud.standby_id = %(standby)s
             AND messaging_user_number({table}.{user}) >= ud.range_from
             AND (ud.range_to IS NULL OR messaging_user_number({table}.{user}) <= ud.range_to)"""


def ranges_params(home: str, standby: str) -> dict[str, int]:
    """The parameters that name the users of the ranges homed at `home` with standby `standby`."""
    ids = dict(Domain.objects.filter(name__in=[home, standby]).values_list("name", "pk"))
    return {"home": ids[home], "standby": ids[standby]}


# What waited here on a link for the home's users (it was on its way there): their messages now,
# put at the end of their mailboxes here (after the copy, which the home had first), in the order
# they waited, and fed to the home as new (it does not have them) for the hand-back (the standby feed's
# trigger feeds a record made a mailbox row as new, migration messaging 0023).
_QUEUED_SQL = f"""
WITH q AS (
    SELECT d.id, d.app_id, d.recipient, row_number() OVER (PARTITION BY d.app_id, d.recipient ORDER BY d.seq) AS n
      FROM messaging_delivery d {in_ranges("d", "recipient")}
     WHERE d.state = {FORWARDING} AND d.forward_to = %(peer)s
), had AS (  -- the home had it after all (the call went through, its answer was lost): in the copy
    DELETE FROM messaging_delivery d USING q
     WHERE d.id = q.id AND {in_mailbox_sql("d")}
    RETURNING d.id
), counts AS (
    SELECT app_id, recipient, count(*) AS c FROM q GROUP BY app_id, recipient  -- (a gap where one was had)
), mb AS (
    UPDATE messaging_mailbox m SET last_seq = m.last_seq + counts.c
      FROM counts WHERE m.app_id = counts.app_id AND m.user_id = counts.recipient
    RETURNING m.app_id, m.user_id, m.last_seq, counts.c
), moved AS (
    UPDATE messaging_delivery d
       SET state = {PENDING}, forward_to = '', seq = mb.last_seq - mb.c + q.n, next_attempt_at = now(),
           last_error = ''
      FROM q JOIN mb ON mb.app_id = q.app_id AND mb.user_id = q.recipient
     WHERE d.id = q.id AND d.id NOT IN (SELECT id FROM had)
    RETURNING d.id, d.seq
)
SELECT id FROM moved ORDER BY seq
"""


# The mailbox rows here of the home's users that the home may not have: rows whose message is not in
# its copy, fed to it as new for the hand-back. A row is fed when it is made if the takeover is
# seen then (the standby feed's trigger); a store that made its row while the takeover was being
# recorded did not see it, and routing, after the takeover, left that row in the mailbox here: the
# home would have been fed its delivery alone (its state), without the message, and never had it.
# (A row fed as new already, and not yet sent, is not fed again.)
_UNFED_SQL = f"""
INSERT INTO messaging_standbyfeed (standby, delivery_id, new, created_at, attempts, last_error)
SELECT %(peer)s::text, d.id, true, now(), 0, ''
  FROM messaging_delivery d {in_ranges("d", "recipient")}
  JOIN messaging_message m ON m.id = d.message_id
 WHERE d.forward_to = ''
   AND NOT EXISTS (SELECT 1 FROM messaging_standbyfeed f WHERE f.delivery_id = d.id AND f.new AND f.standby = %(peer)s::text)
   AND NOT EXISTS (SELECT 1 FROM messaging_standbycopy c
                    WHERE c.home = %(peer)s::text AND c.app_id = d.app_id AND c.recipient = d.recipient
                      AND c.origin_domain = coalesce(nullif(m.origin_domain, ''), %(here)s::text)
                      AND c.origin_message_id = coalesce(m.origin_message_id, m.id))
 ORDER BY d.id
"""
# A store makes its rows in the statement that counts them in their recipients' mailboxes
# (messaging.core.store), so one under way holds those mailboxes' rows until it ends.
_STORES_WAIT_SQL = f"""
SELECT 1 FROM messaging_mailbox mb {in_ranges("mb", "user_id")} ORDER BY mb.app_id, mb.user_id FOR SHARE OF mb
"""
STORES_WAIT = "10s"


def stored_as_taken_fed(home: str) -> int:
    """Right after a takeover of `home` committed, once every store to its users under way then has
    ended (it holds their mailboxes' rows: STORES_WAIT at most), feed the home as new what it may
    lack of their mailboxes here. Returns how many rows were fed."""
    here = settings.DOMAIN_NAME
    params = {"peer": home, "here": here, **ranges_params(home, here)}
    with transaction.atomic(), hot_cursor() as cur:
        cur.execute("SELECT set_config('lock_timeout', %s, true)", [STORES_WAIT])
        cur.execute(_STORES_WAIT_SQL, params)
        cur.execute(_UNFED_SQL, params)
        return cur.rowcount


def queued_into_mailboxes(home: str, *, back: bool = False) -> list[int] | None:
    """The rows waiting on the link to `home` for its users held here, into their mailboxes here
    (under the link's sender lock, as the sweep moves a queue; None when a sender holds it now: the
    next watch does it). `back`: at a home given its users back, the rows it was forwarding to their
    holder (`home` then names the holder), the same way."""
    here = settings.DOMAIN_NAME
    params = {"peer": home, **(ranges_params(here, home) if back else ranges_params(home, here))}
    with one_at_a_time(link_lock_key(home)) as held:
        if not held:
            return None
        # (one transaction: called outside one, by the takeover watch, the lock ended with its statement)
        with transaction.atomic(), hot_cursor() as cur:
            cur.execute(_QUEUED_LOCK_SQL, params)
            cur.execute(_QUEUED_SQL, params)
            return [row[0] for row in cur.fetchall()]


def _messages_lock_sql(where: str) -> str:
    """SQL: the messages of the users' delivery rows `d` matching `where`, locked in id order, as the
    forward intake and a merge lock them: an arrival of the same message (the former holder passing
    it back) goes in one after the other, and the second sees the first's mailbox row (two at once
    put one message twice in a mailbox, 3 times in one fault run)."""
    return f"""
SELECT m.id FROM messaging_message m
 WHERE m.id IN (SELECT d.message_id FROM messaging_delivery d {in_ranges("d", "recipient")} WHERE {where})
 ORDER BY m.id FOR UPDATE OF m
"""


_QUEUED_LOCK_SQL = _messages_lock_sql(f"d.state = {FORWARDING} AND d.forward_to = %(peer)s")


# At a home given its users back: its records of messages it forwarded to them while they were held
# (towards the holder) whose message has no row in their mailboxes here. The holder had the
# message from this home's own copy as well, and merged it (a merge feeds nothing back), so the
# forward found it there and the call counted as a duplicate; the holder has now cleared its rows,
# and the record is all that is left of the message. It becomes the mailbox row, at its place.
_RECORDS_BACK_SQL = f"""
UPDATE messaging_delivery SET state = {PENDING}, forward_to = '', next_attempt_at = now(), claim = NULL, last_error = ''
 WHERE id IN (SELECT d.id FROM messaging_delivery d {in_ranges("d", "recipient")}
               WHERE d.state = {FORWARDED} AND d.forward_to <> '' AND d.created_at >= %(since)s
                 AND NOT {in_mailbox_sql("d")})
RETURNING id
"""


_RECORDS_LOCK_SQL = _messages_lock_sql(f"d.state = {FORWARDED} AND d.forward_to <> '' AND d.created_at >= %(since)s")


def records_back_into_mailboxes(holder: str, since) -> list[int]:
    """At a home given its users back by `holder`: _RECORDS_BACK_SQL for the records made since
    `since`, their messages locked first; the ids of the rows it put back (to route)."""
    params = {"since": since, **ranges_params(settings.DOMAIN_NAME, holder)}
    with hot_cursor() as cur:
        cur.execute(_RECORDS_LOCK_SQL, params)
        if cur.fetchone() is None:
            return []
        cur.execute(_RECORDS_BACK_SQL, params)
        return [row[0] for row in cur.fetchall()]


# At a holder handing users back: the (app, recipient, origin) of what it holds for them until an
# earlier message of its origin comes (messaging.federation.order): the home may have that one.
HELD_KEYS_SQL = f"""
SELECT DISTINCT h.app_id, h.recipient, h.origin_domain FROM messaging_heldinorder h {in_ranges("h", "recipient")}
 ORDER BY 1, 2, 3
"""

# At a home given its users back: what stands in their mailboxes now (a hand-back's rows, records put
# back, rows reordered) counts as placed in its origin's order, as a merge's rows do (order.marks_raise).
_MAILBOX_SEQS = f"""
SELECT d.app_id, d.recipient, m.origin_domain, d.origin_seq
  FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id {in_ranges("d", "recipient")}
 WHERE d.forward_to = '' AND d.origin_seq IS NOT NULL AND d.created_at >= %(since)s
"""

# ... and the marks of those users with arrivals held behind them (raised now, or by the hand-back's
# merge before: some may go in now).
_HELD_BEHIND_SQL = f"""
SELECT m.app_id, m.recipient, m.origin_domain FROM messaging_ordermark m {in_ranges("m", "recipient")}
 WHERE m.held > 0 ORDER BY 1, 2, 3
"""


def given_back_marks_raise(holder: str, since) -> list[int]:
    """At a home given its users back by `holder`: the marks raised over their rows stored since
    `since`, then what was held for them that is in order now into the mailboxes; the new delivery
    ids (to route). Without it, a record put back into the mailbox (or a row the holder gave back)
    left its origin's mark behind it, and the next arrival from that origin waited
    NETWORK_ORDER_WAIT_SECONDS for a message that was already there (36 messages in one fault run)."""
    params = {"since": since, **ranges_params(settings.DOMAIN_NAME, holder)}
    marks_raise(_MAILBOX_SEQS, params)
    with hot_cursor() as cur:
        cur.execute(_HELD_BEHIND_SQL, params)
        keys = [tuple(row) for row in cur.fetchall()]
    return held_let_go(keys)


HELD_HERE = f"""
  FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id {in_ranges("d", "recipient")}
 WHERE d.forward_to = ''"""  # mailbox rows: not its own records of messages it forwarded (to the home)

RESEED_SQL = f"""
INSERT INTO messaging_standbycopy (home, home_delivery_id, app_id, recipient, seq, origin_seq, sender, kind, content,
                                   reference, confirmation_requested, client_message_id, origin_domain,
                                   origin_message_id, state, attempts, created_at, delivered_at, dead_at,
                                   expired_at, copied_at)
SELECT DISTINCT ON (d.app_id, d.recipient, m.origin_domain, coalesce(m.origin_message_id, m.id))
       %(home_name)s, d.id, d.app_id, d.recipient, d.seq, d.origin_seq, m.sender, m.kind, m.content, m.reference,
       m.confirmation_requested, NULL, CASE WHEN m.origin_domain = '' THEN %(here_name)s ELSE m.origin_domain END,
       coalesce(m.origin_message_id, m.id), d.state, d.attempts, d.created_at, d.delivered_at, d.dead_at,
       d.expired_at, now()
{HELD_HERE}
 ORDER BY d.app_id, d.recipient, m.origin_domain, coalesce(m.origin_message_id, m.id),
          d.state = {DELIVERED} DESC, d.id  -- one per message, should two rows hold it: the delivered one
ON CONFLICT (app_id, recipient, origin_domain, origin_message_id) DO UPDATE SET
    state = EXCLUDED.state, delivered_at = EXCLUDED.delivered_at, dead_at = EXCLUDED.dead_at,
    expired_at = EXCLUDED.expired_at, copied_at = now()
"""


# Every mailbox row of the users given back, copied to their standby again as the home has it: the
# holder re-seeded its copy from what it held, numbered its own way and without what the home stored
# that never reached it (the tail before the loss, what came while the home did not know it was held).
_COPY_AGAIN_SQL = f"""
INSERT INTO messaging_standbyfeed (standby, delivery_id, new, created_at, attempts, last_error)
SELECT %(peer)s, d.id, true, now(), 0, '' {HELD_HERE}
 ORDER BY d.app_id, d.recipient, d.seq
"""


def copy_again(holder: str) -> int:
    """At a home given its users back: their whole mailboxes to the standby's copy (which takes each
    row's place and state from it), after everything it had queued for it."""
    with hot_cursor() as cur:
        cur.execute(_COPY_AGAIN_SQL, {"peer": holder, **ranges_params(settings.DOMAIN_NAME, holder)})
        copied = cur.rowcount
    transaction.on_commit(lambda: handoff.standby_senders_kick([holder]))
    return copied


# At a home given its users back: each origin's messages to each of those users in the origin's
# order (messaging.federation.order's origin_seq), over the places in the mailbox that origin's rows
# hold since the takeover began (%(since)s). What the holder stored and copied back was appended
# after what had come here meanwhile (a link's queue delivered when the home returned), though the
# origin sent it first. Other origins' rows keep their places.
_REORDER_SQL = f"""
WITH w AS (
    SELECT d.id, d.app_id, d.recipient, m.origin_domain, d.seq,
           row_number() OVER (PARTITION BY d.app_id, d.recipient, m.origin_domain ORDER BY d.seq) AS place,
           row_number() OVER (PARTITION BY d.app_id, d.recipient, m.origin_domain
                              ORDER BY d.origin_seq, d.seq) AS rank
      FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id {in_ranges("d", "recipient")}
     WHERE d.forward_to = '' AND d.origin_seq IS NOT NULL AND m.origin_domain <> ''
       AND d.created_at >= %(since)s
)
SELECT a.id, s.seq FROM w a JOIN w s ON s.app_id = a.app_id AND s.recipient = a.recipient
                                    AND s.origin_domain = a.origin_domain AND s.place = a.rank
 WHERE s.seq <> a.seq
"""


def mailboxes_reorder(holder: str, since, *, copy: bool = True) -> int:
    """Put each origin's messages back in its order in the mailboxes of the users `holder` gave back
    (their rows stored since `since`), and (`copy`) copy the rows moved to the standby (`holder`)
    with their new places; returns how many rows moved."""
    with hot_cursor() as cur:
        cur.execute(_REORDER_SQL, {"since": since, **ranges_params(settings.DOMAIN_NAME, holder)})
        moves = cur.fetchall()
        if not moves:
            return 0
        ids = [i for i, _ in moves]
        # In two steps: (app, recipient, seq) is unique at every row, not only at the end.
        cur.execute("UPDATE messaging_delivery SET seq = -seq WHERE id = ANY(%s)", [ids])
        cur.execute("UPDATE messaging_delivery d SET seq = t.seq FROM unnest(%s::bigint[], %s::bigint[])"
                    " AS t(id, seq) WHERE d.id = t.id", [ids, [q for _, q in moves]])
        if copy:
            cur.execute("INSERT INTO messaging_standbyfeed (standby, delivery_id, new, created_at, attempts,"
                        " last_error) SELECT %s, id, true, now(), 0, '' FROM unnest(%s::bigint[]) AS t(id)",
                        [holder, ids])
    return len(moves)
