"""The hand-back's counts: what the users given back send from home follows, at each recipient's
home, what they sent from the holder (messaging.federation.order, OrderAfter).

While a holder serves a home's users, what they send to users homed elsewhere leaves with the
holder's origin and its count for each recipient. Once they are home again, what they send leaves
with the home's origin: ordered on its own, it could go in before their last messages from the
holder, still on their way (a backlog on the holder's links, a longer path). So the holder's
hand-back, after its last feed call and in the same transaction, tells the home its count for each
recipient those users wrote to while it held them (`counts_send`, the `after` key of
POST /internal/v1/standby). The home keeps each as an OrderAfter row for
NETWORK_ORDER_WAIT_SECONDS (`counts_accept`): what its users send those recipients meanwhile says,
in the forwarding call, that it comes after the holder's message of that count.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings

from foundation.db import hot_cursor
from messaging.federation.senders.follow import follows_record
from messaging.federation.takeover.held_rows import in_ranges
from messaging.federation.wire.transport import STANDBY_PATH, PeerError, PeerRefused, peer_call

log = logging.getLogger(__name__)

# The holder's count for each recipient that a message stored here first from the home's users (in
# the ranges it held) went to since the takeover (a minute's margin: the takeover's time is this
# process's clock, a message's the transaction's start; a recipient of an earlier hold counts too, harmlessly).
_COUNTS_SQL = f"""
SELECT a.app_name, mb.user_id, mb.origin_last_seq
  FROM messaging_mailbox mb JOIN apps_registry_clientapp a ON a.id = mb.app_id
 WHERE mb.origin_last_seq > 0 AND (mb.app_id, mb.user_id) IN (
       SELECT m.app_id, d.recipient FROM messaging_message m {in_ranges("m", "sender")}
         JOIN messaging_delivery d ON d.message_id = m.id
        WHERE m.origin_message_id IS NULL AND m.created_at >= %(since)s - interval '1 minute'
          AND d.origin_seq IS NOT NULL)
 ORDER BY 1, 2
"""


def handback_counts(params: dict, since: datetime) -> list[dict]:
    """At the holder: [{app, recipient, seq}] for the home and standby named by `params`
    (held_rows.ranges_params) since `since`, the takeover."""
    with hot_cursor() as cur:
        cur.execute(_COUNTS_SQL, {**params, "since": since})
        return [{"app": app, "recipient": recipient, "seq": seq} for app, recipient, seq in cur.fetchall()]


def counts_send(home: str, counts: list[dict]) -> bool:
    """At the holder, inside the hand-back's transaction: `counts` told to `home` (nothing to tell:
    True at once). False when the call failed (the hand-back waits, and tries again)."""
    if not counts:
        return True
    try:
        peer_call(peer=home, path=STANDBY_PATH, payload={"after": counts})
    except PeerError as exc:
        log.warning("the hand-back's counts for %s could not be sent: %s", home, exc.reason)
        return False
    log.info("told %s the counts of %d recipients its users wrote to from here", home, len(counts))
    return True


def counts_accept(holder: str, items, apps: dict[str, int]) -> int:
    """At the home, in the caller's transaction: the counts its former `holder` sent with its
    hand-back, kept as OrderAfter rows for NETWORK_ORDER_WAIT_SECONDS. Malformed: PeerRefused (400);
    an app not known here: left out. Returns how many were kept."""
    if (not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("app"), str) and isinstance(i.get("recipient"), str)
            and 0 < len(i["recipient"]) <= 96 and isinstance(i.get("seq"), int) and not isinstance(i["seq"], bool)
            and i["seq"] > 0 for i in items)):
        raise PeerRefused(400, "after must be a list of {app, recipient, seq} (seq a positive whole number)")
    kept = [i for i in items if i["app"] in apps]
    follows_record(senders_home=settings.DOMAIN_NAME, origin=holder,
                   rows=[(apps[i["app"]], i["recipient"], i["seq"]) for i in kept],
                   wait=settings.NETWORK_ORDER_WAIT_SECONDS)
    return len(kept)
