"""The home domain puts each origin's messages to a recipient into its mailbox in the origin's order.

Hop by hop, a domain keeps a recipient's order on each of its links (messaging.federation.senders.queue), but
no single domain sees the whole path: around a fault further on, a later message can take a short
way while earlier ones wait on a long one, or are handed back. So the order is also kept end to
end. Every message a domain forwards carries, for each recipient, its place among the messages to
that recipient stored first at its origin (`seqs` in the payload, docs/protocol.md "Between
domains"; Mailbox.origin_last_seq there, gap-free and increasing per recipient, messaging.core.store:
the messages the origin only passes on take no number from it), carried unchanged by every domain
on the way (Delivery.origin_seq). The recipient's home appends an arrival to the mailbox only when it is the
next one expected from its origin (OrderMark); one that comes early waits, stored (HeldInOrder),
until the gap before it is filled, and then goes in with it, in order.

A gap can also never be filled: the earlier message died on the way (out of its attempts), expired,
or went to the recipient's former home. So an arrival waits at most
NETWORK_ORDER_WAIT_SECONDS: then the sweep (`held_release_overdue`, from the forward sweep) takes
the gap for lost and puts everything held for that recipient from that origin into the mailbox, in
order. An earlier message that arrives after all (a re-queued dead letter, a domain back after a
longer outage) goes in late, at once. The first arrival ever from an origin for a recipient is
expected to be its first (sequence 1): a recipient who moved here from another home waits once,
for that long. Rows stored before this order existed carry no sequence and go in at once.

A message stored here first, or one whose recipient is not homed here, or one from a domain that
sends no `seqs`, is appended at once, as before.

**Barriers: a sender's messages from two origins.** A home that took its users back from a holder
gone silent (messaging.federation.takeover.reclaim) lacks what the holder stored for them that it had
not yet sent home: among it, what the holder's own users sent them there (its origin, its count). Those
users are served meanwhile by the holder's standby, and what they send those recipients now comes
with the standby's origin: ordered on its own, it would go in before their earlier messages, which
arrive only when the holder is back and finishes its hand-back (a fault run of session 23: four pairs
so). So such an arrival (its recipient one of the users taken back, its sender homed at the silent
holder, its origin another domain) puts a barrier on its key (OrderMark.blocked_by, blocked_until):
every arrival of that origin for that recipient waits, whatever its sequence, until the holder's own
record says it has finished its hand-back (`barriers_lift`, from `take.given_back`), or for
NETWORK_ORDER_WAIT_SECONDS after the home took its users back, as any gap is waited for.

**After another origin: one sender's messages from two origins, told by the origin.** A user's
messages to one recipient leave from two origins around a takeover (from its home, then from the
standby that took it over) and around a hand-back (from the holder, then from home). Each origin
numbers its own, so the recipient's home would order them apart. So the later origin says, for each
recipient, which message of the earlier one its message follows (`after` in the forwarding call,
from messaging.federation.models.OrderAfter: the home's place its outgoing copy showed the standby,
or the count the holder sent home with its hand-back, messaging.federation.takeover.handback_order),
carried on unchanged by every domain on the way (Message.order_after). An arrival whose `after` has
not been put in yet waits, held, and every later arrival of its origin for that recipient with it
(each arrival's own `after` is looked at as it comes to go in, so two origins whose messages follow
each other's by turns, a takeover and a hand-back and a takeover again, go in by turns); its key's
mark records the first one that waits (OrderMark.after_origin, after_seq, after_from) until the
other origin's key reaches that place (`dependents_lift`, after the commit that moved it, and in the
sweep), or for NETWORK_ORDER_WAIT_SECONDS; then the other origin's message is taken for lost, as a
gap is (its key moves on to it, and what its origin held before it goes in first).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps_registry.models import ClientApp, Takeover
from apps_registry.selectors import app_snapshot, user_id_parse
from foundation.db import hot_cursor
from foundation.handoff import routing_enqueue
from messaging.federation.order_marks import (
    Arrival,
    Held,
    Key,
    Mark,
    Placed,
    held_of,
    held_write,
    key_columns,
    mailbox_append,
    marks_lock,
    marks_read,
    marks_write,
    not_here_yet,
)

log = logging.getLogger(__name__)


def _awaits(item: Arrival | Held, key: Key) -> tuple[Key, int] | None:
    """The other origin's key and message an arrival comes after (its `after`), None when it names
    none, its own origin (its own order) or this domain (its own messages are in already)."""
    after = item.after
    if after is None or after[0] in ("", key[2], settings.DOMAIN_NAME):
        return None
    return (key[0], key[1], after[0]), after[1]


def _barriers(arrivals: list[Arrival]) -> dict[Key, tuple[str, datetime]]:
    """The keys an arrival puts a barrier on (the module's doc): {key: (silent holder, until)}. One
    query when this domain took no users back from a silent holder lately (the usual case)."""
    wait = timedelta(seconds=settings.NETWORK_ORDER_WAIT_SECONDS)
    reclaimed = dict(Takeover.objects.filter(home__name=settings.DOMAIN_NAME, held=False,
                                             reclaimed_at__gt=timezone.now() - wait)
                     .values_list("holder__name", "reclaimed_at"))
    if not reclaimed or not (arrivals := [a for a in arrivals if a.sender]):
        return {}
    here = settings.DOMAIN_NAME
    names = dict(ClientApp.objects.filter(pk__in={a.app_id for a in arrivals}).values_list("pk", "app_name"))
    out: dict[Key, tuple[str, datetime]] = {}
    for a in arrivals:
        snapshot = app_snapshot(names[a.app_id]) if a.app_id in names else None
        recipient, sender = user_id_parse(a.recipient), user_id_parse(a.sender)
        if snapshot is None or recipient is None or sender is None:
            continue
        taken_back = snapshot.home_and_standby(recipient.number)  # (configured: whoever serves it now)
        sender_home = snapshot.home_and_standby(sender.number)
        if taken_back is None or sender_home is None or taken_back[0] != here:
            continue
        holder = taken_back[1]
        if holder in reclaimed and sender_home[0] == holder and a.origin not in ("", holder):
            out[a.key] = (holder, reclaimed[holder] + wait)
    return out


def arrivals_put_in_order(arrivals: list[Arrival], *, maybe_here: set[int] = frozenset()) -> Placed:
    """Inside the intake's transaction: append each arrival to its recipient's mailbox when it is
    the next one from its origin (with those held behind it that it lets go), hold it otherwise.
    `maybe_here`: ids of messages that were here before this call (their arrivals may be repeats,
    which add nothing)."""
    repeats = [a for a in arrivals if a.message_id in maybe_here]
    if repeats:
        fresh = {id(a) for a in not_here_yet(repeats)}
        arrivals = [a for a in arrivals if a.message_id not in maybe_here or id(a) in fresh]
    if not arrivals:
        return Placed([], 0)
    incoming: dict[Key, list[Arrival]] = defaultdict(list)
    for a in arrivals:
        incoming[a.key].append(a)
    delivery_ids, to_hold = _place(incoming, barriers=_barriers(arrivals))
    if to_hold:
        log.info("%d message(s) held for earlier ones from their origin still on their way", len(to_hold))
    keys = sorted(incoming)
    transaction.on_commit(lambda: dependents_lift(keys))
    return Placed(delivery_ids, len(to_hold))


def _place(incoming: dict[Key, list[Arrival]], *, release_all: bool = False,
           barriers: dict[Key, tuple[str, datetime]] | None = None, lift: str = "") -> tuple[list[int], list[Arrival]]:
    """For each key of `incoming` (its arrivals, or none: what is held for it is looked at again),
    under its locked mark: what is now in order (late, or the next one, and those held behind it
    that it lets go) appended to the mailbox, the rest of the new arrivals held. While the key's
    holder barrier stands (put now by `barriers`, or before) nothing goes in. An arrival that comes
    after another origin's message (`after`) not in yet waits, and every later one of its origin
    with it (the key's mark records it: after_origin, after_seq, after_from, for `dependents_lift`
    and the sweep); each arrival's own `after` is looked at, so two origins whose messages follow
    each other's earlier ones by turns go in by turns. Keys are passed over until none moves: one
    call bringing both goes in at once. `release_all`: everything held for the keys goes in, in its
    origin's order, the gaps before it taken for lost (still after another origin's message that
    goes in in the same call); `lift`: the barriers that holder put are lifted first.
    Returns the new delivery ids and the arrivals held."""
    marks = marks_lock(sorted(incoming))
    now = timezone.now()
    wait = timedelta(seconds=settings.NETWORK_ORDER_WAIT_SECONDS)
    for key, (holder, until) in (barriers or {}).items():
        if key in marks and not marks[key].blocked(now):
            m = marks[key]
            marks[key] = Mark(m.last, m.held, holder, until)  # (its `after` looked at below, afresh)
    held = held_of([k for k, m in marks.items() if m.held])
    queues = {key: sorted([(h.origin_seq, 0, h) for h in held.get(key, [])]
                          + [(a.origin_seq, 1, a) for a in incoming[key]], key=lambda t: t[:2])
              for key in incoming}
    others = {w[0] for key, q in queues.items() for _, _, item in q if (w := _awaits(item, key))} - set(marks)
    last = {**marks_read(sorted(others)), **{k: m.last for k, m in marks.items()}}
    stands = {k: marks[k].blocked(now) and not release_all and not (lift and marks[k].blocked_by == lift)
              for k in queues}
    at = dict.fromkeys(queues, 0)
    stops: dict[Key, tuple[str, int, int]] = {}  # a key's first arrival waiting for another origin's message
    in_order: list[tuple[int, int, str, int | None]] = []
    released: list[int] = []

    def advance(key: Key, *, afters: bool) -> bool:
        moved, queue = False, queues[key]
        while at[key] < len(queue) and not stands[key]:
            seq, is_new, item = queue[at[key]]
            late = seq <= last[key]  # (its gap was given up on: in at once)
            if not (release_all or late or seq == last[key] + 1):
                break
            if afters and not late and (w := _awaits(item, key)) and last.get(w[0], 0) < w[1]:
                stops[key] = (w[0][2], w[1], seq)
                break
            stops.pop(key, None)
            in_order.append((item.message_id, key[0], key[1], seq))
            last[key] = max(last[key], seq)
            if not is_new:
                released.append(item.held_id)
            at[key] += 1
            moved = True
        return moved

    while any([advance(key, afters=True) for key in sorted(queues)]):
        pass
    if release_all:  # (what waits for another origin's message that is not let in here: in all the same)
        for key in sorted(queues):
            advance(key, afters=False)
    to_hold: list[Arrival] = []
    for key, queue in queues.items():
        m = marks[key]
        waiting = queue[at[key]:]
        to_hold += [item for _, is_new, item in waiting if is_new]
        blocked_by = m.blocked_by if stands[key] else ""
        untils = [m.blocked_until] if stands[key] else []
        stop = stops.get(key) if waiting else None
        if stop is not None:  # (the same arrival waiting as before keeps its wait: the sweep gives it up)
            same = (m.after_origin, m.after_seq, m.after_from) == stop and m.blocked_until is not None
            untils.append(m.blocked_until if same else now + wait)
        marks[key] = Mark(last[key], len(waiting), blocked_by, max(untils) if untils else None,
                          *(stop if stop is not None else ("", None, None)))
    delivery_ids = mailbox_append(in_order)
    held_write(to_hold, released)
    marks_write(marks)
    return delivery_ids, to_hold


# Rows put in order another way (a merge's copies, a takeover's outgoing queue, a hand-back's rows):
# each (app, recipient, origin) mark raised to the highest sequence among them; {source} selects
# (app_id, recipient, origin_domain, seq).
_MARKS_RAISE_SQL = """
WITH source (app_id, recipient, origin_domain, seq) AS ({source})
INSERT INTO messaging_ordermark (app_id, recipient, origin_domain, last_seq, held)
SELECT app_id, recipient, origin_domain, max(seq), 0 FROM source
 WHERE seq IS NOT NULL AND origin_domain <> '' AND origin_domain <> %(marks_here)s
 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
