"""Channel history ends with the app's retention: oldest first, no holes, in bounded batches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging.channels.models import ChannelMessage
from messaging.channels.retention import channel_history_expire
from messaging.channels.services import channel_publish
from messaging.routing.tasks import expire_channel_history
from tests.factories import make_app

pytestmark = pytest.mark.django_db


def _publish(app, channel: str, count: int) -> list[int]:
    return [channel_publish(app_id=app.pk, channel=channel, content=f"{channel} #{i}") for i in range(count)]


def _age(app, channel: str, offsets: list[int], days: float) -> None:
    ChannelMessage.objects.filter(channel__app=app, channel__name=channel, offset__in=offsets).update(
        created_at=timezone.now() - timedelta(days=days))


def _offsets(app, channel: str) -> list[int]:
    return list(ChannelMessage.objects.filter(channel__app=app, channel__name=channel)
                .order_by("offset").values_list("offset", flat=True))


def test_history_past_each_apps_retention_goes_and_recent_history_stays():
    anz = make_app()  # retention 30 days
    bnz = make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1", retention_days=2)
    _publish(anz, "news", 5)
    _age(anz, "news", [1, 2, 3], days=31)
    _publish(anz, "sport", 2)
    _age(anz, "sport", [1, 2], days=3)  # three days old: within ANZ's 30 days
    _publish(bnz, "news", 3)
    _age(bnz, "news", [1, 2, 3], days=3)  # past BNZ's 2 days

    assert expire_channel_history() == 6  # what beat runs every hour

    assert _offsets(anz, "news") == [4, 5]
    assert _offsets(anz, "sport") == [1, 2]
    assert _offsets(bnz, "news") == []
    assert channel_publish(app_id=bnz.pk, channel="news", content="later") == 4  # offsets go on


def test_an_old_message_behind_a_recent_one_waits_so_history_never_has_holes():
    anz = make_app()
    _publish(anz, "news", 3)
    _age(anz, "news", [1, 3], days=40)  # 3 committed late with an early timestamp
    assert channel_history_expire() == 1
    assert _offsets(anz, "news") == [2, 3]


def test_a_large_expiry_deletes_in_bounded_batches_one_statement_each():
    anz = make_app()
    _publish(anz, "news", 7)
    _publish(anz, "sport", 3)
    _publish(anz, "weather", 2)
    _age(anz, "news", list(range(1, 8)), days=31)
    _age(anz, "sport", [1, 2, 3], days=31)

    with CaptureQueriesContext(connection) as queries:
        assert channel_history_expire(batch=3) == 10
    deletes = [q["sql"] for q in queries.captured_queries if "DELETE FROM messaging_channelmessage" in q["sql"]]
    assert len(deletes) == 4  # ten messages, at most three per statement
    assert _offsets(anz, "news") == [] and _offsets(anz, "sport") == [] and _offsets(anz, "weather") == [1, 2]
    assert channel_history_expire(batch=3) == 0  # nothing left to do: safe to run twice


def test_beat_runs_the_history_expiry_every_hour(settings):
    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values()
                 if e["task"] == "messaging.tasks.expire_channel_history")
    assert entry["schedule"] == 3600.0
