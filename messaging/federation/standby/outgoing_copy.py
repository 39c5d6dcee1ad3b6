"""A home's outgoing queue on its standby (issue 27): the messages its users with a standby sent to
users homed elsewhere, while they wait on one of its links.

A home lost without warning takes its queues with it: what its users sent just before, to users
on other domains, would wait there until it returned, and the same users' next messages, sent
from the standby that took them over, would arrive first. So the home feeds the standby each such
message when its delivery row is queued on a link, and again when it leaves the link (sent on,
dead, or routed again): the trigger of migration messaging 0024, through the standby feed
(messaging.federation.standby.copy). The standby keeps what is waiting in StandbyOutgoing. When it takes
the home's users over, it stores those messages as the home's (the same origin and id, so every
domain on the way, and the recipient's home, takes each once, should the home send it too when it
returns) and sends them on, each with its place among the home's messages to its recipient
(messaging.federation.order): before anything the users send from here.
"""

from __future__ import annotations

from django.db import transaction

from foundation.db import hot_cursor
from foundation.handoff import routing_enqueue
from messaging.core.store import carried_id_sql, deliveries_append_sql
from messaging.federation.order import held_let_go, marks_raise
from messaging.federation.senders.follow import follows_record
from messaging.federation.wire.transport import PeerRefused
from messaging.models import DeliveryState

WAITING = DeliveryState.FORWARDING.value


def outgoing_item(*, delivery_id: int, app: str, recipient: str, state: str, origin_seq: int | None,
                  message_id: int, message: dict | None) -> dict:
    """One outgoing row of the feed as the standby call carries it (the message with a new one)."""
    item = {"delivery": delivery_id, "app": app, "recipient": recipient, "state": state, "origin_seq": origin_seq,
            "origin_message_id": message_id}
    if message is not None:
        item["message"] = message
    return item


def _parse(i: int, item, apps: dict[str, int], covered) -> dict | None:
    where = f"outgoing[{i}]"
    if (not isinstance(item, dict) or not isinstance(item.get("app"), str) or not isinstance(item.get("recipient"), str)
            or not isinstance(item.get("state"), str)):
        raise PeerRefused(400, f"{where} must be {{app, recipient, state, origin_message_id, ...}}")
    oid, seq = item.get("origin_message_id"), item.get("origin_seq")
    if not isinstance(oid, int) or isinstance(oid, bool) or (seq is not None and (not isinstance(seq, int)
                                                                                 or isinstance(seq, bool))):
        raise PeerRefused(400, f"{where}: origin_message_id (and origin_seq) must be whole numbers")
    message = item.get("message")
    if message is not None and (not isinstance(message, dict) or not isinstance(message.get("content"), str)
                                or not isinstance(message.get("sender"), str)):
        raise PeerRefused(400, f"{where}: message must carry sender and content")
    if item["app"] not in apps or (message is not None and not covered(message["sender"], item["app"])):
        return None  # its sender does not stand by here (the two ends' configurations a pull apart)
    return {**item, "app_id": apps[item["app"]]}


_WRITE_SQL = """
INSERT INTO messaging_standbyoutgoing (home, app_id, origin_message_id, recipient, origin_seq, sender, kind, content,
                                       reference, confirmation_requested, copied_at)
SELECT %(home)s, * , now() FROM unnest(%(app)s::bigint[], %(oid)s::bigint[], %(rcpt)s::text[], %(seq)s::bigint[],
                                       %(sender)s::text[], %(kind)s::text[], %(content)s::text[], %(ref)s::text[],
                                       %(confirm)s::bool[])
ON CONFLICT (home, origin_message_id, recipient) DO UPDATE SET origin_seq = EXCLUDED.origin_seq, copied_at = now()
"""

_GONE_SQL = """
DELETE FROM messaging_standbyoutgoing o USING unnest(%(oid)s::bigint[], %(rcpt)s::text[]) AS t(oid, rcpt)
 WHERE o.home = %(home)s AND o.origin_message_id = t.oid AND o.recipient = t.rcpt
"""


