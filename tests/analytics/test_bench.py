"""The analytics benchmark: its generator and report at a small scale, and that it never touches
the platform's data (it runs on a database and a lake of its own, and drops both after)."""

from __future__ import annotations

import io
import secrets
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from psycopg import sql

from analytics import bench
from analytics.bench_sandbox import (
    DATABASE_PREFIX,
    LAKE_MARKER,
    MARKER_TABLE,
    bench_database_mark,
    url_with_database,
)
from analytics.jobs import datasets as ds
from analytics.models import ExportWatermark, JobRun, Report, ReportRow
from messaging.models import Delivery, Message
from presence.models import PresenceEvent, Session
from tests.analytics.conftest import tenant

pytestmark = pytest.mark.django_db(transaction=True)
SMALL = {"messages": 2000, "sessions": 200}


def _report_stub(*, kind, since, until, requested_by):
    """The jobs themselves are tested elsewhere; the benchmark only times them."""
    report = Report.objects.create(kind=kind, since=since, until=until)
    ReportRow.objects.create(report=report, metric=ds.PEAK_CONCURRENT, grain=ds.RANGE, period=since, value=7)
    return report


def _server(database: str | None = None) -> str:
    """The URL of the test database's server, on `database` (default: the test database)."""
    return url_with_database(settings.DATABASE_URL, database or settings.DATABASES["default"]["NAME"])


def _databases() -> set[str]:
    """The benchmarks' databases on the server (other test workers make and drop databases of their own)."""
    with psycopg.connect(_server()) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database") if name.startswith(DATABASE_PREFIX)}


@pytest.fixture
def live(settings, tmp_path, activity, benchmarks_alone):
    """The platform's data: a message, its delivery, and an export that got somewhere."""
    settings.ANALYTICS_LAKE = str(tmp_path / "live-lake")
    (tmp_path / "live-lake" / "deliveries_live" / "run=00000047").mkdir(parents=True)
    (tmp_path / "live-lake" / "deliveries_live" / "run=00000047" / "part-0.parquet").write_bytes(b"the live snapshot")
    activity.delivery(tenant("ANZ"), created_at=datetime(2026, 1, 5, tzinfo=UTC), state="delivered")
    ExportWatermark.objects.create(table="deliveries", position=4711, snapshot_run=47)
    ExportWatermark.objects.create(table="messages", position=4712)
    return Path(settings.ANALYTICS_LAKE)


def _temporary_lakes() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("switchboard-bench-lake-*"))


def _state(lake: Path) -> dict:
    return {
        "rows": [m.objects.count() for m in (Message, Delivery, Session, PresenceEvent, JobRun, Report)],
        "watermarks": list(ExportWatermark.objects.order_by("table").values_list("table", "position", "snapshot_run",
                                                                                 "updated_at")),
        "lake": sorted((str(p.relative_to(lake)), p.read_bytes() if p.is_file() else b"") for p in lake.rglob("*")),
    }


def test_the_benchmark_runs_on_a_database_and_lake_of_its_own_and_leaves_the_platforms_untouched(live):
    before, databases, lakes = _state(live), _databases(), _temporary_lakes()
    out = io.StringIO()

    call_command("analytics_bench", **SMALL, no_jobs=True, stdout=out, stderr=io.StringIO())

    assert "| full export |" in out.getvalue() and "messages 2,000" in out.getvalue()
    assert "python manage.py analytics_bench --messages 2000 --sessions 200 --no-jobs" in out.getvalue()
    assert _state(live) == before
    assert _databases() == databases  # its database is gone
    assert _temporary_lakes() == lakes  # and so is its lake


