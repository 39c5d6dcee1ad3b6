"""The incremental export: each row reaches the lake once, whatever stops the export midway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from analytics.jobs import datasets as ds
from analytics.models import ExportWatermark, JobRun
from analytics.services import lake_export
from analytics.services.export import ExportBusy
from analytics.services.lake import Lake
from messaging.models import Delivery, Message
from tests.analytics.conftest import exported, messages_bulk
from tests.factories import make_app
from tests.processes import ROOT, database_url_for_tests

pytestmark = pytest.mark.django_db(transaction=True)

DAY = datetime(2026, 11, 20, 12, tzinfo=UTC)


@pytest.fixture
def anz():
    return make_app()


def _visible_files(lake: Lake) -> list[str]:
    return [f"{d.name}/{f}" for d in ds.ALL for f in lake.files(d.name)]


def test_messages_are_exported_as_metadata_partitioned_by_the_day_they_were_accepted(lake, anz, activity):
    first = activity.delivery(anz, DAY - timedelta(days=1)).message
    second = activity.delivery(anz, DAY).message

    lake_export()

    assert lake.subdirs("messages") == ["day=2026-11-19", "day=2026-11-20"]
    table = lake.read("messages", ds.MESSAGES.columns)
    assert sorted(table["id"].to_pylist()) == [first.pk, second.pk]
    assert "content" not in table.column_names
    assert table["content_bytes"].to_pylist() == [len("secret words")] * 2


def test_a_second_export_adds_only_the_new_rows(lake, anz, activity):
    node = activity.node("web-1", "domain-01")
    before = [activity.delivery(anz, DAY).message_id for _ in range(3)]
    activity.session(anz, "ANZ-7", node, DAY, DAY + timedelta(minutes=5))
    first = lake_export()
    after = [activity.delivery(anz, DAY + timedelta(hours=1)).message_id for _ in range(2)]
    activity.session(anz, "ANZ-8", node, DAY, DAY + timedelta(minutes=9))

    second = lake_export()

    assert second.rows["messages"] == 2 and second.rows["presence_events"] == 2 and second.rows["sessions"] == 1
    assert exported(lake, ds.MESSAGES) == sorted(before + after)
    assert len(exported(lake, ds.PRESENCE_EVENTS)) == 4
    assert len(exported(lake, ds.SESSIONS, "connection_id")) == 2
    assert first.rows["messages"] == 3
    assert lake_export().rows["messages"] == 0


def test_a_delivery_waits_in_the_live_snapshot_until_it_is_final_then_is_exported_once(lake, anz, activity):
    pending = activity.delivery(anz, DAY)
    dead = activity.delivery(anz, DAY, state="dead", attempts=3, last_error="timeout")
    lake_export()
    assert exported(lake, ds.DELIVERIES) == []
    assert _latest_snapshot_ids(lake) == sorted([pending.pk, dead.pk])

    Delivery.objects.filter(pk=pending.pk).update(state="delivered", delivered_at=DAY + timedelta(seconds=3))
    lake_export()
    lake_export()

    assert exported(lake, ds.DELIVERIES) == [pending.pk]
    assert _latest_snapshot_ids(lake) == [dead.pk]  # dead letters can still be re-queued: not final


def _latest_snapshot_ids(lake: Lake) -> list[int]:
    newest = lake.subdirs(ds.DELIVERIES_LIVE.name)[-1]
    assert lake.exists(f"{ds.DELIVERIES_LIVE.name}/{newest}/{ds.SUCCESS}")
    return sorted(lake.read(f"{ds.DELIVERIES_LIVE.name}/{newest}", ds.DELIVERIES_LIVE.columns, only=["id"])["id"]
                  .to_pylist())


def test_a_session_is_in_the_live_snapshot_while_open_and_exported_once_when_closed(lake, anz, activity):
    node = activity.node("web-1", "domain-01")
    connection_id = activity.session(anz, "ANZ-7", node, DAY)
    lake_export()
    newest = lake.subdirs(ds.SESSIONS_LIVE.name)[-1]
    live = lake.read(f"{ds.SESSIONS_LIVE.name}/{newest}", ds.SESSIONS_LIVE.columns)
    assert live["connection_id"].to_pylist() == [str(connection_id)]

    activity.close(connection_id, DAY + timedelta(hours=2), "client closed (1000)")
    lake_export()

    closed = lake.read(ds.SESSIONS.name, ds.SESSIONS.columns).to_pylist()
    assert [(s["connection_id"], s["disconnected_at"], s["close_reason"]) for s in closed] == [
        (str(connection_id), DAY + timedelta(hours=2), "client closed (1000)")]
    assert lake.subdirs("sessions") == ["day=2026-11-20"]


def test_a_failure_before_the_commit_shows_no_file_and_the_rerun_exports_every_row_once(lake, anz, activity,
                                                                                         monkeypatch):
    ids = [activity.delivery(anz, DAY + timedelta(days=d)).message_id for d in range(3)]  # three day partitions
    real_write = Lake.write_table
    written = []

    def write_then_fail(self, table, rel):
        real_write(self, table, rel)
        written.append(rel)
        if len(written) == 2:
            assert _visible_files(self) == []  # staged files are nowhere a reader looks
            raise OSError("disk full")

    monkeypatch.setattr(Lake, "write_table", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        lake_export()
    monkeypatch.setattr(Lake, "write_table", real_write)

    assert _visible_files(lake) == [] and lake.files(ds.STAGING) == []
    assert JobRun.objects.get().state == "failed"
    assert set(ExportWatermark.objects.values_list("position", flat=True)) == {0}
    lake_export()
    assert exported(lake, ds.MESSAGES) == sorted(ids)


def test_an_export_that_committed_but_died_before_publishing_is_published_by_the_next(lake, anz, activity,
                                                                                      monkeypatch):
    ids = [activity.delivery(anz, DAY + timedelta(days=d)).message_id for d in range(3)]
    real_move = Lake.move
    moved = []

    def move_then_die(self, src, dst):
        if len(moved) == 1:
            raise SystemExit("killed")
        real_move(self, src, dst)
        moved.append(dst)

    monkeypatch.setattr(Lake, "move", move_then_die)
    with pytest.raises(SystemExit):
        lake_export()
    monkeypatch.setattr(Lake, "move", real_move)
    crashed = JobRun.objects.get()
    assert crashed.state == "running" and crashed.committed_at is not None
    later = activity.delivery(anz, DAY).message_id

    lake_export()

    assert exported(lake, ds.MESSAGES) == sorted([*ids, later])
    crashed.refresh_from_db()
    assert crashed.state == "succeeded"


def _export_once_the_killed_one_let_go():
    """The next export, as beat's next tick would run it: the killed process's database session holds
    the export lock until its backend notices the client is gone (at the end of the statement it was
    running, which on a busy machine takes a moment), and an export meanwhile is refused as busy."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return lake_export()
        except ExportBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_an_export_killed_midway_and_run_again_yields_exactly_one_copy_of_every_row(lake, anz):
    messages_bulk(anz, 60_000, DAY)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.local", "DATABASE_URL": database_url_for_tests(),
           "ANALYTICS_LAKE": lake.uri, "ANALYTICS_EXPORT_BATCH_ROWS": "500", "ANALYTICS_EXPORT_HORIZON_WAIT": "2",
           "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}
    export = subprocess.Popen([sys.executable, "manage.py", "analytics_export", "-v", "0"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not lake.files(ds.STAGING) and export.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.killpg(export.pid, signal.SIGKILL)  # after the first file, mid-way through the messages
    finally:
        output = export.communicate(timeout=30)[0].decode(errors="replace")
    assert export.returncode == -signal.SIGKILL, output
    assert lake.files(ds.STAGING) and _visible_files(lake) == []
    assert ExportWatermark.objects.filter(position__gt=0).count() == 0

    result = _export_once_the_killed_one_let_go()

    ids = exported(lake, ds.MESSAGES)
    assert len(ids) == len(set(ids)) == 60_000 == result.rows["messages"]
    assert sorted(ids) == sorted(Message.objects.values_list("id", flat=True))
    assert lake.files(ds.STAGING) == []
    assert JobRun.objects.get(pk__lt=result.run_id).state == "failed"


def test_a_writing_transaction_in_another_database_of_the_server_does_not_hold_the_export_back(lake, anz, activity,
                                                                                              settings):
    """Another domain's database (make network puts four on one server), or another test worker's."""
    import psycopg

    from analytics.bench_sandbox import url_with_database

    settings.ANALYTICS_EXPORT_HORIZON_WAIT = 1
    with psycopg.connect(url_with_database(database_url_for_tests(), "postgres")) as elsewhere:
        elsewhere.execute("CREATE TEMPORARY TABLE busy (n int); INSERT INTO busy VALUES (1)")  # a write: an xid
        sent = activity.delivery(anz, DAY).message_id
        result = lake_export()
        elsewhere.rollback()
    assert result.rows["messages"] == 1 and exported(lake, ds.MESSAGES) == [sent]


def test_a_row_committed_after_a_newer_one_is_exported_by_a_later_run_not_skipped(lake, anz, activity, settings):
    settings.ANALYTICS_EXPORT_HORIZON_WAIT = 1
    inserted, release = threading.Event(), threading.Event()
    slow: list[int] = []

    def slow_writer():
        try:
            with transaction.atomic():
                slow.append(activity.delivery(anz, DAY).message_id)
                inserted.set()
                release.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inserted.wait(30)
    quick = activity.delivery(anz, DAY).message_id  # a higher id, committed first

    held = lake_export()
    release.set()
    writer.join()
    caught_up = lake_export()

    assert held.rows["messages"] == 0  # the open transaction kept the watermark where it was
    assert caught_up.rows["messages"] == 2
    assert exported(lake, ds.MESSAGES) == sorted([slow[0], quick])



def _carried(app, origin_id: int, when: datetime, *, to: str = "ANZ-20", seq: int = 1) -> Delivery:
    """A message that came from another domain with its id there (messaging.core.store.carried_id_sql),
    in a recipient's mailbox here."""
    message = Message.objects.filter(pk=origin_id).first() or Message.objects.create(
        id=origin_id, app=app, sender="ANZ-1", content="secret words", created_at=when,
        origin_domain="domain-02", origin_message_id=origin_id)
    return Delivery.objects.create(message=message, app=app, recipient=to, seq=seq, created_at=when)


def test_a_message_that_kept_its_id_from_another_domain_is_exported_once_with_its_first_delivery(lake, anz,
                                                                                             activity):
    # Its id lies in domain-02's block, far above and apart from the ids this domain draws.
    carried = _carried(anz, (2 << 40) + 7, DAY).message_id
    local = activity.delivery(anz, DAY).message_id
    assert lake_export().rows["messages"] == 2
    assert exported(lake, ds.MESSAGES) == sorted([local, carried])
    # A later recipient of it here, and a message drawn here after it: only the new message goes.
    _carried(anz, carried, DAY, to="ANZ-30")
    later = activity.delivery(anz, DAY).message_id
    assert lake_export().rows["messages"] == 1
    assert exported(lake, ds.MESSAGES) == sorted([local, carried, later])
