"""`make run` gives its web node the time to drain before it kills it."""

from __future__ import annotations

from devstack.rolling import web_stop_timeout


def test_the_web_node_may_drain_its_whole_window_and_grace_before_it_is_killed():
    assert web_stop_timeout({}) > 10 + 5
    assert web_stop_timeout({"DRAIN_SECONDS": "30", "DRAIN_GRACE_SECONDS": "2"}) > 30 + 2
