"""The live copy of a domain's users' mailboxes on their standby domain (UserDistribution.standby).

At the home: the database feeds every change that matters to a standby (a delivery appended to the
mailbox of a user with a standby, every move of one to or from delivered, dead or expired, and each
durable subscription of such a user made or ended) to StandbyFeed, by triggers (migration messaging 0021), in the transaction that made it. `StandbySender`
(on the outbound skeleton, foundation.outbound: one sender per standby, calls bounded by rows and
bytes, held back by the link's backoff) sends the feed in order, each row as the delivery is when
it is sent (the message too, for a new one), to POST /internal/v1/standby, and deletes what the
standby took. While the standby is away the feed waits (its rows count their attempts, the link's
backoff paces the calls); it catches up when the standby answers again. Beat wakes the senders every
STANDBY_COPY_SECONDS (standby_sweep); the copy's lag (the oldest row still waiting) is a metric and
a column of the console's Link health.

At the standby: `copies_accept` writes each copy to StandbyCopy, keyed by the message (where it was
stored first, its id there) and recipient, and each subscription to StandbySubscription: a copy sent
twice is written twice, the same. Inert: nothing routes or delivers a copy; it is what the standby
takes its users over from (messaging.federation.takeover.take). The same call merges into the receiver's own
mailboxes (messaging.federation.standby.mailbox_merge) the copies of users it holds (taken over from the
caller) and the changes a holder made to this domain's own users (the hand-back).

The standby must be a neighbour of the home (a link between them): the copy is signed with that
link's secret, as every call between domains is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils.dateparse import parse_datetime

from apps_registry.models import ClientApp, Domain, UserDistribution
from apps_registry.selectors import user_id_parse
from foundation.db import hot_cursor
from foundation.outbound import Batch, CallFailed, Failed, Limits, Settled, head_sql, send_batches
from messaging.federation.links import LinkQueueSender, link_failed, link_succeeded, links_held_back
from messaging.federation.models import StandbyFeed
from messaging.federation.standby.mailbox_merge import Copied, handback_in_turn, mailbox_merge, subscriptions_merge
from messaging.federation.standby.outgoing_copy import outgoing_accept, outgoing_item
from messaging.federation.takeover.handback_order import counts_accept
from messaging.federation.wire.transport import STANDBY_PATH, PeerRefused, peer_call

log = logging.getLogger(__name__)

ROW_OVERHEAD_BYTES = 400  # what a copy counts towards FORWARD_BATCH_BYTES beyond its content
MAX_COPIES = 10_000
TIMES = ("created_at", "delivered_at", "dead_at", "expired_at")


@dataclass
class FeedRow:
    feed_id: int
    item: dict | None  # the copy as sent; None: the delivery is gone here (nothing to copy)
    subscription: dict | None = None  # a durable subscription made or ended
    outgoing: dict | None = None  # a message waiting on a link here, or gone from it (messaging.federation.standby.outgoing_copy)


# The head of a standby's feed in order, each row as its delivery is now (content only for new ones).
_FEED_SQL = head_sql(f"""
    SELECT f.id, f.delivery_id, sa.app_name, f.subscriber, f.channel, f.subscribed, f.outgoing,
           d.id, f.new, a.app_name, d.recipient, d.seq, d.origin_seq, d.state, d.attempts,
           d.created_at, d.delivered_at, d.dead_at, d.expired_at, m.sender, m.kind,
           CASE WHEN f.new THEN m.content END, m.reference, m.confirmation_requested, m.client_message_id,
           coalesce(m.origin_domain, ''), m.origin_message_id, m.id,
           CASE WHEN f.new THEN octet_length(m.content) ELSE 0 END + {ROW_OVERHEAD_BYTES} AS size,
           sum(CASE WHEN f.new THEN octet_length(m.content) ELSE 0 END + {ROW_OVERHEAD_BYTES}) OVER w AS running,
           row_number() OVER w AS n
      FROM messaging_standbyfeed f
      LEFT JOIN messaging_delivery d ON d.id = f.delivery_id
      LEFT JOIN messaging_message m ON m.id = d.message_id
      LEFT JOIN apps_registry_clientapp a ON a.id = d.app_id
      LEFT JOIN apps_registry_clientapp sa ON sa.id = f.app_id
     WHERE f.standby = %(peer)s
    WINDOW w AS (ORDER BY f.id)
     ORDER BY f.id
     LIMIT %(rows)s
