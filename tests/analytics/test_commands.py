"""manage.py analytics_export and analytics_report."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from django.core.management import call_command

from analytics.jobs import datasets as ds
from analytics.models import Report
from analytics.services.lake import arrow_schema
from tests.analytics.conftest import tenant

pytestmark = pytest.mark.django_db(transaction=True)

DAY = datetime(2026, 11, 20, tzinfo=UTC)


def test_analytics_export_shows_progress_and_says_what_it_wrote(lake, activity):
    for _ in range(3):
        activity.delivery(tenant("ANZ"), DAY)
    out, err = io.StringIO(), io.StringIO()

    call_command("analytics_export", stdout=out, stderr=err)

    assert "messages 3" in out.getvalue() and "deliveries_live 3" in out.getvalue()
    assert "messages" in err.getvalue() and "rows" in err.getvalue()  # the progress bars


def test_analytics_export_reset_starts_the_lake_over(lake, activity):
    activity.delivery(tenant("ANZ"), DAY)
    call_command("analytics_export", stdout=io.StringIO(), stderr=io.StringIO())
    out = io.StringIO()

    call_command("analytics_export", "--reset", stdout=out, stderr=io.StringIO())

    assert "forgotten" in out.getvalue() and "messages 1" in out.getvalue()


def test_analytics_report_runs_a_job_in_process_over_the_given_range(lake, activity, spark):
    activity.delivery(tenant("ANZ"), DAY, state="delivered", attempts=1, delivered_at=DAY + timedelta(seconds=2))
    call_command("analytics_export", stdout=io.StringIO(), stderr=io.StringIO())
    out = io.StringIO()

    call_command("analytics_report", "backlog", "--since", "2026-11-20", "--until", "2026-11-21", stdout=out,
                 stderr=io.StringIO())

    report = Report.objects.get()
    assert (report.kind, report.since, report.until) == ("backlog", DAY, DAY + timedelta(days=1))
    assert report.rows.get(metric=ds.LATENCY, app="", bucket="p50").value == 2000
    assert f"report #{report.pk}" in out.getvalue()


def test_analytics_report_loads_what_a_spark_submit_run_wrote_and_a_rerun_replaces_it(lake):
    results = "_reports/presence/by-spark-submit"
    row = {"metric": ds.PEAK_CONCURRENT, "grain": ds.RANGE, "period": DAY, "app": "", "subgroup": "", "bucket": "",
           "value": 42.0}
    lake.write_table(pa.Table.from_pylist([row], schema=arrow_schema(ds.RESULT_COLUMNS)), f"{results}/part-0.parquet")
    args = ["analytics_report", "presence", "--since", "2026-11-20", "--until", "2026-11-21", "--load",
            lake.url(results)]

    call_command(*args, stdout=io.StringIO())
    call_command(*args, stdout=io.StringIO())

    report = Report.objects.get()
    assert [(r.metric, r.value) for r in report.rows.all()] == [(ds.PEAK_CONCURRENT, 42.0)]
