"""A failure that repeats is logged once per kind and window, with a count."""

from __future__ import annotations

import logging

from foundation.logs import RepeatFilter


def _record(msg: str, *args, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("postgres is down")
        except RuntimeError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("messaging.batching", logging.ERROR, __file__, 1, msg, args, exc_info)


def test_repeats_of_one_kind_are_held_back_and_counted(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("foundation.logs.time.monotonic", lambda: clock[0])
    repeats = RepeatFilter(window=10)
    passed = [repeats.filter(_record("flushing %d items failed", n, exc=True)) for n in range(5000)]
    assert passed.count(True) == 1
    assert repeats.filter(_record("another kind of failure")) is True
    clock[0] += 11
    summary = _record("flushing %d items failed", 1)
    assert repeats.filter(summary) is True
    assert summary.getMessage() == "flushing 1 items failed (4999 similar suppressed in the last 10s)"


def test_the_filter_stays_bounded_under_a_flood_of_distinct_messages():
    repeats = RepeatFilter(window=10, max_kinds=100)
    for n in range(1000):
        repeats.filter(_record(f"distinct {n}"))
    assert len(repeats._seen) <= 100