def outgoing_accept(home: str, items: list, apps: dict[str, int], covered) -> int:
    """At the standby, in the caller's transaction: the outgoing rows `home` fed, written (waiting
    on a link there, with its message) or deleted (gone from the link), two statements a call.
    `covered(user, app)`: whether a user stands by here for `home`. Returns how many were taken."""
    if not isinstance(items, list):
        raise PeerRefused(400, "outgoing must be a list")
    parsed = [p for i, item in enumerate(items) if (p := _parse(i, item, apps, covered)) is not None]
    last: dict[tuple[int, str], dict] = {}
    message: dict[tuple[int, str], dict] = {}
    for p in parsed:  # in feed order: the last word on a row wins (queued, gone, queued again: queued)
        key = (p["origin_message_id"], p["recipient"])
        last[key] = p
        if p.get("message") is not None:
            message[key] = p["message"]
    waiting = [(key, p, message[key]) for key, p in last.items() if p["state"] == WAITING and key in message]
    gone = [key for key, p in last.items() if p["state"] != WAITING]
    with hot_cursor() as cur:
        if waiting:
            cur.execute(_WRITE_SQL, {
                "home": home, "app": [p["app_id"] for _, p, _ in waiting], "oid": [k[0] for k, _, _ in waiting],
                "rcpt": [k[1] for k, _, _ in waiting], "seq": [p["origin_seq"] for _, p, _ in waiting],
                "sender": [m["sender"] for _, _, m in waiting],
                "kind": [str(m.get("kind") or "direct")[:16] for _, _, m in waiting],
                "content": [m["content"] for _, _, m in waiting],
                "ref": [str(m.get("reference") or "")[:256] for _, _, m in waiting],
                "confirm": [bool(m.get("confirmation_requested")) for _, _, m in waiting]})
        if gone:
            cur.execute(_GONE_SQL, {"home": home, "oid": [k[0] for k in gone], "rcpt": [k[1] for k in gone]})
    # The home's highest place among its messages to each recipient that the feed showed: what the
    # home's users send from here, should this domain take them over, goes in at the recipient's home
    # after it (messaging.federation.order).
    follows_record(senders_home=home, origin=home,
                   rows=[(p["app_id"], p["recipient"], p["origin_seq"]) for p in parsed])
    return len(parsed)


# Each keeps its id at the home (carried_id_sql): the recipient sees the id the sender was given.
_MESSAGES_SQL = f"""
INSERT INTO messaging_message (id, app_id, sender, kind, content, reference, confirmation_requested, client_message_id,
                               origin_domain, origin_message_id, forward_path, confirms_origin, created_at)
SELECT {carried_id_sql("o.origin_message_id")}, * FROM (
SELECT DISTINCT ON (o.origin_message_id) o.app_id, o.sender, o.kind, o.content, o.reference,
       o.confirmation_requested, NULL, o.home, o.origin_message_id, o.home, '', now()
  FROM messaging_standbyoutgoing o WHERE o.home = %(home)s
 ORDER BY o.origin_message_id) o
ON CONFLICT DO NOTHING
"""

_DELIVERIES_SQL = f"""
WITH fan AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY o.app_id, o.recipient, o.origin_seq, o.origin_message_id) AS ord,
           m.id AS message_id, o.app_id, o.recipient, o.origin_seq
      FROM messaging_standbyoutgoing o
      JOIN messaging_message m ON m.origin_domain = o.home AND m.origin_message_id = o.origin_message_id
     WHERE o.home = %(home)s
       AND NOT EXISTS (SELECT 1 FROM messaging_delivery d WHERE d.message_id = m.id AND d.recipient = o.recipient)
), {deliveries_append_sql("fan", origin_seq=True)}
SELECT ARRAY(SELECT id FROM new_deliveries ORDER BY id)
"""


# A recipient homed here (the home's users wrote to this domain's own): the next message from the
# home to it is expected after the last one stored now (messaging.federation.order), as after a merge.
_WAITING_SEQS = "SELECT app_id, recipient, home, origin_seq FROM messaging_standbyoutgoing WHERE home = %(home)s"


def outgoing_take(home: str) -> int:
    """At a standby taking `home`'s users over, in the caller's transaction: what was waiting on the
    home's links, stored here as the home's messages and routed on once committed (each recipient's
    in the home's order). Returns how many deliveries that made."""
    with hot_cursor() as cur:
        cur.execute(_MESSAGES_SQL, {"home": home})
        cur.execute(_DELIVERIES_SQL, {"home": home})
        ids = list(cur.fetchone()[0])
        behind = marks_raise(_WAITING_SEQS, {"home": home})
        cur.execute("DELETE FROM messaging_standbyoutgoing WHERE home = %s", [home])
    routed = ids + held_let_go(behind)  # (what the home sent them after those, held for them, goes in now)
    if routed:
        transaction.on_commit(lambda: routing_enqueue(routed))
    return len(ids)
