"""A web node's garbage collector (foundation.heap): its young generation collected less often, a
full pass considered as often as with Python's own thresholds, and what a full pass leaves alive
frozen out of the next ones' walk."""

from __future__ import annotations

import gc
import weakref

import pytest

from foundation.heap import gc_thresholds, survivors_freeze


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


class Held:
    """A tracked object, as a connection's are."""


@pytest.fixture
def freezing_survivors():
    survivors_freeze(True)
    yield
    survivors_freeze(False)
    gc.unfreeze()


def test_what_a_full_pass_leaves_alive_is_out_of_the_next_passes_walk(freezing_survivors):
    held = [Held() for _ in range(1000)]

    gc.collect()

    walked = {id(o) for o in gc.get_objects()}  # every generation a pass may walk
    assert not any(id(o) in walked for o in held)
    made_since = Held()
    assert any(o is made_since for o in gc.get_objects())


def test_what_was_frozen_is_still_freed_when_nothing_holds_it(freezing_survivors):
    held = [Held() for _ in range(1000)]
    gc.collect()
    frozen = gc.get_freeze_count()
    probe = weakref.ref(held[0])

    del held

    assert probe() is None  # by its reference count, with no pass of the collector
    assert gc.get_freeze_count() <= frozen - 1000


def test_without_the_setting_a_full_pass_freezes_nothing():
    survivors_freeze(False)
    before = gc.get_freeze_count()
    held = [Held() for _ in range(1000)]

    gc.collect()

    assert gc.get_freeze_count() == before
    assert held
