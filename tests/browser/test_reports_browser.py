"""The dashboard and the report pages render their charts for a staff user in Chromium."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from analytics.services import lake_export, report_run
from tests.analytics.conftest import Activity, spark  # noqa: F401  (the shared Spark session)
from tests.analytics.test_backlog_report import deliveries_with_known_answers
from tests.analytics.test_presence_report import DAY, a_day_of_sessions

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SERIES_RGB = (0x41, 0x76, 0x90)  # analytics.charts.COLORS[0]: the "all apps" series

# Chromium draws the chart's SVG onto a canvas; count the pixels in the first series' colour.
_PAINTED = """async (svg, rgb) => {
  const img = new Image();
  img.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(svg.outerHTML);
  await img.decode();
  const canvas = document.createElement('canvas');
  canvas.width = img.width; canvas.height = img.height;
  const ctx = canvas.getContext('2d');
  ctx.drawImage(img, 0, 0);
  const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) {
    if (Math.abs(px[i] - rgb[0]) < 8 && Math.abs(px[i + 1] - rgb[1]) < 8 && Math.abs(px[i + 2] - rgb[2]) < 8) n++;
  }
  return n;
}"""


def _painted(page, selector: str) -> list[int]:
    return [chart.evaluate(_PAINTED, list(SERIES_RGB)) for chart in page.locator(selector).element_handles()]


@pytest.fixture
def reports(settings, tmp_path, spark):  # noqa: F811
    settings.ANALYTICS_LAKE = str(tmp_path / "lake")
    activity = Activity()
    a_day_of_sessions(activity)
    deliveries_with_known_answers(activity)
    lake_export()
    return {kind: report_run(kind=kind, since=DAY, until=DAY + timedelta(days=1)) for kind in ("presence", "backlog")}


def test_an_operator_sees_the_dashboard_and_both_reports_charts_in_a_real_browser(live_server, browser, reports,
                                                                                  tmp_path):
    User.objects.create_superuser("operator", password="correct-horse-battery")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{live_server.url}/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct-horse-battery")
    page.click("input[type=submit]")

    page.wait_for_selector("#operator-dashboard")
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    assert page.locator("#latest-reports svg.chart").count() == 3
    assert all(n > 200 for n in _painted(page, "#latest-reports svg.chart"))
    assert page.locator("#connections-per-node").is_visible()

    page.locator("#latest-reports a.report-link").first.click()
    page.wait_for_selector(".sb-report-presence")
    page.screenshot(path=str(tmp_path / "presence-report.png"), full_page=True)
    assert page.locator(".sb-report svg.line-chart polyline.series").count() == 4  # all apps + 3 places
    assert page.locator(".sb-report svg.bar-chart rect.bar").count() > 0
    concurrency = _painted(page, ".sb-report svg.line-chart")
    assert concurrency[0] > 300
    assert f"Peak 101 at {DAY:%Y-%m-%d} 20:00 UTC" in page.inner_text("#content-main")

    page.goto(f"{live_server.url}/admin/analytics/report/{reports['backlog'].pk}/change/")
    page.wait_for_selector(".sb-report-backlog")
    page.screenshot(path=str(tmp_path / "backlog-report.png"), full_page=True)
    assert page.locator(".sb-report svg.bar-chart").count() == 3
    assert all(n > 50 for n in _painted(page, ".sb-report svg.bar-chart"))
    assert "timeout" in page.inner_text("#content-main")
    with page.expect_download() as download:
        page.click("#report-csv")
    assert download.value.suggested_filename == f"backlog-{DAY:%Y%m%dT%H%M}-{DAY + timedelta(days=1):%Y%m%dT%H%M}.csv"