def test_an_interrupted_benchmark_still_drops_its_database_and_lake(live, tmp_path, monkeypatch):
    real_child, calls = bench._child, []

    def interrupted_after_migrate(argv, env):
        calls.append(env)
        if len(calls) > 1:
            raise KeyboardInterrupt  # Ctrl-C while the benchmark runs
        return real_child(argv, env)

    monkeypatch.setattr(bench, "_child", interrupted_after_migrate)
    name = f"{DATABASE_PREFIX}interrupted_{secrets.token_hex(3)}"

    with pytest.raises(KeyboardInterrupt):
        call_command("analytics_bench", **SMALL, database=name, lake=tmp_path / "bench-lake", stdout=io.StringIO(),
                     stderr=io.StringIO())

    assert calls[-1]["ANALYTICS_LAKE"] == str(tmp_path / "bench-lake")
    assert name not in _databases()
    assert not (tmp_path / "bench-lake").exists()


@pytest.fixture
def foreign_database():
    """Someone else's database on the same server, holding one row."""
    name = f"someone_elses_{secrets.token_hex(3)}"
    with psycopg.connect(_server(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(_server(name), autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (entry text)")
        conn.execute("INSERT INTO ledger VALUES ('keep me')")
    yield name
    with psycopg.connect(_server(), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_database_holding_anything_the_benchmark_did_not_create_is_refused_and_left_as_it_was(live,
                                                                                             foreign_database):
    before = _state(live)

    with pytest.raises(CommandError, match=f"database '{foreign_database}' holds 1 tables .* no benchmark created"):
        call_command("analytics_bench", **SMALL, database=foreign_database, stdout=io.StringIO(), stderr=io.StringIO())

    with psycopg.connect(_server(foreign_database)) as conn:
        assert conn.execute("SELECT entry FROM ledger").fetchall() == [("keep me",)]
        assert conn.execute("SELECT to_regclass(%s)", [MARKER_TABLE]).fetchone() == (None,)
    assert _state(live) == before


def test_the_platforms_own_database_is_refused(live):
    with pytest.raises(CommandError, match="the platform's own database"):
        call_command("analytics_bench", **SMALL, database=settings.DATABASES["default"]["NAME"], stdout=io.StringIO(),
                     stderr=io.StringIO())


def test_the_platforms_lake_and_a_folder_the_benchmark_did_not_make_are_refused(live, tmp_path):
    before, databases = _state(live), _databases()
    someone_elses = tmp_path / "photos"
    someone_elses.mkdir()
    (someone_elses / "cat.jpg").write_bytes(b"meow")

    with pytest.raises(CommandError, match="the platform's lake"):
        call_command("analytics_bench", **SMALL, lake=live, stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="not empty and was not made by a benchmark"):
        call_command("analytics_bench", **SMALL, lake=someone_elses, stdout=io.StringIO(), stderr=io.StringIO())

    assert [p.name for p in someone_elses.iterdir()] == ["cat.jpg"]
    assert _state(live) == before and _databases() == databases


def test_running_the_benchmark_here_on_the_platforms_database_is_refused_and_writes_nothing(live):
    with pytest.raises(CommandError, match="was not created by a benchmark"):
        call_command("analytics_bench", **SMALL, here=True, stdout=io.StringIO(), stderr=io.StringIO())

    assert Message.objects.count() == 1 and ExportWatermark.objects.get(table="deliveries").snapshot_run == 47


@pytest.fixture
def marked_test_database(tmp_path):
    """The test database, marked as a benchmark's own, so the generator can run in this process."""
    with connection.cursor() as cur:
        bench_database_mark(cur)
    lake = tmp_path / "lake"
    lake.mkdir()
    (lake / LAKE_MARKER).write_text("")
    yield lake
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE {MARKER_TABLE}")


def test_the_benchmark_generates_a_day_exports_it_and_writes_its_section_last(marked_test_database, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(bench, "_spark_submit", lambda job, master, lake, since, until: (12.5, 10.0))
    monkeypatch.setattr(bench, "report_run", _report_stub)

    result = bench.bench_run(**SMALL, lake_dir=marked_test_database, say=lambda line: None)

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
