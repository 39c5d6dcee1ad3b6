"""A master connection's record of what it told: a notice is written only when it changes that, and
a re-check writes exactly the difference from who is online."""

from __future__ import annotations

import json

from presence.master_view import MasterView


def frames(view_frames: list[str]) -> list[tuple[str, str]]:
    return [(f["type"], f["data"]["userId"]) for f in map(json.loads, view_frames)]


def test_a_notice_is_written_only_when_it_changes_what_the_master_was_told():
    view = MasterView({"ANZ-1"})
    assert view.notice("ANZ-1", True) is False  # listed in the snapshot already
    assert view.notice("ANZ-2", False) is False  # never listed: nothing to take back
    assert view.notice("ANZ-2", True) is True
    assert view.notice("ANZ-1", False) is True
    assert view.told == {"ANZ-2"}


def test_a_re_check_writes_the_difference_leavers_first_then_arrivals_and_then_nothing():
    view = MasterView({"ANZ-1", "ANZ-2"})
    assert frames(view.resync({"ANZ-2", "ANZ-3"})) == [("USER_DISCONNECTED", "ANZ-1"), ("USER_CONNECTED", "ANZ-3")]
    assert view.resync({"ANZ-2", "ANZ-3"}) == []
    assert view.notice("ANZ-3", True) is False  # the late announcement of what the re-check told