""")


def feed_peek(*, standby: str, limits: Limits) -> tuple[list[FeedRow], bool]:
    """The oldest rows of the feed to `standby`, as many as `limits` allow, and whether they are all."""
    here = settings.DOMAIN_NAME
    rows, drained = StandbySender(standby).head(_FEED_SQL, limits)
    out = []
    for (feed_id, fed_delivery, sub_app, subscriber, channel, subscribed, outgoing, delivery_id, new, app, recipient, seq,
         origin_seq, state, attempts, created, delivered, dead, expired, sender, kind, content, reference, confirm,
         cmid, origin, origin_id, message_id, *_) in rows:
        if fed_delivery is None:
            subscription = {"app": sub_app, "subscriber": subscriber, "channel": channel, "subscribed": subscribed}
            out.append(FeedRow(feed_id, None, subscription if sub_app else None))
            continue
        if delivery_id is None:
            out.append(FeedRow(feed_id, None))
            continue
        message = {"sender": sender, "kind": kind, "content": content, "reference": reference,
                   "confirmation_requested": confirm, "client_message_id": cmid} if new else None
        if outgoing:
            out.append(FeedRow(feed_id, None, outgoing=outgoing_item(
                delivery_id=delivery_id, app=app, recipient=recipient, state=state, origin_seq=origin_seq,
                message_id=message_id, message=message)))
            continue
        item = {"delivery": delivery_id, "app": app, "recipient": recipient, "seq": seq, "origin_seq": origin_seq,
                "state": state, "attempts": attempts, "origin_domain": origin or here,
                "origin_message_id": origin_id or message_id,
                **{k: v.isoformat() if v else None for k, v in zip(TIMES, (created, delivered, dead, expired),
                                                                    strict=True)}}
        if message is not None:
            item["message"] = message
        out.append(FeedRow(feed_id, item))
    return out, drained


class StandbySender(LinkQueueSender):
    """The feed to one standby domain on the outbound skeleton."""

    name = "standby"

    def take(self, limits: Limits) -> Batch[FeedRow]:
        rows, drained = feed_peek(standby=self.peer, limits=limits)
        return Batch(items=rows, drained=drained)

    def send(self, batch: Batch[FeedRow]) -> dict:
        payload = {"copies": [r.item for r in batch.items if r.item is not None],
                   "subscriptions": [r.subscription for r in batch.items if r.subscription is not None]}
        if outgoing := [r.outgoing for r in batch.items if r.outgoing is not None]:
            payload["outgoing"] = outgoing  # (only when there is any: a standby of an older release refuses the key)
        return peer_call(peer=self.peer, path=STANDBY_PATH, payload=payload)

    def settle(self, batch: Batch[FeedRow], answer: dict) -> Settled:
        sent, _ = StandbyFeed.objects.filter(pk__in=[r.feed_id for r in batch.items]).delete()
        # The link is up; the copy is not counted as forwarded (switchboard_link_forwarded_total is
        # the network's own traffic: messages, receipts, publishes); the copy's metrics are its own.
        link_succeeded(peer=self.peer)
        return Settled(sent=sent)

    def fail(self, batch: Batch[FeedRow], error: CallFailed) -> Failed:
        """An attempt counted and the reason kept on each row; they wait, in order, for the link's retry."""
        with transaction.atomic():
            failed = StandbyFeed.objects.filter(pk__in=[r.feed_id for r in batch.items]).update(
                attempts=F("attempts") + 1, last_error=error.reason[:500])
        health = link_failed(peer=self.peer, error=error.reason, answered=error.status is not None)
        return Failed(failed=failed, retry_at=health.retry_at)


