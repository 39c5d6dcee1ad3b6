"""The presence report over a day of sessions with chosen times, on a real Spark session."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from analytics.jobs import datasets as ds
from analytics.models import Report
from analytics.services import lake_export, report_run
from tests.analytics.conftest import tenant

pytestmark = pytest.mark.django_db  # reads the module's committed scenario

# The reported day (shared by the backlog and cluster tests) lies further back than the oldest row of
# a backlog aged relative to now (30 days): a fixed date let a "3 days old" pending row fall inside
# the report on one day of the year.
DAY = (datetime.now(UTC) - timedelta(days=45)).replace(hour=0, minute=0, second=0, microsecond=0)
NEXT_DAY = DAY + timedelta(days=1)


def at(hh: int, mm: int = 0, ss: int = 0, day: datetime = DAY) -> datetime:
    return day.replace(hour=hh, minute=mm, second=ss)


def a_day_of_sessions(activity) -> None:
    """ANZ on domain-01, BNZ on domain-02, CNZ (100 sessions of 1..100 minutes) on domain-03."""
    anz, bnz, cnz = tenant("ANZ"), tenant("BNZ"), tenant("CNZ")
    web1, web2, web3 = activity.node("web-1", "domain-01"), activity.node("web-2", "domain-02"), \
        activity.node("web-3", "domain-03")
    activity.session(anz, "ANZ-1", web1, at(10), at(10, 30))
    activity.session(anz, "ANZ-2", web1, at(10, 10), at(10, 20))
    activity.session(anz, "ANZ-3", web1, at(10, 15, 30), at(10, 15, 45))
    activity.session(anz, "ANZ-4", web1, at(23, 50, day=DAY - timedelta(days=1)), at(0, 10))  # across midnight
    activity.session(anz, "ANZ-1", web1, at(9))  # still connected
    activity.session(bnz, "BNZ-1", web2, at(10, 15), at(10, 16), reason="node died")
    for minutes in range(1, 101):
        activity.session(cnz, f"CNZ-{minutes}", web3, at(20), at(20) + timedelta(minutes=minutes))


def _figures(report: Report, metric: str, grain: str, **filters) -> dict:
    rows = report.rows.filter(metric=metric, grain=grain, **filters)
    return {(r.app, r.subgroup, r.period, r.bucket): r.value for r in rows}


@pytest.fixture(scope="module")
def presence_report(module_scenario, spark) -> Report:
    def build(activity, lake):
        a_day_of_sessions(activity)
        lake_export()
        return report_run(kind="presence", since=DAY, until=NEXT_DAY)

    return module_scenario(build)


def test_concurrency_per_minute_counts_the_most_connections_open_at_once(presence_report):
    anz = {period: v for (_, _, period, _), v in
           _figures(presence_report, ds.CONCURRENT, ds.MINUTE, app="ANZ", subgroup="domain-01").items()}
    assert len(anz) == 24 * 60
    assert anz[at(0, 9)] == 1 and anz[at(0, 10)] == 0  # ANZ-4 left at 00:10:00 sharp
    assert anz[at(9, 0)] == 1 and anz[at(10, 0)] == 2
    assert anz[at(10, 14)] == 3 and anz[at(10, 15)] == 4 and anz[at(10, 16)] == 3
    assert anz[at(10, 20)] == 2 and anz[at(10, 30)] == 1  # sessions are [start, end)
    assert anz[at(23, 59)] == 1  # the open session counts up to the end of the range

    everyone = _figures(presence_report, ds.CONCURRENT, ds.MINUTE, app="", subgroup="")
    assert everyone[("", "", at(10, 15), "")] == 5  # ANZ's four and BNZ-1
    assert everyone[("", "", at(20, 0), "")] == 101  # CNZ's hundred and ANZ-1's open session


def test_the_peak_is_reported_per_app_and_domain_and_for_everyone(presence_report):
    assert _figures(presence_report, ds.PEAK_CONCURRENT, ds.RANGE) == {
        ("ANZ", "domain-01", DAY, ""): 4,
        ("BNZ", "domain-02", DAY, ""): 1,
        ("CNZ", "domain-03", DAY, ""): 100,
        ("", "", DAY, ""): 101,
    }


def test_unique_users_are_counted_per_day(presence_report):
    assert _figures(presence_report, ds.UNIQUE_USERS, ds.DAY_GRAIN) == {
        ("ANZ", "domain-01", DAY, ""): 4,
        ("BNZ", "domain-02", DAY, ""): 1,
        ("CNZ", "domain-03", DAY, ""): 100,
        ("", "", DAY, ""): 105,
    }


def test_session_length_percentiles_cover_sessions_that_ended_in_the_range(presence_report):
    lengths = _figures(presence_report, ds.SESSION_LENGTH, ds.RANGE)
    assert {b: v for (app, _, _, b), v in lengths.items() if app == "CNZ"} == {
        "p50": 50 * 60, "p90": 90 * 60, "p99": 99 * 60}
    assert {b: v for (app, _, _, b), v in lengths.items() if app == "ANZ"} == {
        "p50": 600, "p90": 1800, "p99": 1800}  # 15 s, 10 min, 20 min (across midnight), 30 min
    ended = _figures(presence_report, ds.SESSIONS_ENDED, ds.RANGE)
    assert ended[("ANZ", "domain-01", DAY, "")] == 4 and ended[("", "", DAY, "")] == 105


def test_connects_and_disconnects_are_counted_per_hour(presence_report):
    assert _figures(presence_report, ds.CONNECTS, ds.HOUR, app="ANZ") == {
        ("ANZ", "domain-01", at(9), ""): 1, ("ANZ", "domain-01", at(10), ""): 3}
    assert _figures(presence_report, ds.DISCONNECTS, ds.HOUR, app="ANZ") == {
        ("ANZ", "domain-01", at(0), ""): 1, ("ANZ", "domain-01", at(10), ""): 3}


def test_the_users_with_the_most_connected_time_are_listed_per_app(presence_report):
    top = _figures(presence_report, ds.TOP_USERS, ds.RANGE, app="ANZ")
    assert {user: v for (_, _, _, user), v in top.items()} == {
        "ANZ-1": 30 * 60 + 15 * 3600, "ANZ-2": 600, "ANZ-4": 600, "ANZ-3": 15}
    assert len(_figures(presence_report, ds.TOP_USERS, ds.RANGE, app="CNZ")) == ds.TOP_USERS_PER_APP


def test_the_report_says_which_snapshot_of_open_sessions_it_read(presence_report):
    assert presence_report.as_of is not None
    assert presence_report.as_of > NEXT_DAY
