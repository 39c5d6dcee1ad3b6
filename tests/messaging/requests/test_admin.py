"""The console's requests: the list, and the summary per endpoint an operator reads at a glance."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import ClientApp
from messaging.requests.models import Request

pytestmark = pytest.mark.django_db


@pytest.fixture
def shop():
    return ClientApp.objects.create(app_name="SHOP", app_id="app-id-shop", master_user_id="SHOP-1")


def _request(app, endpoint: str, state: str, ms: int | None = None) -> None:
    made = timezone.now() - timedelta(seconds=5)
    Request.objects.create(app=app, user_id=f"{app.app_name}-1", endpoint=endpoint, content="x", state=state,
                           domain="domain-01", created_at=made, deadline=made + timedelta(seconds=30),
                           answered_at=None if ms is None else made + timedelta(milliseconds=ms))


def test_the_summary_counts_each_endpoints_requests_by_state_with_their_latency(operator, shop):
    for ms in (10, 20, 30):
        _request(shop, "orders.place", "resolved", ms)
    _request(shop, "orders.place", "timed_out", 30_000)
    _request(shop, "orders.quote", "waiting")
    page = operator.get("/admin/messaging/request/summary/?window=1h").content.decode()
    assert "<svg" in page and "resolved: 3" in page and "timed_out: 1" in page and "waiting: 1" in page
    row = page[page.index("<td>orders.place</td>"):].split("</tr>")[0]
    assert [cell.split("</td>")[0] for cell in row.split("<td>")[1:]][1:6] == ["0", "3", "0", "1", "0"]
    assert "<td>20.0</td>" in row  # p50 of the answered ones


def test_the_request_list_shows_a_requests_state_and_time_to_outcome(operator, shop):
    _request(shop, "orders.place", "resolved", 42)
    page = operator.get("/admin/messaging/request/").content.decode()
    assert "orders.place" in page and "resolved" in page and ">42<" in page
    assert operator.get("/admin/messaging/request/?state__exact=waiting").status_code == 200
