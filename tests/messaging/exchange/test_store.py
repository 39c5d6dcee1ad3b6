"""The follow graph in Postgres: group commits, and an engine restarted from the database."""

from __future__ import annotations

import pytest

from messaging.exchange.engine import Engine, line_parse
from messaging.exchange.models import ExchangeState, Follow
from messaging.exchange.store import exchange_batch_commit, exchange_state_load, follow_graph_load
from tests.factories import make_app

pytestmark = pytest.mark.django_db


def run(engine: Engine, app_id: int, *lines: str) -> None:
    engine.offer_many(line_parse(line.encode() + b"\n") for line in lines)
    batch = engine.batch_take()
    exchange_batch_commit(app_id=app_id, applied_seq=batch.applied_seq, adds=batch.adds, removes=batch.removes)


def test_a_restarted_engine_has_the_same_followers_and_resumes_after_the_last_commit():
    app = make_app()
    state = exchange_state_load(app_id=app.pk)
    engine = Engine(applied_seq=state.applied_seq, followers=follow_graph_load(app_id=app.pk))
    run(engine, app.pk, "1|F|1|9", "2|F|2|9", "3|F|3|8")
    run(engine, app.pk, "4|U|1|9", "5|F|1|8", "6|F|4|9", "7|U|4|9")

    state = exchange_state_load(app_id=app.pk)
    restarted = Engine(applied_seq=state.applied_seq, followers=follow_graph_load(app_id=app.pk), connected={1, 2, 3})
    assert state.applied_seq == 7
    assert restarted.followers == {9: {2}, 8: {1, 3}}
    assert set(Follow.objects.filter(app=app).values_list("follower", "followee")) == {(2, 9), (3, 8), (1, 8)}
    restarted.offer(line_parse(b"7|S|9\n"))  # already applied: ignored
    restarted.offer(line_parse(b"8|S|8\n"))
    assert [(e[0], r) for e, r in restarted.batch_take().events] == [(8, {1, 3})]


def test_the_gap_report_and_counters_reach_the_state_row():
    app = make_app()
    exchange_state_load(app_id=app.pk)
    exchange_batch_commit(app_id=app.pk, applied_seq=3, adds=[], removes=[], skipped=2, malformed=1,
                          gap_seq=4, gap_age=10.0, held=5)
    state = ExchangeState.objects.get(app=app)
    assert (state.applied_seq, state.skipped, state.malformed, state.gap_seq, state.held) == (3, 2, 1, 4, 5)
    assert state.gap_since is not None