def standby_send(*, standby: str) -> dict:
    """Send the feed to `standby` until none is left, the link fails, or its backoff holds it back."""
    return send_batches(StandbySender(standby), budget_seconds=settings.FORWARD_TASK_BUDGET_SECONDS).as_dict()


def standbys_waiting() -> list[str]:
    """Standby domains with rows of the feed waiting."""
    with hot_cursor() as cur:
        cur.execute("SELECT DISTINCT standby FROM messaging_standbyfeed")
        return sorted(row[0] for row in cur.fetchall())


def standbys_due() -> list[str]:
    """Standby domains with rows of the feed waiting whose link's retry is due."""
    waiting = standbys_waiting()
    return sorted(set(waiting) - links_held_back(waiting))


def copy_lag() -> dict[str, tuple[int, float]]:
    """standby -> (rows waiting, seconds the oldest has waited): how far each standby's copy is behind."""
    with hot_cursor() as cur:
        cur.execute("SELECT standby, count(*), extract(epoch FROM now() - min(created_at))"
                    " FROM messaging_standbyfeed GROUP BY standby")
        return {standby: (count, max(0.0, float(lag))) for standby, count, lag in cur.fetchall()}


# --- at the standby ---------------------------------------------------------------------------


def _refuse(reason: str, status: int = 400) -> PeerRefused:
    return PeerRefused(status, reason)


ANY_STANDBY = "*"


def standby_ranges(home: str, standby: str | None = None) -> dict[str, list[tuple[int, int | None]]]:
    """app name -> the user ranges homed at `home` whose standby is `standby` (this domain; ANY_STANDBY:
    any)."""
    ranges: dict[str, list[tuple[int, int | None]]] = {}
    which = {"standby__isnull": False} if standby == ANY_STANDBY else {"standby__name": standby or settings.DOMAIN_NAME}
    for app, low, high in UserDistribution.objects.filter(domain__name=home, **which).values_list(
            "app__app_name", "range_from", "range_to"):
        ranges.setdefault(app, []).append((low, high))
    return ranges


def user_in_ranges(recipient: str, app: str, ranges: dict[str, list[tuple[int, int | None]]]) -> bool:
    """Whether user `recipient` of app `app` is in one of `ranges` (standby_ranges's)."""
    parsed = user_id_parse(recipient)
    return (parsed is not None and parsed.app_name == app
            and any(low <= parsed.number and (high is None or parsed.number <= high) for low, high in ranges.get(app, ())))


def _copy_parse(i: int, item, ranges: dict, apps: dict[str, int]) -> dict | None:
    where = f"copies[{i}]"
    if not isinstance(item, dict):
        raise _refuse(f"{where} must be an object")
    for key in ("delivery", "seq"):
        if not isinstance(item.get(key), int) or isinstance(item.get(key), bool) or item[key] < 1:
            raise _refuse(f"{where}: {key} must be a positive whole number")
    if not isinstance(item.get("app"), str) or not isinstance(item.get("recipient"), str):
        raise _refuse(f"{where}: app and recipient must be strings")
    if not isinstance(item.get("state"), str) or len(item["state"]) > 16:
        raise _refuse(f"{where}: state must be a delivery state")
    if item["app"] not in apps or not user_in_ranges(item["recipient"], item["app"], ranges):
        return None  # not (or no longer, as this domain's configuration says) standing by here
    times = {}
    for key in TIMES:
        value = item.get(key)
        times[key] = parse_datetime(value) if isinstance(value, str) else None
        if value is not None and times[key] is None:
            raise _refuse(f"{where}: {key} must be an ISO 8601 time or null")
    if times["created_at"] is None:
        raise _refuse(f"{where}: created_at is required")
    if (not isinstance(item.get("origin_domain"), str) or not 0 < len(item["origin_domain"]) <= 64
            or not isinstance(item.get("origin_message_id"), int) or isinstance(item["origin_message_id"], bool)):
        raise _refuse(f"{where}: origin_domain and origin_message_id must name the message")
    message = item.get("message")
    if message is not None and (not isinstance(message, dict) or not isinstance(message.get("content"), str)
                                or not isinstance(message.get("sender"), str)):
        raise _refuse(f"{where}: message must carry sender and content")
    origin_seq = item.get("origin_seq")
    if origin_seq is not None and (not isinstance(origin_seq, int) or isinstance(origin_seq, bool)):
        raise _refuse(f"{where}: origin_seq must be a whole number or null")
    attempts = item.get("attempts", 0)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        raise _refuse(f"{where}: attempts must be a whole number")
    return {**item, **times, "app_id": apps[item["app"]], "attempts": attempts}


