"""The backlog report over deliveries with chosen states and times, on a real Spark session."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from analytics.jobs import datasets as ds
from analytics.models import Report
from analytics.services import lake_export, report_run
from tests.analytics.conftest import tenant
from tests.analytics.test_presence_report import DAY

pytestmark = pytest.mark.django_db  # reads the module's committed scenario

NOON = DAY.replace(hour=12)
MS = timedelta(milliseconds=1)


def deliveries_with_known_answers(activity) -> datetime:
    """Delivered ones accepted on DAY with chosen latencies; a backlog aged relative to now."""
    anz, bnz = tenant("ANZ"), tenant("BNZ")
    for i in range(1, 11):  # 100, 200, ... 1000 ms; two needed a second attempt
        activity.delivery(anz, NOON + i * timedelta(minutes=1), state="delivered", attempts=2 if i > 8 else 1,
                          delivered_at=NOON + i * timedelta(minutes=1) + i * 100 * MS)
    for latency in (50, 150):
        activity.delivery(anz, NOON, kind="group", state="delivered", attempts=1, delivered_at=NOON + latency * MS)
    activity.delivery(bnz, NOON, to="BNZ-2", sender="BNZ-1", state="delivered", attempts=1,
                      delivered_at=NOON + 2000 * MS)
    activity.delivery(anz, NOON, state="expired", attempts=3)

    now = timezone.now()
    for age in (timedelta(seconds=10), timedelta(minutes=10), timedelta(hours=5), timedelta(days=3),
                timedelta(days=30)):
        activity.delivery(anz, now - age)
    activity.delivery(anz, now - timedelta(hours=5), state="sent", attempts=1)
    activity.delivery(anz, now - timedelta(minutes=2), state="retrying", attempts=1, last_error="push failed")
    activity.delivery(anz, now - timedelta(hours=2), state="dead", attempts=3, last_error="timeout")
    activity.delivery(anz, now - timedelta(hours=2), state="dead", attempts=3, last_error="timeout")
    activity.delivery(anz, now - timedelta(days=10), state="dead", attempts=3, last_error="node gone")
    activity.delivery(bnz, now - timedelta(hours=2), to="BNZ-2", sender="BNZ-1", state="dead", attempts=10,
                      last_error="timeout")
    return now - timedelta(days=30)


@pytest.fixture(scope="module")
def backlog(module_scenario, spark) -> tuple[Report, datetime]:
    def build(activity, lake):
        oldest = deliveries_with_known_answers(activity)
        lake_export()
        return report_run(kind="backlog", since=DAY, until=DAY + timedelta(days=1)), oldest

    return module_scenario(build)


def _figures(report: Report, metric: str, **filters) -> dict:
    return {(r.app, r.subgroup, r.bucket): r.value for r in report.rows.filter(metric=metric, **filters)}


def test_pending_and_dead_deliveries_are_counted_by_app_and_age(backlog):
    report, _ = backlog
    assert _figures(report, ds.BACKLOG, app="ANZ") == {
        ("ANZ", "pending", "< 1 min"): 1,
        ("ANZ", "pending", "1 min – 1 h"): 2,  # the 10-minute-old one and the retrying one
        ("ANZ", "pending", "1 h – 1 day"): 2,  # pending and sent, both 5 hours old
        ("ANZ", "pending", "1 – 7 days"): 1,
        ("ANZ", "pending", "> 7 days"): 1,
        ("ANZ", "dead", "1 h – 1 day"): 2,
        ("ANZ", "dead", "> 7 days"): 1,
    }
    assert _figures(report, ds.BACKLOG, app="", subgroup="dead") == {
        ("", "dead", "1 h – 1 day"): 3, ("", "dead", "> 7 days"): 1}


def test_the_oldest_pending_is_reported_with_its_age_at_the_snapshot(backlog):
    report, oldest = backlog
    expected = (report.as_of - oldest).total_seconds()
    assert _figures(report, ds.OLDEST_PENDING) == {
        ("ANZ", "", ""): pytest.approx(expected, abs=1e-3), ("", "", ""): pytest.approx(expected, abs=1e-3)}
    assert expected > 30 * 86400


def test_delivery_latency_percentiles_are_reported_by_app_and_feature(backlog):
    report, _ = backlog
    latency = _figures(report, ds.LATENCY)
    assert {b: v for (app, feature, b), v in latency.items() if (app, feature) == ("ANZ", "direct")} == {
        "p50": 500, "p90": 900, "p99": 1000}
    assert {b: v for (app, feature, b), v in latency.items() if (app, feature) == ("ANZ", "group")} == {
        "p50": 50, "p90": 150, "p99": 150}
    assert latency[("BNZ", "direct", "p50")] == 2000
    assert latency[("", "", "p99")] == 2000
    delivered = _figures(report, ds.DELIVERED)
    assert (delivered[("ANZ", "direct", "")], delivered[("ANZ", "", "")], delivered[("", "", "")]) == (10, 12, 13)


def test_attempts_are_distributed_by_final_state(backlog):
    report, _ = backlog
    assert _figures(report, ds.ATTEMPTS, app="ANZ") == {
        ("ANZ", "delivered", "1"): 10, ("ANZ", "delivered", "2"): 2, ("ANZ", "expired", "3"): 1}
    assert _figures(report, ds.ATTEMPTS, app="", subgroup="delivered") == {
        ("", "delivered", "1"): 11, ("", "delivered", "2"): 2}


def test_dead_letters_are_grouped_by_their_last_error(backlog):
    report, _ = backlog
    assert _figures(report, ds.DEAD_LETTERS) == {
        ("ANZ", "", "timeout"): 2, ("ANZ", "", "node gone"): 1, ("BNZ", "", "timeout"): 1,
        ("", "", "timeout"): 3, ("", "", "node gone"): 1,
    }
