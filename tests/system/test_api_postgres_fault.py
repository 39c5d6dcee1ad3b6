"""The REST API through a killed and restarted embedded Postgres: during the outage sends are
answered 503 (nothing stored), and once Postgres is back every request works again on every
thread of the node's database pool, and idempotent retries store each send exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from switchboard_client import ApiError, SwitchboardClient

from tests.processes import ROOT, ProcessFactory, free_port, wait_http
from tests.system.test_postgres_fault import _postmaster_pid, _ready

pytestmark = pytest.mark.system
SENDS = 60


@pytest.fixture
def own_processes(request):
    """Processes on services of their own (no demo network in the test database needed)."""
    factory = ProcessFactory(request)
    yield factory
    factory.stop_all()


def test_the_api_answers_503_while_postgres_is_down_and_fully_recovers(own_processes, tmp_path):
    var = tmp_path / "var"
    port = free_port()
    env = {"SWITCHBOARD_VAR_DIR": str(var), "DATABASE_URL": "", "REDIS_URL": ""}
    proc = own_processes.spawn("supervise", [sys.executable, "-m", "devstack.supervise"], port=port, PORT=str(port),
                               ADMIN_PASSWORD="a-long-test-password", **env)
    wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=180)
    created = subprocess.run([sys.executable, "manage.py", "apikey", "create", "ANZ"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env=own_processes.env(**env))
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    answers: dict[str, str] = {}  # idempotency key -> message id
    with SwitchboardClient(proc.url, key, retries=0, timeout=5) as api:
        for i in range(10):  # every pool thread opens its connection
            answers[f"s-{i}"] = api.send("ANZ-1", f"m-{i}", idempotency_key=f"s-{i}")["id"]
        os.kill(_postmaster_pid(var), signal.SIGKILL)
        refused = []
        for i in range(10, 40):  # reads (no transaction of their own) and sends, on every pool thread
            try:
                api.message(answers["s-0"])
                answers[f"s-{i}"] = api.send("ANZ-1", f"m-{i}", idempotency_key=f"s-{i}")["id"]
            except ApiError as exc:
                refused.append((exc.status, exc.code))
        assert refused and all(r == (503, "unavailable") for r in refused), refused  # the outage was felt
        deadline = time.monotonic() + 120
        while not _ready(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ready(port), proc.output()[-3000:]
        for _ in range(40):
            assert api.message(answers["s-0"])["content"] == "m-0"
        for i in range(10, SENDS):  # the refused ones again (same keys), then more; none may fail
            answers[f"s-{i}"] = api.send("ANZ-1", f"m-{i}", idempotency_key=f"s-{i}")["id"]
        assert api.send("ANZ-1", "m-0", idempotency_key="s-0")["id"] == answers["s-0"]  # kept through the outage
        ids = {api.message(answers[f"s-{i}"])["content"] for i in range(SENDS)}
    assert ids == {f"m-{i}" for i in range(SENDS)} and len(set(answers.values())) == SENDS
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 0
