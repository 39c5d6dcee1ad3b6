"""Health answers: /readyz names a failing part and nothing about how it failed, and is ready only when
the domain would admit the users it serves."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Domain, UserDistribution
from apps_registry.selectors import app_snapshot, app_snapshots_clear
from foundation.transport.sockets import run_async
from messaging.federation.models import DomainHeard
from messaging.federation.takeover import fence as fence_module
from messaging.federation.takeover.fence import fence, fence_forget
from messaging.gateway.authentication import client_authenticate


@pytest.mark.django_db
def test_healthz_answers_while_the_process_serves(client):
    assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_readyz_is_ready_when_postgres_and_redis_answer(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


@pytest.mark.django_db(transaction=True)
def test_a_web_nodes_readiness_checks_run_on_one_thread_that_keeps_its_connection():
    """A load balancer asks every second: on a web node (ASGI) the checks neither start a thread nor
    open a database connection per check (each opened a Postgres backend, which on a slowed machine
    took longer than HAProxy waits, and took busy nodes out of rotation)."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.core.handlers.asgi import ASGIHandler
    from django.db.backends.signals import connection_created

    opened: list[str] = []

    def count(sender, connection, **kwargs) -> None:
        opened.append(threading.current_thread().name)

    async def get(path: str) -> int:
        """One request through Django's ASGI handler, as daphne makes it: its status. (Not channels'
        HttpCommunicator: under it the old sync view's checks shared one thread, and this test
        passed on the code that opened a connection per check under daphne.)"""
        sent: list[dict] = []
        body = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict:
            if body:
                return body.pop()
            await asyncio.Event().wait()  # the client stays until the answer (Django cancels this)

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8000), "scheme": "http", "asgi": {"version": "3.0"}}
        await ASGIHandler()(scope, receive, send)
        return next(m["status"] for m in sent if m["type"] == "http.response.start")

    async def ask() -> list[int]:
        return [await get("/readyz") for _ in range(20)]

    connection_created.connect(count)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="daphne") as server:  # an event loop of its own, as daphne's
            answers = server.submit(asyncio.run, ask()).result()
    finally:
        connection_created.disconnect(count)
    assert answers == [200] * 20
    assert len(opened) <= 1 and all(name.startswith("readyz") for name in opened), opened


@pytest.mark.django_db
def test_readyz_names_redis_when_it_does_not_answer_but_not_its_address_or_error(client, settings, caplog):
    settings.REDIS_URL = "redis://secret-user:secret-pass@127.0.0.1:9/0"  # discard port: nothing listens
    with caplog.at_level(logging.WARNING, logger="config.health"):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "failing": ["redis"]}
    assert b"127.0.0.1" not in response.content and b"secret" not in response.content
    assert "redis does not answer" in caplog.text  # the details are for the operator's log


@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_database_when_it_does_not_answer_but_not_its_address(client, settings, caplog):
    from django.db import connection

    real = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = "9"
    try:
        with caplog.at_level(logging.WARNING, logger="config.health"):
            response = client.get("/readyz")
    finally:
        connection.close()
        connection.settings_dict.update(real)
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "failing": ["database"]}
    assert real["HOST"].encode() not in response.content and b"port" not in response.content.lower()
    assert "the database does not answer" in caplog.text


@pytest.mark.django_db
def test_readyz_says_draining_from_the_moment_the_node_drains_while_healthz_still_answers(client, monkeypatch):
    import threading

    from foundation import draining

    monkeypatch.setattr(draining, "_draining", threading.Event())
    assert client.get("/readyz").status_code == 200
    draining.drain_begin()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "draining" and response.json()["failing"] == ["draining"]
    assert client.get("/healthz").status_code == 200


def _login(user: str, app_id: str):
    """AUTH_CLIENT at the domain in use, with what its web node has cached fresh (so the login reads
    nothing: the test's transaction is not the event loop thread's)."""
    app_snapshots_clear()
    app_snapshot("ANZ")
    fence_forget()
    fence()
    return run_async(client_authenticate(app_id=app_id, user_id=user, token=""), timeout=30)


def test_readyz_is_not_ready_while_the_domain_refuses_its_users_logins_until_it_hears_the_network(
        net_ring, client, monkeypatch):
    """Just started, a domain whose users have a standby is cut off until the first gossip reaches it,
    and refuses their logins: its /readyz says so (it answered ready then, issue 46), and is ready
    from the moment it would admit them."""
    net = net_ring
    monkeypatch.setattr(fence_module, "process_started", time.monotonic(), raising=False)  # a web node just started
    UserDistribution.objects.filter(domain__name="domain-03").update(standby=Domain.objects.get(name="domain-04"))
    carol = "ANZ-3000007"
    with net.at("domain-03"):
        refused = _login(carol, net.app.app_id)
        assert not refused.ok and "cut off from the network" in refused.reason
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json() == {"status": "unavailable", "failing": ["network"]}
    with net.at("domain-01"):  # no user of domain-01 has a standby: nobody's login waits for the network
        assert client.get("/readyz").status_code == 200
    with net.at("domain-03"):
        DomainHeard.objects.create(domain="domain-02", version=1, heard_at=timezone.now())  # the first gossip
    with net.at("domain-03"):
        assert client.get("/readyz").json()["status"] == "ready"
        assert _login(carol, net.app.app_id).ok
    with net.at("domain-03"):  # silent past the fence: cut off again
        DomainHeard.objects.update(heard_at=timezone.now() - timedelta(hours=1))
    with net.at("domain-03"):
        assert client.get("/readyz").json()["failing"] == ["network"]


def test_a_node_cut_off_from_the_network_long_after_it_started_stays_ready_for_the_calls_that_end_it(
        net_ring, client, monkeypatch):
    """A partition of a running domain: its logins of users with a standby are refused (1013, retry),
    but /readyz stays ready, so a load balancer that sends only to ready nodes still lets in the
    neighbours' gossip that ends the cut-off (waiting for it would never end)."""
    net = net_ring
    UserDistribution.objects.filter(domain__name="domain-03").update(standby=Domain.objects.get(name="domain-04"))
    monkeypatch.setattr(fence_module, "process_started", time.monotonic() - 3600, raising=False)  # started an hour ago
    with net.at("domain-03"):
        DomainHeard.objects.create(domain="domain-02", version=1, heard_at=timezone.now() - timedelta(hours=1))
    with net.at("domain-03"):
        assert "cut off from the network" in _login("ANZ-3000007", net.app.app_id).reason
        assert client.get("/readyz").json()["status"] == "ready"
