"""The console: the dashboard front page, report pages with charts and CSV, the on-demand buttons."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from analytics import tasks
from analytics.jobs import datasets as ds
from analytics.models import JobRun, Report, ReportRow
from foundation.handoff import DEFAULT_QUEUE

pytestmark = pytest.mark.django_db

DAY = datetime(2026, 11, 20, tzinfo=UTC)


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("operator", password="x"))
    return client


def _report(kind: str, rows: list[tuple]) -> Report:
    report = Report.objects.create(kind=kind, since=DAY, until=DAY + timedelta(days=1), as_of=DAY + timedelta(days=2))
    ReportRow.objects.bulk_create(
        [ReportRow(report=report, metric=m, grain=g, period=p, app=a, subgroup=s, bucket=b, value=v)
         for m, g, p, a, s, b, v in rows])
    return report


@pytest.fixture
def presence_report() -> Report:
    minutes = [(ds.CONCURRENT, ds.MINUTE, DAY + timedelta(minutes=i), app, sub, "", v)
               for i in range(0, 1440, 30) for app, sub, v in (("", "", i // 30), ("ANZ", "domain-01", i // 60))]
    return _report("presence", [
        *minutes,
        (ds.PEAK_CONCURRENT, ds.RANGE, DAY, "", "", "", 47), (ds.PEAK_CONCURRENT, ds.RANGE, DAY, "ANZ", "domain-01", "", 23),
        (ds.UNIQUE_USERS, ds.DAY_GRAIN, DAY, "", "", "", 1234), (ds.UNIQUE_USERS, ds.RANGE, DAY, "", "", "", 1234),
        (ds.SESSION_LENGTH, ds.RANGE, DAY, "", "", "p50", 600), (ds.SESSION_LENGTH, ds.RANGE, DAY, "", "", "p90", 5400),
        (ds.SESSION_LENGTH, ds.RANGE, DAY, "", "", "p99", 7200),
        (ds.CONNECTS, ds.HOUR, DAY + timedelta(hours=10), "", "", "", 40),
        (ds.DISCONNECTS, ds.HOUR, DAY + timedelta(hours=10), "", "", "", 38),
        (ds.TOP_USERS, ds.RANGE, DAY, "ANZ", "", "ANZ-77", 36000),
    ])


@pytest.fixture
def backlog_report() -> Report:
    return _report("backlog", [
        (ds.BACKLOG, ds.SNAPSHOT, DAY, "", "pending", "< 1 min", 12), (ds.BACKLOG, ds.SNAPSHOT, DAY, "", "dead", "> 7 days", 3),
        (ds.OLDEST_PENDING, ds.SNAPSHOT, DAY, "", "", "", 90000),
        (ds.LATENCY, ds.RANGE, DAY, "", "", "p50", 35), (ds.LATENCY, ds.RANGE, DAY, "", "", "p90", 80),
        (ds.LATENCY, ds.RANGE, DAY, "", "", "p99", 450), (ds.DELIVERED, ds.RANGE, DAY, "", "", "", 99000),
        (ds.ATTEMPTS, ds.RANGE, DAY, "", "delivered", "1", 98000), (ds.ATTEMPTS, ds.RANGE, DAY, "", "delivered", "2", 1000),
        (ds.DEAD_LETTERS, ds.SNAPSHOT, DAY, "", "", "not confirmed within the ack timeout", 3),
    ])


def test_the_front_page_is_the_operator_dashboard_with_live_figures_and_report_charts(operator, presence_report,
                                                                                      backlog_report):
    page = operator.get(reverse("admin:index")).content.decode()

    assert 'id="operator-dashboard"' in page and 'id="connections-per-node"' in page
    assert 'id="routing-queue"' in page and 'id="deliveries-by-state"' in page
    assert page.count('class="chart line-chart"') == 1 and page.count('class="chart bar-chart"') == 2
    assert reverse("admin:analytics_report_change", args=[presence_report.pk]) in page
    assert "Client apps" in page or "Configuration" in page  # the models list is still there


def test_the_presence_report_page_shows_its_range_charts_and_tables(operator, presence_report):
    page = operator.get(reverse("admin:analytics_report_change", args=[presence_report.pk])).content.decode()

    assert "2026-11-20 00:00 – 2026-11-21 00:00 UTC" in page
    assert "Peak 47 at 2026-11-20 23:30 UTC" in page
    assert page.count("<polyline") == 2  # all apps, ANZ domain-01
    assert "ANZ-77" in page and "10 h" in page
    assert "1,234" in page


def test_the_backlog_report_page_shows_backlog_latency_attempts_and_dead_letters(operator, backlog_report):
    page = operator.get(reverse("admin:analytics_report_change", args=[backlog_report.pk])).content.decode()

    assert "Backlog by age (all apps)" in page and "Delivery latency" in page
    assert "not confirmed within the ack timeout" in page
    assert "25 h" in page  # the oldest pending's age
    assert "99,000" in page and "450" in page


def test_a_report_downloads_as_csv(operator, backlog_report):
    response = operator.get(reverse("admin:analytics_report_csv", args=[backlog_report.pk]))

    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["metric", "grain", "period", "app", "subgroup", "bucket", "value"]
    assert ["delivery_latency_ms", "range", DAY.isoformat(), "", "", "p99", "450"] in rows
    assert len(rows) == 1 + backlog_report.rows.count()


def test_the_export_button_queues_the_job_and_its_page_shows_the_state(operator, handoff, lake,
                                                                       django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(reverse("admin:analytics_jobrun_request"), {"kind": "export"})

    run = JobRun.objects.get()
    assert response.url == reverse("admin:analytics_jobrun_change", args=[run.pk])
    # handed to the workers through the door of foundation.handoff (this test's InlineDispatcher records it)
    assert [(h.task, h.args, h.queue) for h in handoff.tasks()] == [("analytics.tasks.export_run", [run.pk],
                                                                     DEFAULT_QUEUE)]
    page = operator.get(response.url).content.decode()
    assert "is <strong class=\"state-queued\">queued</strong>" in page and 'http-equiv="refresh"' in page


def test_a_report_button_queues_yesterdays_report_with_its_range(operator, handoff,
                                                                  django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        operator.post(reverse("admin:analytics_jobrun_request"), {"kind": "backlog", "span": "yesterday"})

    run = JobRun.objects.get()
    assert (run.kind, run.state, run.requested_by) == ("backlog", "queued", "operator")
    assert run.until - run.since == timedelta(days=1) and run.until.hour == 0
    assert [(h.task, h.args) for h in handoff.tasks()] == [("analytics.tasks.report_run", [run.pk])]


@pytest.mark.django_db(transaction=True)
def test_a_queued_export_run_by_its_task_succeeds_and_running_it_again_does_nothing(operator, handoff, lake):
    operator.post(reverse("admin:analytics_jobrun_request"), {"kind": "export"})
    run = JobRun.objects.get()
    (queued,) = handoff.tasks()

    first = tasks.export_run(*queued.args)  # what the worker runs
    again = tasks.export_run(job_run_id=run.pk)

    run.refresh_from_db()
    assert run.state == "succeeded" and first["run"] == run.pk and again["files"] == 0
    page = operator.get(reverse("admin:analytics_jobrun_change", args=[run.pk])).content.decode()
    assert "succeeded" in page and 'http-equiv="refresh"' not in page
