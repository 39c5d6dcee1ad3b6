"""The console's link page and /metrics show each link's live state, as domain-01 of the ring sees it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging.federation.links import link_failed, link_received, link_succeeded
from messaging.federation.models import LinkHealth, ReceiptForward

pytestmark = pytest.mark.django_db


@pytest.fixture
def links_seen(net_ring, settings):
    """domain-01's view: 02 up (forwarded 5 out, 2 in), 04 down for a minute; then 04's link disabled
    and a second ring link, 01-03, never called."""
    settings.LINK_DOWN_AFTER_SECONDS = 15
    link_succeeded(peer="domain-02", forwarded=5)
    link_received(peer="domain-02", count=2)
    link_failed(peer="domain-04", error="domain-04: connection refused")
    LinkHealth.objects.filter(peer="domain-04").update(down_since=timezone.now() - timedelta(seconds=60))
    net_ring.link("domain-01", "domain-03")
    return net_ring


def rows(page: str) -> dict[str, str]:
    """peer -> the text of its row in the changelist."""
    import re

    found = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", page, flags=re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, flags=re.S)]
        peers = [c for c in cells if c.startswith("domain-")]
        if peers:
            found[peers[0]] = " | ".join(cells)
    return found


def test_the_link_page_lists_every_neighbour_with_its_live_state(operator, links_seen):
    with links_seen.at("domain-01"):
        page = operator.get("/admin/messaging/linkhealth/").content.decode()
    listed = rows(page)
    assert sorted(listed) == ["domain-02", "domain-03", "domain-04"]
    assert "| up |" in listed["domain-02"] and "| 5 | 2 |" in listed["domain-02"]
    assert "down since" in listed["domain-04"] and "(for 60 s), routed around" in listed["domain-04"]
    assert "domain-04: connection refused" in listed["domain-04"]
    assert "not called yet" in listed["domain-03"]
    links_seen.disable("domain-01", "domain-04")
    with links_seen.at("domain-01"):
        assert "| disabled |" in rows(operator.get("/admin/messaging/linkhealth/").content.decode())["domain-04"]


def test_probe_now_pings_the_selected_links_and_says_how_each_answered(operator, links_seen):
    with links_seen.at("domain-01"):
        ids = list(LinkHealth.objects.filter(peer="domain-04").values_list("pk", flat=True))
        answer = operator.post("/admin/messaging/linkhealth/", {"action": "probe_now", "_selected_action": ids},
                               follow=True)
    assert [str(m) for m in answer.context["messages"]] == ["domain-04: up"]
    assert LinkHealth.objects.get(peer="domain-04").up
    assert [c.peer for c in links_seen.calls] == ["domain-04"]  # domain-04's own ping endpoint answered


def test_metrics_show_each_link_up_or_down_and_what_went_each_way(client, links_seen):
    with links_seen.at("domain-01"):
        text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert 'switchboard_link_up{peer="domain-02"} 1.0' in text
    assert 'switchboard_link_up{peer="domain-04"} 0.0' in text
    assert 'switchboard_link_up{peer="domain-03"} 0.0' in text  # not called yet: not known to be up
    assert 'switchboard_link_forwarded_total{direction="out",peer="domain-02"} 5.0' in text
    assert 'switchboard_link_forwarded_total{direction="in",peer="domain-02"} 2.0' in text


def test_receipts_waiting_on_a_link_are_counted_on_its_row_and_listed_with_their_last_error(operator, links_seen):
    from django.utils import timezone as tz

    for n in range(2):
        ReceiptForward.objects.create(peer="domain-04", origin_domain="domain-03", origin_message_id=40 + n,
                                      recipient="ANZ-3", state="delivered", at=tz.now(), domain="domain-01",
                                      attempts=4, last_error="domain-04: connection refused")
    with links_seen.at("domain-01"):
        listed = rows(operator.get("/admin/messaging/linkhealth/").content.decode())
        assert listed["domain-04"].endswith("| 0 | 0 | 2 | - | -") and listed["domain-02"].endswith("| 0 | 0 | 0 | - | -")
        page = operator.get("/admin/messaging/receiptforward/").content.decode()
    assert page.count("domain-04: connection refused") == 2 and "domain-03" in page
