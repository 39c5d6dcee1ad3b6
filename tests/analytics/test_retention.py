"""Rows past their app's retention are deleted once the export has them, and only then."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from analytics.models import RetentionDay
from analytics.services import lake_export
from analytics.services.retention import rows_past_retention_delete
from messaging.models import Delivery, Message, StandbyCopy
from presence.models import PresenceEvent, Session
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=3)


@pytest.fixture
def anz():
    return make_app(retention_days=1)


def _old_session(activity, app, user: str, *, open_: bool = False):
    node = activity.node("web-1", "domain-01")
    connection_id = activity.session(app, user, node, OLD, None if open_ else OLD + timedelta(minutes=5))
    PresenceEvent.objects.filter(connection_id=connection_id).update(at=OLD)
    return connection_id


def test_exported_final_rows_past_retention_go_and_everything_else_stays(lake, anz, activity):
    gone = activity.delivery(anz, OLD, state="delivered", delivered_at=OLD + timedelta(seconds=1))
    expired = activity.delivery(anz, OLD, state="expired")
    waiting = activity.delivery(anz, OLD)  # pending: never deleted
    dead = activity.delivery(anz, OLD, state="dead", attempts=3)  # an operator's dead letter
    recent = activity.delivery(anz, NOW, state="delivered", delivered_at=NOW)  # within retention
    closed = _old_session(activity, anz, "ANZ-7")
    still_open = _old_session(activity, anz, "ANZ-8", open_=True)
    lake_export()
    late = activity.delivery(anz, OLD, state="delivered", delivered_at=OLD)  # not exported yet

    swept = rows_past_retention_delete()

    assert swept.done
    kept = set(Delivery.objects.values_list("pk", flat=True))
    assert kept == {waiting.pk, dead.pk, recent.pk, late.pk}
    assert not Message.objects.filter(pk__in=[gone.message_id, expired.message_id]).exists()
    assert Message.objects.filter(pk=waiting.message_id).exists()
    assert set(Session.objects.values_list("pk", flat=True)) == {still_open}
    assert set(PresenceEvent.objects.values_list("connection_id", flat=True)) == {still_open}
    assert swept.removed == {"deliveries": 2, "messages": 2, "sessions": 1, "presence_events": 2, "standby_copies": 0}
    assert dict(RetentionDay.objects.values_list("source", "removed")) == {t: n for t, n in swept.removed.items() if n}
    assert closed not in set(Session.objects.values_list("pk", flat=True))

    lake_export()  # now the late one is in the lake too
    assert rows_past_retention_delete().removed["deliveries"] == 1
    assert set(Delivery.objects.values_list("pk", flat=True)) == {waiting.pk, dead.pk, recent.pk}


def test_before_any_export_nothing_goes(lake, anz, activity):
    activity.delivery(anz, OLD, state="delivered", delivered_at=OLD)
    assert not any(rows_past_retention_delete().removed.values())
    assert Delivery.objects.count() == 1


def test_small_batches_and_a_spent_budget_come_to_the_same_end_over_several_runs(lake, anz, activity):
    for _ in range(7):
        activity.delivery(anz, OLD, state="delivered", delivered_at=OLD)
    lake_export()
    stopped = rows_past_retention_delete(batch=2, budget_seconds=0)
    assert not stopped.done and Delivery.objects.count() == 7
    runs = 0
    while not (swept := rows_past_retention_delete(batch=2)).done or swept.removed.get("deliveries"):
        runs += 1
        assert runs < 10
    assert Delivery.objects.count() == 0 and Message.objects.count() == 0
    assert RetentionDay.objects.get(source="deliveries").removed == 7


def test_the_dashboard_shows_the_oldest_row_kept_and_what_went_per_day(lake, anz, activity, admin_client):
    activity.delivery(anz, OLD, state="delivered", delivered_at=OLD)
    activity.delivery(anz, OLD)
    lake_export()
    rows_past_retention_delete()
    page = admin_client.get("/admin/").content.decode()
    section = page[page.index('id="retention"'):page.index('id="latest-reports"')]
    assert f"<td>messages</td><td>{OLD:%Y-%m-%d}" in section.replace("\n", "")  # the pending one's message
    assert f"<td>{NOW:%Y-%m-%d}</td><td class=\"num\">1</td><td class=\"num\">1</td>" in section.replace("\n", "")


def test_a_shortened_retention_day_counts_retention_days_in_its_seconds(lake, anz, activity, settings):
    settings.RETENTION_DAY_SECONDS = 60  # anz keeps 1 "day": a minute
    now = datetime.now(UTC)  # not the module's NOW: an earlier test may have taken a minute
    minutes_ago = activity.delivery(anz, now - timedelta(minutes=2), state="delivered",
                                    delivered_at=now - timedelta(minutes=2))
    seconds_ago = activity.delivery(anz, now - timedelta(seconds=10), state="delivered",
                                    delivered_at=now - timedelta(seconds=10))
    lake_export()

    assert rows_past_retention_delete().removed["deliveries"] == 1
    assert set(Delivery.objects.values_list("pk", flat=True)) == {seconds_ago.pk}
    assert not Message.objects.filter(pk=minutes_ago.message_id).exists()


def _standby_copy(app, created_at: datetime, *, state: str = "delivered", message_id: int = 1) -> StandbyCopy:
    """domain-04's copy of a delivery at domain-03, the user's home, stored there at `created_at`."""
    return StandbyCopy.objects.create(
        home="domain-03", home_delivery_id=message_id, app=app, recipient=f"{app.app_name}-3000007", seq=message_id,
        sender=f"{app.app_name}-1", kind="direct", content="secret words", origin_domain="domain-03",
        origin_message_id=message_id, state=state, created_at=created_at, copied_at=created_at,
        delivered_at=created_at if state == "delivered" else None,
        expired_at=created_at if state == "expired" else None, dead_at=created_at if state == "dead" else None)


def test_a_standbys_copies_past_the_apps_retention_go_as_the_homes_own_messages_do(anz, admin_client):
    """A standby's copy of a home's mailbox shrinks as the home's own does: past the app's retention a
    delivered or expired copy goes (nothing exports copies, so nothing waits for an export); a copy
    within retention, a copy still waiting or a dead letter, and another app's older copy stay."""
    zed = make_app(app_name="ZED", app_id="app-id-zed", retention_days=30)
    delivered = _standby_copy(anz, OLD, message_id=1)
    expired = _standby_copy(anz, OLD, state="expired", message_id=2)
    waiting = _standby_copy(anz, OLD, state="pending", message_id=3)  # the home would expire it first
    dead = _standby_copy(anz, OLD, state="dead", message_id=4)  # an operator's dead letter, at home too
    recent = _standby_copy(anz, NOW, message_id=5)
    zeds = _standby_copy(zed, OLD, message_id=6)  # ZED keeps 30 days

    swept = rows_past_retention_delete()

    assert set(StandbyCopy.objects.values_list("pk", flat=True)) == {waiting.pk, dead.pk, recent.pk, zeds.pk}
    assert not StandbyCopy.objects.filter(pk__in=[delivered.pk, expired.pk]).exists()
    assert swept.removed["standby_copies"] == 2
    assert RetentionDay.objects.get(source="standby_copies").removed == 2
    page = admin_client.get("/admin/").content.decode().replace("\n", "")
    assert f"<td>standby_copies</td><td>{OLD:%Y-%m-%d}" in page  # the oldest kept: the waiting one


def test_a_message_that_kept_its_id_from_another_domain_goes_once_exported_and_past_retention(lake, anz, activity):
    # Its id (in domain-02's block) is above every id this domain draws, so above the export's watermark.
    carried = (2 << 40) + 7
    message = Message.objects.create(id=carried, app=anz, sender="ANZ-1", content="x", created_at=OLD,
                                     origin_domain="domain-02", origin_message_id=carried)
    Delivery.objects.create(message=message, app=anz, recipient="ANZ-9", seq=1, created_at=OLD, state="delivered",
                            delivered_at=OLD)
    kept = activity.delivery(anz, OLD, state="delivered", delivered_at=OLD)  # its message drawn here
    lake_export()
    assert rows_past_retention_delete().removed["messages"] == 2
    assert not Message.objects.filter(pk__in=[carried, kept.message_id]).exists()