ON CONFLICT (app_id, recipient, origin_domain) DO UPDATE
   SET last_seq = greatest(messaging_ordermark.last_seq, EXCLUDED.last_seq)
RETURNING app_id, recipient, origin_domain, held
"""


def marks_raise(source: str, params: dict) -> list[Key]:
    """Inside the caller's transaction: what `source` (SQL selecting app_id, recipient,
    origin_domain, seq; `params` its parameters) stands for was placed in its origin's order another
    way, so the next message from each origin to each recipient is expected after it, not from where
    the mark was. Returns the keys raised with arrivals held behind them: `held_let_go` them (some
    may be in order now; left, they waited NETWORK_ORDER_WAIT_SECONDS for a gap already filled)."""
    with hot_cursor() as cur:
        cur.execute(_MARKS_RAISE_SQL.format(source=source), {**params, "marks_here": settings.DOMAIN_NAME})
        return [(app, recipient, origin) for app, recipient, origin, held in cur.fetchall() if held]


def held_let_go(keys: list[Key]) -> list[int]:
    """Inside the caller's transaction: what is held for `keys` that is in order now (their marks
    were raised: the gap before it was filled another way, e.g. rows a hand-back put in the
    mailbox), into the mailboxes. Returns the new delivery ids (the caller routes them)."""
    return _place({k: [] for k in keys})[0] if keys else []


def barriers_lift(holder: str) -> list[int]:
    """Inside the caller's transaction, at a home whose users `holder` held, once the holder has
    finished its hand-back (what it stored for them is in their mailboxes here): its barriers lifted,
    and what waited behind them that is in order now into the mailboxes. Returns the new delivery
    ids (the caller routes them)."""
    with hot_cursor() as cur:
        cur.execute("SELECT app_id, recipient, origin_domain FROM messaging_ordermark WHERE blocked_by = %s"
                    " ORDER BY 1, 2, 3", [holder])
        keys = [tuple(row) for row in cur.fetchall()]
    if keys:
        log.info("%d barrier(s) behind %s lifted: it has handed its users' recipients back", len(keys), holder)
    return _place({k: [] for k in keys}, lift=holder)[0] if keys else []


def held_release(keys: list[Key]) -> list[int]:
    """Inside the caller's transaction: everything held for `keys` into the mailboxes, each key's in
    its origin's order, the gaps before it taken for lost (a holder handing its users back gives
    the home what it held for them: the home may have what they wait for). Returns the new delivery
    ids (the caller routes them, or not)."""
    return _place({k: [] for k in keys}, release_all=True)[0] if keys else []


def held_release_overdue() -> int:
    """Beat (from the forward sweep): for every recipient and origin whose oldest held message has
    waited NETWORK_ORDER_WAIT_SECONDS, the gap before it is taken for lost and everything held for
    them goes into the mailbox, in the origin's order. Returns the messages let go."""
    with hot_cursor() as cur:
        cur.execute(
            """
            SELECT DISTINCT app_id, recipient, origin_domain FROM messaging_heldinorder
             WHERE held_at <= now() - make_interval(secs => %s)
            """,
            [float(settings.NETWORK_ORDER_WAIT_SECONDS)],
        )
        keys = sorted(cur.fetchall())
        # Barriers whose wait is over (their holder never finished its hand-back, the other origin's
        # message never came): what is in order goes in. The other origin's message is taken for
        # lost, as a gap is: its key moves on to it, so what comes after it waits no more.
        now = timezone.now()
        cur.execute("SELECT app_id, recipient, after_origin, after_seq FROM messaging_ordermark"
                    " WHERE after_origin <> '' AND blocked_until <= %s", [now])
        given_up = cur.fetchall()
        cur.execute("SELECT app_id, recipient, origin_domain FROM messaging_ordermark"
                    " WHERE (blocked_by <> '' OR after_origin <> '') AND blocked_until <= %s ORDER BY 1, 2, 3", [now])
        overdue = set(keys)
        expired = [tuple(row) for row in cur.fetchall() if tuple(row) not in overdue]
    # ... and what the overdue ones' own `after`s wait for: taken for lost too, and first, so that
    # what waits for it goes in after what its origin had held before it.
    awaited: dict[Key, int] = {}
    for key, rows in held_of(keys).items():
        for item in rows:
            if w := _awaits(item, key):
                awaited[w[0]] = max(awaited.get(w[0], 0), w[1])
    given_up += [(*other, seq) for other, seq in sorted(awaited.items())]
    first: list[Key] = []
    if given_up:
        with transaction.atomic():
            raised = marks_raise("SELECT * FROM unnest(%(a)s::bigint[], %(r)s::text[], %(o)s::text[], %(s)s::bigint[])",
                                 {"a": [g[0] for g in given_up], "r": [g[1] for g in given_up],
                                  "o": [g[2] for g in given_up], "s": [g[3] for g in given_up]})
        first = sorted(k for k in set(raised) if k not in overdue)
    released = (_in_batches(first, held_let_go) + _in_batches(keys, held_release)
                + _in_batches(sorted(set(expired) - set(first)), held_let_go) + dependents_lift())
    _follow_prune()
    if released:
        log.warning("gave up waiting for earlier messages: %d held message(s) put in their mailboxes", released)
    return released


