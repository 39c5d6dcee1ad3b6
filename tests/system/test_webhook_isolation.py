"""One tenant's hostile webhook receiver never stalls anyone else's messages (issue 16).

The processes `make run` starts: a web node, the routing worker (`-Q celery,routing,forwarding`), the webhook
worker (`-Q webhooks`) and beat. One app's four endpoints point at a receiver that answers its
headers one byte every 0.25 s, for ever: every read arrives in time, so only a deadline for the
whole call ends it. While those calls hang, RELIABLE messages between another app's users are all
delivered promptly, and each dripping call ends at WEBHOOK_TIMEOUT_SECONDS as a failed attempt.
"""

from __future__ import annotations

import time

import pytest

from apps_registry.models import ClientApp, Domain, UserDistribution
from apps_registry.selectors import app_snapshots_clear
from messaging.models import WebhookDelivery
from messaging.webhooks.services import webhook_endpoint_create
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.webhook_receiver import WebhookReceiver, event_for
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system

DEADLINE = 2
ENV = {
    "WEBHOOKS_ALLOW_HTTP": "true",
    "WEBHOOK_TIMEOUT_SECONDS": str(DEADLINE),
    "WEBHOOK_SWEEP_SECONDS": "1",
    "WEBHOOK_BUSY_RETRY_SECONDS": "0.5",
    "WEBHOOK_RETRY_BASE_SECONDS": "60",  # one failed attempt each is all this test looks at
    "WORKER_CONCURRENCY": "4",  # make run's default, for both workers
}
MESSAGES = 40


@pytest.fixture(scope="module")
def dripping():
    with WebhookReceiver(drip=0.25) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def drip_app(demo_network, django_db_blocker, dripping):
    """DRP: an app whose four endpoints all point at the dripping receiver (committed; the demo
    network's teardown removes it)."""
    with django_db_blocker.unblock():
        drp = ClientApp.objects.create(app_name="DRP", app_id="app-id-drp", master_user_id="DRP-1", auth_mode="none")
        UserDistribution.objects.create(app=drp, domain=Domain.objects.get(name="domain-01"), range_from=0)
        for _ in range(4):
            webhook_endpoint_create(app_id=drp.pk, url=dripping.url, events=["user.connected"])
        app_snapshots_clear()
    return drp


@pytest.fixture(scope="module")
def cluster(module_processes, drip_app, tmp_path_factory):
    env = {**FAST_FAILURE_ENV, **ENV}
    web = module_processes.web("web", **env)
    module_processes.worker("worker", concurrency=4, **env)
    module_processes.webhook_worker("hooks", concurrency=4, **env)
    start_beat(module_processes, tmp_path_factory.mktemp("beat"), **env)
    return web


@pytest.mark.django_db
def test_reliable_messages_are_delivered_promptly_while_another_apps_receivers_drip(cluster, drip_app, dripping):
    drp_users = [WsClient(cluster.ws_url) for _ in range(3)]
    try:
        for number, ws in enumerate(drp_users, start=2):  # 3 users x 4 endpoints: 12 dripping calls
            assert ws.auth(f"DRP-{number}", app_id="app-id-drp")["data"]["isAuthenticated"] is True
        dripping.wait_for(event_for("user.connected"), count=2, timeout=30)  # the drip has begun

        latencies = []
        with WsClient(cluster.ws_url) as alice, WsClient(cluster.ws_url) as bob:
            alice.auth("ANZ-7001")
            bob.auth("ANZ-7002")
            for i in range(MESSAGES):
                sent = time.monotonic()
                alice.message("ANZ-7002", f"reliable {i}")
                got = bob.recv_type("MESSAGE", timeout=15)
                latencies.append(time.monotonic() - sent)
                assert got["data"]["content"] == f"reliable {i}"
        failed_meanwhile = _failed(drip_app).count()
    finally:
        for ws in drp_users:
            ws.close()

    assert len(latencies) == MESSAGES and max(latencies) < 3.0, latencies
    assert failed_meanwhile < 12  # the messages went while DRP's calls were still hanging
    wait_for(lambda: _failed(drip_app).count() == 12, timeout=90, interval=0.1)
    for row in _failed(drip_app):
        assert (row.state, row.attempts, row.last_status) == ("retrying", 1, None)
        assert row.last_error == f"no answer within {DEADLINE} s"


def _failed(app: ClientApp):
    return WebhookDelivery.objects.filter(endpoint__app_id=app.pk, attempts__gte=1)
