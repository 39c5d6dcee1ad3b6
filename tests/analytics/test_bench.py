"""The analytics benchmark's generator and report, at a small scale (spark-submit left out)."""

from __future__ import annotations

import pytest

from analytics import bench
from analytics.jobs import datasets as ds
from analytics.models import Report, ReportRow
from messaging.models import Delivery, Message
from presence.models import PresenceEvent, Session

pytestmark = pytest.mark.django_db(transaction=True)


def _report_stub(*, kind, since, until, requested_by):
    """The jobs themselves are tested elsewhere; the benchmark only times them."""
    report = Report.objects.create(kind=kind, since=since, until=until)
    ReportRow.objects.create(report=report, metric=ds.PEAK_CONCURRENT, grain=ds.RANGE, period=since, value=7)
    return report


def test_the_benchmark_generates_a_day_exports_it_and_writes_its_section_last(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "_spark_submit", lambda job, master, lake, since, until: (12.5, 10.0))
    monkeypatch.setattr(bench, "report_run", _report_stub)

    result = bench.bench_run(messages=2000, sessions=200, lake_dir=tmp_path / "lake", say=lambda line: None)

    assert Message.objects.count() == Delivery.objects.count() == 2020
    assert Session.objects.count() == 202
    assert PresenceEvent.objects.filter(kind="connect").count() == 202
    assert result.export["rows"]["messages"] == 2000 and result.incremental["rows"]["messages"] == 20
    assert result.export["rows"]["sessions"] + result.export["rows"]["sessions_live"] == 200
    assert set(result.in_process) == {"presence", "backlog"} and len(result.submit) == 4

    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nearlier results\n\n## Analytics on Spark\n\nan older run\n")
    bench.docs_write(bench.markdown(result, "python manage.py analytics_bench"), docs)
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nearlier results\n\n## Analytics on Spark\n")
    assert "an older run" not in text and text.count("## Analytics on Spark") == 1
    assert "| full export |" in text and "`local-cluster[2,1,1024]`" in text
    assert "peak concurrent connections 7" in text
