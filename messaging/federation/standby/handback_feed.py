"""The hand-back's sends of the feed to the home (messaging.federation.takeover.take.hand_back): the
feed sent ahead on the takeover watch's thread (`feed_drain`), then its last call, which leaves
nothing behind or sends nothing (`feed_send_last`). Both run the standby's sender on the outbound
skeleton, past the link's backoff: the home is heard again."""

from __future__ import annotations

import logging

from foundation.outbound import Outcome, send_batches
from messaging.federation.standby.copy import StandbySender

log = logging.getLogger(__name__)


class LastCallSender(StandbySender):
    """The hand-back's last call (feed_send_last): asked for by a hand-back, whose home answers again
    (its gossip is heard), so the link's backoff does not hold it back, as it never did."""

    def held_back(self) -> bool:
        return False


def _send(standby: str, what: str, **limits) -> Outcome | None:
    """The standby's sender run past the link's backoff, within `limits`; None when it raised (the
    hand-back waits; the sender goes on as ever), logged with `what` was being sent."""
    try:
        outcome = send_batches(LastCallSender(standby), **limits)
    except Exception as exc:
        log.warning("%s for %s could not be sent: %s", what, standby, exc)
        return None
    if outcome.error:
        log.warning("%s for %s could not be sent: %s", what, standby, outcome.error)
    return outcome


def feed_send_last(*, standby: str) -> bool:
    """Inside the caller's transaction (a hand-back, with the feed to `standby` held in turn): send what is left
    of the feed to `standby` in one call, if one call takes it all, and delete it: the skeleton's run
    of the standby's sender, under its lock, with `whole`. Returns whether nothing is left (False:
    more than one call's worth, its sender busy, or the call failed, recorded on the rows and the
    link as the sender records a failure; the rows stay, and the hand-back waits)."""
    outcome = _send(standby, "the last changes (the hand-back's call)", max_batches=1, whole=True)
    return outcome is not None and not (outcome.skipped or outcome.error)


def feed_drain(*, standby: str, budget_seconds: float) -> int:
    """Before a hand-back's last call, outside its transaction (stores go on meanwhile): the feed to
    `standby` sent on the caller's thread, in as many calls as `budget_seconds` allow, past the link's
    backoff as the last call is (the home is heard again). Returns how many rows went. Left to the
    standby's sender, the hand-back waited behind the worker's queue: 5 minutes in a fault run on a
    busy machine, its beat's sweeps of the feed discarded as expired, the users refused everywhere
    meanwhile. The sender at work on the feed already (its lock held): nothing, it is being sent."""
    outcome = _send(standby, "the changes ahead of the hand-back", budget_seconds=budget_seconds)
    return 0 if outcome is None else outcome.sent
