"""A web node's garbage collector (foundation.heap): its young generation collected less often, a
full pass considered as often as with Python's own thresholds."""

from __future__ import annotations

import gc

import pytest

from foundation.heap import gc_thresholds


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_a_web_node_collects_its_young_objects_once_ten_thousand_more_were_made(thresholds, settings):
    gc.set_threshold(700, 10, 10)

    gc_thresholds(settings.WEB_GC_THRESHOLDS)

    young, middle, old = gc.get_threshold()
    assert young == 10_000
    # a full pass considered about as often, in allocations (a generation is collected once its count
    # is over its threshold): every 80,000 here, 84,821 with Python's own
    every = (young + 1) * (middle + 1) * (old + 1)
    assert abs(every - 701 * 11 * 11) < 0.1 * 701 * 11 * 11


def test_no_thresholds_leave_pythons_own(thresholds):
    gc.set_threshold(700, 10, 10)

    gc_thresholds(())

    assert gc.get_threshold() == (700, 10, 10)