def copies_accept(*, sender: str, payload: dict) -> dict:
    """Write what the home domain `sender` copies here (POST /internal/v1/standby): every copy of a
    user whose standby is this domain, in one transaction; {"copied": n, "refused": m}. A copy of a
    user who does not stand by here for `sender` (the two ends' configurations a pull apart) is
    refused alone and not written; anything malformed refuses the call (400)."""
    if (set(payload) - {"copies", "subscriptions", "outgoing", "after"} or not isinstance(payload.get("copies", []), list)
            or not isinstance(payload.get("subscriptions", []), list) or not isinstance(payload.get("outgoing", []), list)):
        raise _refuse("the payload is {\"copies\": [...], \"subscriptions\": [...], \"outgoing\": [...]}")
    items, outgoing = payload.get("copies", []), payload.get("outgoing", [])
    if len(items) + len(payload.get("subscriptions", [])) + len(outgoing) > MAX_COPIES:
        raise _refuse(f"more than {MAX_COPIES} copies in one call", 413)
    if not Domain.objects.filter(name=sender).exists():
        raise _refuse(f"{sender} is not a domain of this network", 403)
    here = settings.DOMAIN_NAME
    standing_by = standby_ranges(sender)  # (also the senders of `outgoing`)
    back = standby_ranges(here, sender)
    ranges = {app: [*standing_by.get(app, ()), *back.get(app, ())] for app in {*standing_by, *back}}
    after = payload.get("after", [])
    if after and not back:
        raise _refuse(f"{sender} holds none of {here}'s users: it has no counts to hand back", 403)
    named = [*items, *payload.get("subscriptions", []), *outgoing, *(after if isinstance(after, list) else [])]
    apps = dict(ClientApp.objects.filter(app_name__in={i.get("app") for i in named if isinstance(i, dict)
                                                       and isinstance(i.get("app"), str)}).values_list("app_name", "pk"))
    parsed = [_copy_parse(i, item, ranges, apps) for i, item in enumerate(items)]
    subs = [_subscription_parse(i, item, ranges, apps) for i, item in enumerate(payload.get("subscriptions", []))]
    copies = [c for c in parsed if c is not None]
    kept = [sub for sub in subs if sub is not None]
    with transaction.atomic():
        # Held here (taken over from `sender`): its copies go into the mailboxes here. This domain's
        # own users whose standby is `sender`: it held them (a standby copies nothing else back), and
        # this is the hand-back (messaging.federation.takeover.take), which may come before the gossip that
        # says so.
        held = _held_here_locked(sender)
        merging = [held or user_in_ranges(c["recipient"], c["app"], back) for c in copies]
        if not held and any(merging):  # the hand-back's rows, at the home
            handback_in_turn(here, sender)
        sub_merging = [held or user_in_ranges(sub["subscriber"], sub["app"], back) for sub in kept]
        merged = mailbox_merge([Copied(
            app_id=c["app_id"], recipient=c["recipient"], origin_domain=c["origin_domain"],
            origin_message_id=c["origin_message_id"], state=c["state"], delivered_at=c["delivered_at"],
            dead_at=c["dead_at"], expired_at=c["expired_at"], origin_seq=c.get("origin_seq"),
            message=c.get("message")) for c, m in zip(copies, merging, strict=True) if m])
        subscriptions_merge([sub for sub, m in zip(kept, sub_merging, strict=True) if m])
        _copies_write(sender, [c for c, m in zip(copies, merging, strict=True) if not m],
                      [sub for sub, m in zip(kept, sub_merging, strict=True) if not m])
        waiting = outgoing_accept(sender, outgoing, apps, lambda user, app: user_in_ranges(user, app, standing_by))
        followed = counts_accept(sender, after, apps) if after else 0
    refused = len(parsed) - len(copies) + len(subs) - len(kept)
    if refused:
        log.warning("%s copied %d changes of users that do not stand by here: not written", sender, refused)
    answer = {"copied": len(copies) + len(kept) + waiting, "refused": refused}
    if after:
        answer["after"] = followed
    return {**answer, "merged": merged.appended} if held or back else answer


