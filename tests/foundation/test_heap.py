"""A web node's garbage collector (foundation.heap): its young generation collected less often."""

from __future__ import annotations

import gc

import pytest

from foundation.heap import gc_young_threshold


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_a_web_node_collects_its_young_objects_once_ten_thousand_more_were_made_and_keeps_the_older_thresholds(
        thresholds, settings):
    gc.set_threshold(700, 10, 10)

    gc_young_threshold(settings.WEB_GC_YOUNG_THRESHOLD)

    assert settings.WEB_GC_YOUNG_THRESHOLD == 10_000 and gc.get_threshold() == (10_000, 10, 10)


def test_a_threshold_of_zero_leaves_pythons_own(thresholds):
    gc.set_threshold(700, 10, 10)

    gc_young_threshold(0)

    assert gc.get_threshold() == (700, 10, 10)
