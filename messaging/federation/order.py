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
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps_registry.models import ClientApp, Takeover
from apps_registry.selectors import app_snapshot, user_id_parse
from foundation.db import hot_cursor
from foundation.handoff import routing_enqueue
from messaging.core.delivery.sql import FORWARDED, in_mailbox_sql
from messaging.core.store import deliveries_append_sql

log = logging.getLogger(__name__)

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

    @property
    def key(self) -> Key:
        return (self.app_id, self.recipient, self.origin)


@dataclass(frozen=True)
class _Mark:
    last: int
    held: int
    blocked_by: str = ""
    blocked_until: datetime | None = None

    def blocked(self, now: datetime) -> bool:
        return bool(self.blocked_by) and self.blocked_until is not None and self.blocked_until > now


@dataclass(frozen=True)
class Placed:
    delivery_ids: list[int]  # appended to mailboxes now (routed once the transaction commits)
    held: int  # arrivals held for an earlier one


@dataclass(frozen=True)
class _Held:
    held_id: int
    message_id: int
    origin_seq: int


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


def _append(in_order: list[tuple[int, int, str, int | None]]) -> list[int]:
    """(message id, app id, recipient, origin seq) appended to the mailboxes in list order: the new
    delivery ids."""
    if not in_order:
        return []
    with hot_cursor() as cur:
        cur.execute(_APPEND_SQL, {"ord": list(range(len(in_order))), "mid": [m for m, _, _, _ in in_order],
                                  "app": [a for _, a, _, _ in in_order], "user": [r for _, _, r, _ in in_order],
                                  "oseq": [s for _, _, _, s in in_order]})
        return list(cur.fetchone()[0])


def _columns(keys: list[Key]) -> list[list]:
    """Keys as the three arrays the statements unnest: app ids, recipients, origins."""
    return [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]]