def _held_here_locked(home: str) -> bool:
    """Whether this domain holds `home`'s users it stands by for, read under a share lock on the takeover's row
    until the caller's transaction ends: a hand-back (which locks it for update, then clears the
    mailboxes it gives back) waits for a merge under way, or the merge sees it done. Merged into a
    mailbox just given back, a copy would stay here, orphaned, and be routed to the home again."""
    with hot_cursor() as cur:
        cur.execute("SELECT t.held FROM apps_registry_takeover t"
                    " JOIN apps_registry_domain h ON h.id = t.home_id JOIN apps_registry_domain s ON s.id = t.holder_id"
                    " WHERE h.name = %s AND s.name = %s FOR SHARE OF t", [home, settings.DOMAIN_NAME])
        row = cur.fetchone()
    return bool(row and row[0])


def _copies_write(sender: str, copies: list[dict], subs: list[dict]) -> None:
    """The copies of users standing by here for `sender`: written to StandbyCopy and StandbySubscription."""
    # One row per delivery (a batch may carry a delivery twice: its arrival and a copy-again after a
    # hand-back; each as the delivery was when sent, the last the latest).
    new = list({(c["app_id"], c["recipient"], c["origin_domain"], c["origin_message_id"]): c
                for c in copies if c.get("message") is not None}.values())
    states = [c for c in copies if c.get("message") is None]
    with hot_cursor() as cur:
        if new:
            cur.execute(_NEW_SQL, {
                "home": [sender] * len(new), "did": [c["delivery"] for c in new], "app": [c["app_id"] for c in new],
                "rcpt": [c["recipient"] for c in new], "seq": [c["seq"] for c in new],
                "oseq": [c.get("origin_seq") for c in new], "sender": [c["message"]["sender"] for c in new],
                "kind": [str(c["message"].get("kind", "direct"))[:16] for c in new],
                "content": [c["message"]["content"] for c in new],
                "ref": [str(c["message"].get("reference") or "")[:256] for c in new],
                "confirm": [bool(c["message"].get("confirmation_requested")) for c in new],
                "cmid": [c["message"].get("client_message_id") for c in new],
                "origin": [c["origin_domain"] for c in new], "oid": [c["origin_message_id"] for c in new],
                **_state_params(new),
            })
        if states:
            cur.execute(_STATE_SQL, {"app": [c["app_id"] for c in states], "rcpt": [c["recipient"] for c in states],
                                     "origin": [c["origin_domain"] for c in states],
                                     "oid": [c["origin_message_id"] for c in states], **_state_params(states)})
        for sub in subs:  # in order: one made and ended ends ended
            if sub["subscribed"]:
                cur.execute("INSERT INTO messaging_standbysubscription (home, app_id, subscriber, channel, copied_at)"
                            " VALUES (%s, %s, %s, %s, now()) ON CONFLICT (app_id, subscriber, channel)"
                            " DO UPDATE SET home = EXCLUDED.home, copied_at = now()",
                            [sender, sub["app_id"], sub["subscriber"], sub["channel"]])
            else:
                cur.execute("DELETE FROM messaging_standbysubscription WHERE app_id = %s AND subscriber = %s"
                            " AND channel = %s", [sub["app_id"], sub["subscriber"], sub["channel"]])


