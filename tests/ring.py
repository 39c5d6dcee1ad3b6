"""The four-domain ring of `make network` for system tests: the module-scoped `ring` fixture.

    def test_something(ring):
        with ring.client(1, "ANZ-1") as alice, ring.client(3, "ANZ-3000001") as carol:
            ...
        ring.stop_domain(2); ...; ring.start_domain(2)

It runs devstack.ring's Ring against the test session's Postgres server (databases
test_ring_<worker>_domain_01..04, dropped at teardown) and Redis server (databases 11..14: the
suite's own is 15, `make run`'s 0 and `make network`'s 1..4), on free ports, with shrunk timers so
that retries, link probes, link-down decisions and meta pulls are observable within a test. One ring
serves a whole module: a test that stops a domain starts it again before it ends. Each process's
output goes to var/test-logs/ring-<worker>/ (02-web.log, 03-worker.log ...; ring.log for the ring's own).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest
from django.conf import settings

from devstack.ring import Ring
from tests.processes import FAST_FAILURE_ENV, LOG_DIR, ROOT, database_url_for_tests, free_port
from tests.wsclient import APP_ID, WsClient

RING_REDIS_DB_BASE = 10  # domain-0N on Redis database 10 + N
# Per pytest-xdist worker: each worker that runs ring tests has its own (its own Redis, too).
RING_DATABASE_PREFIX = f"test_ring_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_"
RING_ENV = {
    **FAST_FAILURE_ENV,
    "FORWARD_SWEEP_SECONDS": "1",
    "LINK_PROBE_SECONDS": "1",
    "LINK_DOWN_AFTER_SECONDS": "3",
    "META_PULL_SECONDS": "2",
    # No takeovers unless a test asks for them (tests/system/test_network_ring.py, FAST_FAILOVER):
    # the others stop a domain to see its neighbours wait for it.
    "FAILOVER_SECONDS": "300",
    # What tests/processes.py gives every process it starts: local settings (not the test ones,
    # which would move Redis to the suite's database), loopback allowed for outgoing calls (the
    # other domains are on 127.0.0.1) and plain http:// for webhooks, and a short drain so a stopped domain is stopped quickly.
    "DJANGO_SETTINGS_MODULE": "config.settings.local",
    "DEBUG": "false",
    "OUTGOING_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
    "WEBHOOKS_ALLOW_HTTP": "true",  # (a test's webhook receiver is a plain-HTTP server on 127.0.0.1)
    "DRAIN_SECONDS": "1",
    "DRAIN_GRACE_SECONDS": "3",
}
RESERVED_PORTS = range(8000, 8010)  # make run's and make network's


class RingRefused(AssertionError):
    """A ring client's AUTH_CLIENT was refused; `reason` is the close frame's text."""

    def __init__(self, user_id: str, domain: str, reason: str):
        super().__init__(f"{user_id} refused on {domain}: {reason}")
        self.reason = reason


class SystemRing(Ring):
    """A Ring with what tests want: authenticated clients, admin sessions, logs."""

    start_seconds = 0.0

    def client(self, n: int, user_id: str, *, app_id: str = APP_ID, token: str = "token-12345", **auth) -> WsClient:
        """A WebSocket client of domain n, authenticated as `user_id` (RingRefused if it is not)."""
        ws = WsClient(self.ws_url(n))
        reply = ws.auth(user_id, app_id=app_id, token=token, **auth)
        if not reply["data"].get("isAuthenticated"):
            try:
                ws.wait_closed(5)
            except TimeoutError:
                pass
            ws.close()
            raise RingRefused(user_id, self.plan(n).name, ws.ws.close_reason or "")
        return ws

    @contextmanager
    def admin(self, n: int) -> Iterator[httpx.Client]:
        """An HTTP client of domain n logged in to its admin: `with ring.admin(1) as admin: admin.get(...)`."""
        # 30 s: the login hashes a password (PBKDF2), which a two-core machine busy with a whole ring
        # and another worker's cluster took more than 10 s to answer in CI.
        with httpx.Client(base_url=self.http_url(n), timeout=30, follow_redirects=True) as http:
            yield self._logged_in(n, http)

    def _logged_in(self, n: int, http: httpx.Client) -> httpx.Client:
        page = http.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, f"no login form on {self.admin_url(n)}"
        answer = http.post("/admin/login/?next=/admin/", data={
            "csrfmiddlewaretoken": token.group(1), "username": self.admin_username,
            "password": self.admin_password}, headers={"Referer": f"{self.http_url(n)}/admin/login/"})
        assert answer.url.path == "/admin/", f"admin login on {self.plan(n).name} failed: {answer.status_code}"
        return http

    def ready(self, n: int) -> bool:
        try:
            return httpx.get(f"{self.http_url(n)}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, n: int, statement: str, params: tuple | list = ()) -> list[tuple]:
        """Rows of a SQL statement on domain n's database (what its admin would show, read directly)."""
        with psycopg.connect(self.database_url(n), autocommit=True, connect_timeout=10) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def publish(self, n: int, channel: str, content: str, app: str = "ANZ") -> None:
        """Publish on domain n as its operator would: `manage.py send --channel` with that domain's settings."""
        result = subprocess.run([sys.executable, "manage.py", "send", "--app", app, "--channel", channel, content],
                                cwd=ROOT, env={**self.env, **self.plan(n).env}, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, f"publish on {self.plan(n).name} failed: {result.stderr or result.stdout}"

    def manage(self, n: int, *args: str) -> str:
        """`manage.py <args>` with domain n's settings, as its operator runs it; what it printed."""
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**self.env, **self.plan(n).env},
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{args[0]} on {self.plan(n).name} failed: {result.stderr or result.stdout}"
        return result.stdout

    def api_key(self, n: int, app: str = "ANZ") -> str:
        """A new API key of `app` on domain n, as its operator makes one (`manage.py apikey create`)."""
        return self.manage(n, "apikey", "create", app, "--name", "ring-test").strip().splitlines()[-1]

    def log(self, n: int, role: str) -> str:
        """What domain n's web, worker or beat has written so far."""
        path = self.sink.path(f"{self.plan(n).tag}/{role}")
        return path.read_text(errors="replace") if path.exists() else ""


def _ring_ports() -> list[int]:
    ports: list[int] = []
    while len(ports) < 4:
        port = free_port()
        if port not in ports and port not in RESERVED_PORTS:
            ports.append(port)
    return ports


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    """The four domains, started once for the module that uses them (a test that stops a domain
    starts it again), stopped and dropped at its end: twelve idle processes left running until the
    session ended would take a third of a two-core machine from every test after them."""
    log_dir = LOG_DIR / f"ring-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    for old in log_dir.glob("*.log"):
        old.unlink()
    the_ring = SystemRing(tmp_path_factory.mktemp("ring"), database_url_for_tests(), settings.REDIS_URL,
                          env_overrides=RING_ENV, ports=_ring_ports(), database_prefix=RING_DATABASE_PREFIX,
                          redis_db_base=RING_REDIS_DB_BASE, log_dir=log_dir)
    the_ring.reset()  # what a killed earlier run left
    began = time.monotonic()
    try:
        the_ring.start()
        the_ring.start_seconds = time.monotonic() - began
        yield the_ring
    finally:
        the_ring.stop()
        the_ring.reset()
        the_ring.sink.close()
