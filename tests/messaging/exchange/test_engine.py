"""The exchange engine in memory: sequence order, the follow graph, recipients, gaps."""

from __future__ import annotations

import random

from messaging.exchange.engine import Engine, line_parse


def ev(line: str):
    event = line_parse(line.encode() + b"\n")
    assert event is not None, line
    return event


def applied_lines(engine: Engine) -> list[str]:
    return [e[4].decode().strip() for e, _ in engine.batch_take().events]


def test_shuffled_batches_are_applied_in_sequence_order():
    lines = [f"{n}|P|1|2" for n in range(1, 1001)]
    shuffled = []
    for start in range(0, 1000, 100):
        chunk = lines[start:start + 100]
        random.Random(start).shuffle(chunk)
        shuffled += chunk
    engine = Engine()
    engine.offer_many(ev(line) for line in shuffled)
    assert applied_lines(engine) == lines
    assert engine.applied_seq == 1000 and not engine.held


def test_events_behind_a_gap_wait_until_it_is_filled_and_duplicates_are_ignored():
    engine = Engine()
    engine.offer_many([ev("1|B"), ev("3|B"), ev("4|B"), ev("3|B")])
    assert applied_lines(engine) == ["1|B"]
    assert engine.gap_seq == 2 and len(engine.held) == 2
    engine.offer_many([ev("2|B"), ev("1|B")])
    assert applied_lines(engine) == ["2|B", "3|B", "4|B"]
    assert engine.gap_seq is None


def test_follow_notifies_the_followed_and_status_reaches_current_followers_only():
    engine = Engine(connected={1, 2, 3, 9})
    engine.offer_many([ev("1|F|1|9"), ev("2|F|2|9"), ev("3|S|9"), ev("4|U|1|9"), ev("5|S|9"), ev("6|P|9|3")])
    got = [(e[0], r) for e, r in engine.batch_take().events]
    assert got == [(1, (9,)), (2, (9,)), (3, {1, 2}), (4, ()), (5, {2}), (6, (3,))]


def test_absent_users_miss_notifications_but_the_graph_still_changes():
    engine = Engine(connected={2})
    engine.offer_many([ev("1|F|2|7"), ev("2|P|2|7"), ev("3|S|7"), ev("4|B")])
    got = [(e[0], r) for e, r in engine.batch_take().events]
    assert got == [(1, ()), (2, ()), (3, {2}), (4, None)]  # None: every connected user
    assert engine.followers[7] == {2}


def test_a_batch_carries_the_net_graph_change():
    engine = Engine()
    engine.offer_many([ev("1|F|1|2"), ev("2|F|3|2"), ev("3|U|1|2"), ev("4|U|5|6"), ev("5|F|5|6")])
    batch = engine.batch_take()
    assert sorted(batch.adds) == [(3, 2), (5, 6)] and batch.removes == [(1, 2)]
    assert batch.applied_seq == 5


def test_malformed_lines_are_refused():
    for bad in [b"x|B\n", b"1|Q|2|3\n", b"1|F|2\n", b"1|B|2|3|4\n", b"0|B\n", b"1|P|a|b\n", b"\n", b"|||\r\n"]:
        assert line_parse(bad) is None, bad
    assert line_parse(b"7|S|32\r\n") == (7, "S", 32, None, b"7|S|32\r\n")


def test_a_gap_is_reported_then_given_up_after_the_timeout():
    now = [100.0]
    engine = Engine(gap_report_seconds=5, gap_timeout_seconds=30, clock=lambda: now[0])
    engine.offer_many([ev("1|B"), ev("4|B"), ev("5|B")])
    applied_lines(engine)
    assert engine.tick() is False
    now[0] = 106.0
    assert engine.tick() is True and engine.gap_reported
    now[0] = 131.0
    assert engine.tick() is True
    batch = engine.batch_take()
    assert [e[0] for e, _ in batch.events] == [4, 5] and batch.skipped == 2
    assert engine.gap_seq is None
    engine.offer(ev("2|B"))  # too late: a duplicate now
    assert engine.batch_take().events == []


def test_a_timeout_of_zero_waits_forever():
    now = [0.0]
    engine = Engine(gap_report_seconds=1, gap_timeout_seconds=0, clock=lambda: now[0])
    engine.offer(ev("2|B"))
    now[0] = 10_000.0
    engine.tick()
    assert engine.applied_seq == 0 and engine.gap_seq == 1 and engine.gap_reported


def test_a_batch_returned_after_a_failed_commit_goes_out_with_the_next_one_in_order():
    engine = Engine()
    engine.offer(line_parse(b"1|F|2|1\n"))
    first = engine.batch_take()
    engine.offer(line_parse(b"2|U|2|1\n"))
    engine.offer(line_parse(b"3|F|3|1\n"))
    engine.batch_return(first)
    batch = engine.batch_take()
    assert [e[0] for e, _ in batch.events] == [1, 2, 3]
    assert batch.applied_seq == 3
    assert batch.adds == [(3, 1)] and batch.removes == [(2, 1)]  # the later change of a pair wins