def _subscription_parse(i: int, item, ranges: dict, apps: dict[str, int]) -> dict | None:
    where = f"subscriptions[{i}]"
    if (not isinstance(item, dict) or not isinstance(item.get("app"), str) or not isinstance(item.get("subscriber"), str)
            or not isinstance(item.get("channel"), str) or not 0 < len(item["channel"]) <= 128
            or not isinstance(item.get("subscribed"), bool)):
        raise _refuse(f"{where} must be {{app, subscriber, channel, subscribed}}")
    if item["app"] not in apps or not user_in_ranges(item["subscriber"], item["app"], ranges):
        return None
    return {**item, "app_id": apps[item["app"]]}


def _state_params(copies: list[dict]) -> dict:
    return {"state": [c["state"] for c in copies], "attempts": [c["attempts"] for c in copies],
            **{key: [c[key] for c in copies] for key in TIMES}}


_STATE_COLUMNS = "state, attempts, created_at, delivered_at, dead_at, expired_at"
_STATE_ARRAYS = ("%(state)s::text[], %(attempts)s::int[], %(created_at)s::timestamptz[], %(delivered_at)s::timestamptz[],"
                 " %(dead_at)s::timestamptz[], %(expired_at)s::timestamptz[]")

_NEW_SQL = f"""
INSERT INTO messaging_standbycopy (home, home_delivery_id, app_id, recipient, seq, origin_seq, sender, kind, content,
                                   reference, confirmation_requested, client_message_id, origin_domain,
                                   origin_message_id, {_STATE_COLUMNS}, copied_at)
SELECT *, now() FROM unnest(%(home)s::text[], %(did)s::bigint[], %(app)s::bigint[], %(rcpt)s::text[],
                            %(seq)s::bigint[], %(oseq)s::bigint[], %(sender)s::text[], %(kind)s::text[],
                            %(content)s::text[], %(ref)s::text[], %(confirm)s::bool[], %(cmid)s::text[],
                            %(origin)s::text[], %(oid)s::bigint[], {_STATE_ARRAYS})
ON CONFLICT (app_id, recipient, origin_domain, origin_message_id) DO UPDATE SET
    home = EXCLUDED.home, home_delivery_id = EXCLUDED.home_delivery_id, seq = EXCLUDED.seq, state = EXCLUDED.state, attempts = EXCLUDED.attempts, delivered_at = EXCLUDED.delivered_at,
    dead_at = EXCLUDED.dead_at, expired_at = EXCLUDED.expired_at, copied_at = now()
"""

_STATE_SQL = f"""
UPDATE messaging_standbycopy c
   SET state = t.state, attempts = t.attempts, delivered_at = t.delivered_at, dead_at = t.dead_at,
       expired_at = t.expired_at, copied_at = now()
  FROM unnest(%(app)s::bigint[], %(rcpt)s::text[], %(origin)s::text[], %(oid)s::bigint[], {_STATE_ARRAYS})
       AS t(app_id, recipient, origin, oid, state, attempts, created_at, delivered_at, dead_at, expired_at)
 WHERE c.app_id = t.app_id AND c.recipient = t.recipient AND c.origin_domain = t.origin AND c.origin_message_id = t.oid
"""