# OrderAfter rows that say nothing any more: a hand-back's past its wait, and a home's places not
# raised for a day (whatever it sent the recipient then is in long since).
_FOLLOW_PRUNE_SQL = """
DELETE FROM messaging_orderafter
 WHERE until < now() OR (until IS NULL AND updated_at < now() - interval '1 day')
"""


def _follow_prune() -> None:
    with hot_cursor() as cur:
        cur.execute(_FOLLOW_PRUNE_SQL)


_DEPENDENTS_SQL = """
SELECT m.app_id, m.recipient, m.origin_domain FROM messaging_ordermark m
  JOIN messaging_ordermark d ON d.app_id = m.app_id AND d.recipient = m.recipient AND d.origin_domain = m.after_origin
 WHERE m.after_origin <> '' AND d.last_seq >= m.after_seq{only}
 ORDER BY 1, 2, 3
"""


def dependents_lift(keys: list[Key] | None = None, *, depth: int = 4) -> int:
    """The barriers of `after`'s kind whose other origin has reached its seq (only those waiting on
    `keys`, or every one: the sweep) lifted, and what waited behind them that is in order now into
    the mailboxes, routed; then, `depth` times at most, those waiting on the keys that moved. Returns
    how many messages went in."""
    if keys is not None and not keys:
        return 0
    only = "" if keys is None else (" AND (d.app_id, d.recipient, d.origin_domain) IN"
                                    " (SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[]))")
    with hot_cursor() as cur:
        cur.execute(_DEPENDENTS_SQL.format(only=only), [] if keys is None else key_columns(keys))
        found = [tuple(row) for row in cur.fetchall()]
    if not found:
        return 0
    log.info("%d key(s) waiting on another origin's message move on: it is in", len(found))
    moved = _in_batches(found, held_let_go)
    return moved + (dependents_lift(found, depth=depth - 1) if moved and depth > 0 else 0)


def _in_batches(keys: list[Key], let_in) -> int:
    """`let_in` (held_release, held_let_go) over `keys`, 200 a transaction, what it lets in routed
    after each commit. Returns how many it let in."""
    released = 0
    for start in range(0, len(keys), 200):
        with transaction.atomic():
            delivery_ids = let_in(keys[start:start + 200])
            if delivery_ids:
                transaction.on_commit(lambda d=delivery_ids: routing_enqueue(d))
        released += len(delivery_ids)
    return released