def _marks_lock(keys: list[Key]) -> dict[Key, _Mark]:
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
            RETURNING app_id, recipient, origin_domain, last_seq, held, blocked_by, blocked_until
            """,
            _columns(keys),
        )
        return {(a, r, o): _Mark(last, held, by, until) for a, r, o, last, held, by, until in cur.fetchall()}


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


def _held_of(keys: list[Key]) -> dict[Key, list[_Held]]:
    if not keys:
        return {}
    with hot_cursor() as cur:
        cur.execute(
            """
            SELECT h.app_id, h.recipient, h.origin_domain, h.id, h.message_id, h.origin_seq
              FROM messaging_heldinorder h
              JOIN unnest(%s::bigint[], %s::text[], %s::text[]) AS k(app_id, recipient, origin)
                ON h.app_id = k.app_id AND h.recipient = k.recipient AND h.origin_domain = k.origin
             ORDER BY h.origin_seq
            """,
            _columns(keys),
        )
        out: dict[Key, list[_Held]] = defaultdict(list)
        for a, r, o, held_id, message_id, seq in cur.fetchall():
            out[a, r, o].append(_Held(held_id, message_id, seq))
        return out


def _marks_write(marks: dict[Key, _Mark]) -> None:
    with hot_cursor() as cur:
        cur.execute(
            """
            UPDATE messaging_ordermark m SET last_seq = k.last_seq, held = k.held, blocked_by = k.blocked_by,
                                             blocked_until = k.blocked_until
              FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::int[], %s::text[],
                          %s::timestamptz[]) AS k(app_id, recipient, origin, last_seq, held, blocked_by, blocked_until)
             WHERE m.app_id = k.app_id AND m.recipient = k.recipient AND m.origin_domain = k.origin
            """,
            [*_columns(list(marks)), [v.last for v in marks.values()], [v.held for v in marks.values()],
             [v.blocked_by for v in marks.values()], [v.blocked_until for v in marks.values()]],
        )


def _not_here_yet(arrivals: list[Arrival]) -> list[Arrival]:
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


def arrivals_put_in_order(arrivals: list[Arrival], *, maybe_here: set[int] = frozenset()) -> Placed:
    """Inside the intake's transaction: append each arrival to its recipient's mailbox when it is
    the next one from its origin (with those held behind it that it lets go), hold it otherwise.
    `maybe_here`: ids of messages that were here before this call (their arrivals may be repeats,
    which add nothing)."""
    repeats = [a for a in arrivals if a.message_id in maybe_here]
    if repeats:
        fresh = {id(a) for a in _not_here_yet(repeats)}
        arrivals = [a for a in arrivals if a.message_id not in maybe_here or id(a) in fresh]
    if not arrivals:
        return Placed([], 0)
    incoming: dict[Key, list[Arrival]] = defaultdict(list)
    for a in arrivals:
        incoming[a.key].append(a)
    delivery_ids, to_hold = _place(incoming, barriers=_barriers(arrivals))
    if to_hold:
        log.info("%d message(s) held for earlier ones from their origin still on their way", len(to_hold))
    return Placed(delivery_ids, len(to_hold))


def _place(incoming: dict[Key, list[Arrival]], *, release_all: bool = False,
           barriers: dict[Key, tuple[str, datetime]] | None = None,
           lift: str = "") -> tuple[list[int], list[Arrival]]:
    """For each key of `incoming` (its arrivals, or none: what is held for it is looked at again),
    under its locked mark: what is now in order (late, or the next one, and those held behind it
    that it lets go) appended to the mailbox, the rest of the new arrivals held; while the key's
    barrier stands (put now by `barriers`, or before), every new arrival is held and nothing let go.
    `release_all`: everything held for the keys goes in, in its origin's order, the gaps before it
    taken for lost (a barrier with them); `lift`: the barriers that holder put are lifted first.
    Returns the new delivery ids and the arrivals held."""
    marks = _marks_lock(sorted(incoming))
    now = timezone.now()
    for key, (holder, until) in (barriers or {}).items():
        if key in marks and not marks[key].blocked(now):
            marks[key] = _Mark(marks[key].last, marks[key].held, holder, until)
    held = _held_of([k for k, m in marks.items() if m.held])
    in_order: list[tuple[int, int, str, int | None]] = []
    to_hold: list[Arrival] = []
    released: list[int] = []
    for key in sorted(incoming):
        mark = marks[key]
        last, n_held = mark.last, mark.held
        lifted = release_all or (lift and mark.blocked_by == lift) or not mark.blocked(now)
        blocked_by, blocked_until = ("", None) if lifted else (mark.blocked_by, mark.blocked_until)
        app_id, recipient, _ = key
        waiting = sorted([(h.origin_seq, 0, h) for h in held.get(key, [])]
                         + [(a.origin_seq, 1, a) for a in incoming[key]], key=lambda t: t[:2])
        for seq, is_new, item in waiting:
            if lifted and (release_all or seq <= last or seq == last + 1):  # late (its gap was given up on), or the next one
                in_order.append((item.message_id, app_id, recipient, seq))
                last = max(last, seq)
                if not is_new:
                    released.append(item.held_id)
                    n_held -= 1
            elif is_new:
                to_hold.append(item)
                n_held += 1
        marks[key] = _Mark(last, n_held, blocked_by, blocked_until)
    delivery_ids = _append(in_order)
    _held_write(to_hold, released)
    _marks_write(marks)
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


def _held_write(to_hold: list[Arrival], released: list[int]) -> None:
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
        # Barriers whose wait is over (their holder never finished its hand-back): what is in order goes in.
        cur.execute("SELECT app_id, recipient, origin_domain FROM messaging_ordermark"
                    " WHERE blocked_by <> '' AND blocked_until <= %s ORDER BY 1, 2, 3", [timezone.now()])
        overdue = set(keys)
        expired = [tuple(row) for row in cur.fetchall() if tuple(row) not in overdue]
    released = _in_batches(keys, held_release) + _in_batches(expired, held_let_go)
    if released:
        log.warning("gave up waiting for earlier messages: %d held message(s) put in their mailboxes", released)
    return released


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
