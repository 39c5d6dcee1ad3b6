"""What a message stored here first must follow at its recipient's home (messaging.federation.order,
"After another origin"): looked up in OrderAfter when its delivery is first queued on a link
(messaging.federation.senders.queue), and kept on the message (Message.order_after), which every
forwarding call of it carries as `after` (messaging.federation.senders.outbox).

Fixed once, at that first queueing, close to when the message was stored: what a row says later
(the home's places raised by its feed once it is back) is not what the message came after.
- A row of a home's places (its users' messages, `senders_home` = `origin_domain`) applies to their
  messages stored here while this domain held them, if it has not moved since the message was
  stored (a routing late past the hand-back, the home feeding again: its new places come after the
  message, and the two would wait on each other); for each, what it found is kept, none too (JSON
  null), so a later queueing (a retry) does not look again.
- A row of a hand-back (this domain's own users, `senders_home` = here) applies to their messages
  stored between the hand-back and its `until`; none found is not written (the common case: no write
  on the forwarding path), a retry looks again and finds the same.
"""

from __future__ import annotations

import logging

from django.conf import settings
from psycopg.types.json import Jsonb

from apps_registry.selectors import app_snapshot, user_id_parse
from foundation.db import hot_cursor

log = logging.getLogger(__name__)

# The rows just queued whose message was stored here first and has no word for the recipient yet,
# each with the OrderAfter rows of its recipient (none, the usual case: no row comes back).
_TODO_SQL = """
SELECT m.id, d.recipient, a.app_name, m.sender, m.created_at,
       o.senders_home, o.origin_domain, o.seq, o.until, o.updated_at
  FROM messaging_delivery d JOIN messaging_message m ON m.id = d.message_id
  JOIN apps_registry_clientapp a ON a.id = d.app_id
  JOIN messaging_orderafter o ON o.app_id = d.app_id AND o.recipient = d.recipient
 WHERE d.id = ANY(%s::bigint[]) AND m.origin_message_id IS NULL
   AND (m.order_after IS NULL OR NOT m.order_after ? d.recipient)
 ORDER BY m.id, d.recipient, o.origin_domain
"""

_RECORD_SQL = """
INSERT INTO messaging_orderafter (app_id, recipient, senders_home, origin_domain, seq, until, updated_at)
SELECT app_id, recipient, %(senders_home)s, %(origin)s, max(seq),
       CASE WHEN %(wait)s::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => %(wait)s::float8) END, now()
  FROM unnest(%(app)s::bigint[], %(rcpt)s::text[], %(seq)s::bigint[]) AS t(app_id, recipient, seq)
 WHERE seq IS NOT NULL
 GROUP BY 1, 2 ORDER BY 1, 2
ON CONFLICT (app_id, recipient, senders_home, origin_domain) DO UPDATE
   SET seq = greatest(messaging_orderafter.seq, EXCLUDED.seq), until = EXCLUDED.until, updated_at = now()
"""


def follows_record(*, senders_home: str, origin: str, rows: list[tuple[int, str, int | None]],
                   wait: float | None = None) -> None:
    """Inside the caller's transaction: what `senders_home`'s users' messages stored here first to
    each recipient follow, `origin`'s highest seq among `rows` (app id, recipient, seq; a seq of
    None is left out), raised where a row is there already; for `wait` seconds from now, or (None)
    for as long as the row is here."""
    if rows:
        with hot_cursor() as cur:
            cur.execute(_RECORD_SQL, {"senders_home": senders_home, "origin": origin, "wait": wait,
                                      "app": [r[0] for r in rows], "rcpt": [r[1] for r in rows],
                                      "seq": [r[2] for r in rows]})


_WRITE_SQL = """
UPDATE messaging_message m SET order_after = coalesce(m.order_after, '{}'::jsonb) || w.after
  FROM unnest(%s::bigint[], %s::jsonb[]) AS w(id, after) WHERE m.id = w.id
"""


def afters_fix(delivery_ids: list[int]) -> int:
    """Inside the queueing's transaction: the word of OrderAfter for each message stored here first
    among `delivery_ids` (rows just queued on a link) kept on the message. One small query when
    OrderAfter has nothing for their recipients (the usual case). Returns the messages written."""
    if not delivery_ids:
        return 0
    with hot_cursor() as cur:
        cur.execute(_TODO_SQL, [delivery_ids])
        rows = cur.fetchall()
    todo: dict[tuple[int, str], tuple[str, str, object, list[tuple]]] = {}
    for message_id, recipient, app_name, sender, created_at, *follow in rows:
        todo.setdefault((message_id, recipient), (app_name, sender, created_at, []))[3].append(tuple(follow))
    here = settings.DOMAIN_NAME
    words: dict[int, dict] = {}
    for (message_id, recipient), (app_name, sender, created_at, follows) in todo.items():
        snapshot, user = app_snapshot(app_name), user_id_parse(sender)
        homes = snapshot.home_and_standby(user.number) if snapshot is not None and user is not None else None
        if homes is None:
            continue
        held_here = homes[0] != here  # a user of another home, served here: that home's places
        found = next(([origin, seq] for senders_home, origin, seq, until, updated_at in follows
                      if senders_home == homes[0] and updated_at <= created_at
                      and (held_here or created_at <= until)), None)
        if found is not None or held_here:
            words.setdefault(message_id, {})[recipient] = found
    if words:
        with hot_cursor() as cur:
            cur.execute(_WRITE_SQL, [list(words), [Jsonb(w) for w in words.values()]])
        log.info("%d message(s) stored here first say what they follow at their recipients' homes: %s",
                 len(words), words)
    return len(words)
