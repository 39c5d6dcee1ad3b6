"""Analytics fixtures: one real SparkSession for the whole test session, a fresh lake per test,
and builders of activity with chosen times."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import pytest

from analytics.services.lake import Lake
from messaging.models import Delivery, Message
from presence.events import presence_event_record
from presence.models import Node, PresenceEventKind, Session

# The tests' JVMs live for seconds: the quick JIT alone and one GC thread spend about half the CPU
# that Java's defaults (tuned for long-running servers) do on the same jobs.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "1g",
    "spark.default.parallelism": "2",
    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
}


@pytest.fixture(scope="session")
def spark():
    from analytics.spark import spark_session

    logging.getLogger("py4j").setLevel(logging.WARNING)  # it logs at interpreter exit, after pytest closed the streams
    session = spark_session(master="local[2]", conf=SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def lake(settings, tmp_path) -> Lake:
    settings.ANALYTICS_LAKE = str(tmp_path / "lake")
    settings.ANALYTICS_EXPORT_HORIZON_WAIT = 2
    return Lake(settings.ANALYTICS_LAKE)


class Activity:
    """Sessions and messages written straight into the tables with the times a test chooses,
    through the same event recording the platform uses."""

    def __init__(self) -> None:
        self._seq: dict[tuple[int, str], itertools.count] = defaultdict(lambda: itertools.count(1))

    def node(self, node_id: str, domain: str) -> Node:
        return Node.objects.get_or_create(node_id=node_id, defaults={
            "domain": domain, "started_at": datetime(2026, 1, 1, tzinfo=UTC), "heartbeat_at": datetime.now(UTC)})[0]

    def session(self, app, user_id: str, node: Node, start: datetime, end: datetime | None = None,
                reason: str = "client closed") -> uuid.UUID:
        session = Session.objects.create(app=app, user_id=user_id, node=node, channel_name=f"c-{uuid.uuid4()}",
                                         connected_at=start, last_seen_at=end or start)
        presence_event_record(kind=PresenceEventKind.CONNECT, connection_ids=[session.pk])
        if end is not None:
            self.close(session.pk, end, reason)
        return session.pk

    def close(self, connection_id: uuid.UUID, end: datetime, reason: str = "client closed") -> None:
        Session.objects.filter(pk=connection_id).update(disconnected_at=end, last_seen_at=end)
        presence_event_record(kind=PresenceEventKind.DISCONNECT, connection_ids=[connection_id], close_reason=reason)

    def delivery(self, app, created_at: datetime, *, state: str = "pending", to: str = "ANZ-2",
                 kind: str = "direct", attempts: int = 0, delivered_at: datetime | None = None,
                 last_error: str = "", sender: str = "ANZ-1") -> Delivery:
        message = Message.objects.create(app=app, sender=sender, kind=kind, content="secret words",
                                         created_at=created_at)
        stamps = {"sent_at": created_at if attempts else None, "delivered_at": delivered_at,
                  "dead_at": created_at if state == "dead" else None,
                  "expired_at": created_at if state == "expired" else None}
        return Delivery.objects.create(message=message, app=app, recipient=to, seq=next(self._seq[(app.pk, to)]),
                                       state=state, attempts=attempts, last_error=last_error,
                                       created_at=created_at, **stamps)


def tenant(name: str):
    """The app called `name` (users `<name>-<n>`), made on first use."""
    from apps_registry.models import ClientApp
    from tests.factories import make_app

    return ClientApp.objects.filter(app_name=name).first() or make_app(name, f"app-{name.lower()}")


@pytest.fixture
def activity() -> Activity:
    return Activity()


def tables_wipe() -> None:
    """What a module-scoped scenario committed (presence events and reports have no cascade)."""
    from analytics.models import ExportWatermark, JobRun, Report
    from apps_registry.models import ClientApp, Domain
    from apps_registry.selectors import app_snapshots_clear
    from presence.models import PresenceEvent

    for model in (Report, JobRun, ExportWatermark, PresenceEvent, ClientApp, Node, Domain):
        model.objects.all().delete()
    app_snapshots_clear()


@pytest.fixture(scope="module")
def module_scenario(django_db_setup, django_db_blocker, tmp_path_factory):
    """Runs `build(activity)` once per module with committed rows and its own lake, so several
    tests can read one exported and reported scenario; wipes it all at the end."""
    from django.test import override_settings

    lake_dir = tmp_path_factory.mktemp("lake")

    def run(build):
        with django_db_blocker.unblock(), override_settings(ANALYTICS_LAKE=str(lake_dir),
                                                             ANALYTICS_EXPORT_HORIZON_WAIT=2):
            return build(Activity(), Lake(str(lake_dir)))

    yield run
    with django_db_blocker.unblock():
        tables_wipe()




def messages_bulk(app, count: int, created_at: datetime) -> None:
    """`count` messages in one statement (for exports big enough to be interrupted)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO messaging_message (app_id, sender, kind, content, reference, confirmation_requested, "
            "origin_domain, created_at) SELECT %s, 'ANZ-1', 'direct', 'x', '', false, '', %s "
            "FROM generate_series(1, %s)", [app.pk, created_at, count])


def exported(lake: Lake, dataset, column: str = "id") -> list:
    """Every value of `column` in the published files of `dataset`, duplicates included."""
    return sorted(lake.read(dataset.name, dataset.columns, only=[column])[column].to_pylist())
