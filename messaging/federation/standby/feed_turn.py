"""The feed to one standby held off: every row joining the feed to a standby waits while that
standby's turn is held (a BEFORE INSERT trigger, migration messaging 0030). A hand-back holds its
home's turn (`feed_in_turn`) from its last look at the feed to its commit, so no change to the users
it gives back joins the feed in between; the feeds to other standbys, and the stores that make
them, go on (a lock of the feed's whole table held them all, across the hand-back's call to the
home). What it costs a store: `python -m bench.feed_turn` (about 3 µs a feed row).
"""

from __future__ import annotations

from foundation.locks import in_turn

FEED_TURN_PREFIX = "standby feed to "


def feed_in_turn(standby: str) -> None:
    """Until the caller's transaction ends, nothing joins the feed to `standby` (whoever adds a row waits)."""
    in_turn(FEED_TURN_PREFIX + standby)
