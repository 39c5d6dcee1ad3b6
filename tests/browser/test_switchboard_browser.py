"""switchboard.js in a real browser against real web nodes: served by the platform, and riding out
a web node that is killed and started again on the same port."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from tests.wsclient import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.system]

READER = "NEWS-1001"
CHANNEL = "news.sport"
CLIENT_SOURCE = Path(__file__).resolve().parents[2] / "clients" / "js" / "switchboard.js"  # the npm package's


@pytest.fixture(scope="module")
def news_app(demo_network, django_db_blocker):
    """An app whose users may read the public channels news.* themselves (the demo app ANZ may
    not), committed for the web nodes; demo_network removes it with every app at the end."""
    from apps_registry.models import ClientApp, Domain, UserDistribution
    from apps_registry.selectors import app_snapshots_clear

    with django_db_blocker.unblock():
        app = ClientApp.objects.create(app_name="NEWS", app_id="app-id-news", master_user_id="NEWS-1", auth_mode="none",
                                       client_subscriptions_allowed=True, public_channel_patterns=["news.*"])
        UserDistribution.objects.create(app=app, domain=Domain.objects.get(name="domain-01"), range_from=0,
                                        range_to=999999)
        app_snapshots_clear()
    return app


def test_a_web_node_serves_the_client_module(processes):
    web = processes.web("web")
    with urllib.request.urlopen(f"{web.url}/static/switchboard/switchboard.js", timeout=10) as resp:
        body = resp.read().decode()
        assert resp.status == 200
        assert "javascript" in resp.headers["Content-Type"]
    assert "export class Switchboard" in body
    assert body == CLIENT_SOURCE.read_text()  # the package's one source, not a copy


def _committed(django_db_blocker, fn, **kwargs):
    """Run `fn` on the real database (committed, so the web nodes see it). The connection is closed
    at once: opened under Playwright's event loop, it would otherwise outlive the test and keep the
    test database from being dropped."""
    from django.db import connection

    with django_db_blocker.unblock():
        try:
            return fn(**kwargs)
        finally:
            connection.close()


def _texts(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def test_the_page_reconnects_after_a_node_restart_and_gets_what_it_missed_exactly_once(
        browser, processes, news_app, django_db_blocker, tmp_path):
    from messaging.channels.services import channel_publish_and_fanout
    from messaging.core.store import message_send
    from messaging.models import Message

    def send_to_reader(content: str) -> None:
        _committed(django_db_blocker, message_send, app_id=news_app.pk, sender="NEWS-2", recipients=[READER],
                   content=content)

    def publish(content: str) -> None:
        _committed(django_db_blocker, channel_publish_and_fanout, app_id=news_app.pk, channel=CHANNEL,
                   content=content)

    # The first node holds the ACKs it gets instead of recording them, so the kill loses them: the
    # message acknowledged before the restart comes again, with the same id, and must not be shown twice.
    web = processes.web("web", DELIVERED_LINGER_SECONDS="60")
    processes.worker("worker")
    page = browser.new_page()
    page.goto(f"{web.url}/demo/?user={READER}")
    page.fill("#appId", news_app.app_id)
    page.check("#acks")
    page.click("#connect")
    page.wait_for_selector(f"#status:has-text('authenticated as {READER}')")
    page.fill("#channel", CHANNEL)
    page.click("#subscribe")
    page.wait_for_selector(f"#log .sys:has-text('reading {CHANNEL} from offset 0')")

    publish("sport-1")
    send_to_reader("before the restart")
    page.wait_for_selector("#channelMessages li:has-text('sport-1')")
    page.wait_for_selector("#messages li:has-text('before the restart')")
    page.wait_for_selector("#log .out:has-text('\"ACK\"')")

    web.kill()  # SIGKILL: no close frame, nothing given back; the page sees the link drop
    page.wait_for_selector("#status:has-text('reconnecting')")
    # Sent from the page while the node is down: it waits in the client's outbox.
    page.fill("#to", "NEWS-1002")
    page.fill("#content", "sent while the node was down")
    page.click("#send")
    for i in (1, 2, 3):
        send_to_reader(f"missed {i}")
    for i in (2, 3, 4):
        publish(f"sport-{i}")

    processes.web("web-restarted", port=web.port, NODE_ID=f"web-{web.port}")
    page.wait_for_selector(f"#status:has-text('authenticated as {READER}')", timeout=60_000)
    wanted = ["before the restart", "missed 1", "missed 2", "missed 3"]
    page.wait_for_function("n => document.querySelectorAll('#messages li.message').length >= n", arg=len(wanted),
                           timeout=30_000)
    page.wait_for_function("() => document.querySelectorAll('#channelMessages li').length >= 4", timeout=30_000)
    page.wait_for_selector("#log .in:has-text('before the restart') >> nth=1")  # redelivered...
    time.sleep(2)  # (and anything else doubled would have arrived by now)

    messages = [text.split(": ", 1)[1].split(" (id ")[0] for text in _texts(page, "#messages li.message")]
    assert sorted(messages) == wanted  # ...but shown once, like every message, pushed or fetched
    assert _texts(page, "#channelMessages li") == [f"{CHANNEL} #{i}: sport-{i}" for i in (1, 2, 3, 4)]
    assert page.locator("#log .sys", has_text="closed with code 1006").count() >= 1  # the drop, and refused retries

    def stored() -> int:
        return Message.objects.filter(app=news_app, sender=READER, content="sent while the node was down").count()

    wait_for(lambda: _committed(django_db_blocker, stored) == 1, timeout=20)
    page.wait_for_selector("#log .sys:has-text('stored as message')")
    page.screenshot(path=str(tmp_path / "switchboard-after-restart.png"))


def test_a_user_who_reached_the_wrong_domain_is_redirected_home_and_authenticated_there(
        browser, processes, demo_network, django_db_blocker, tmp_path):
    """Two web nodes as two domains on one database: domain-01 and domain-09, where the demo network
    homes ANZ users 9000000 and up. ANZ-9000001 connects to domain-01 and ends on domain-09."""
    from apps_registry.models import Domain
    from presence.models import Session

    def set_urls(urls: list[str]) -> None:
        Domain.objects.filter(name="domain-09").update(urls=urls)

    home = processes.web("web-domain-09", DOMAIN_NAME="domain-09")
    wrong = processes.web("web-domain-01")
    _committed(django_db_blocker, set_urls, urls=[f"{home.url}/", home.ws_url])
    try:
        page = browser.new_page()
        page.goto(f"{wrong.url}/demo/?user=ANZ-9000001")
        page.click("#connect")
        page.wait_for_selector("#status:has-text('authenticated as ANZ-9000001')", timeout=30_000)
        page.wait_for_selector(f"#log .sys:has-text('redirected to {home.ws_url}')")
        nodes = _committed(django_db_blocker, lambda: list(
            Session.objects.filter(user_id="ANZ-9000001").values_list("node_id", flat=True)))
        assert nodes == [f"web-domain-09-{home.port}"]  # the session lives on domain-09's node only
        page.screenshot(path=str(tmp_path / "switchboard-redirected.png"))
    finally:
        _committed(django_db_blocker, set_urls, urls=[])
