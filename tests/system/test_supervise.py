from __future__ import annotations

import signal
import sys
import time

import psutil
import pytest

from tests.processes import free_port, wait_http

pytestmark = pytest.mark.system


def test_make_run_brings_up_web_worker_and_beat_and_sigterm_stops_them_all(processes, settings, tmp_path):
    port = free_port()
    proc = processes.spawn("supervise", [sys.executable, "-m", "devstack.supervise"], port=port,
                           PORT=str(port), ADMIN_PASSWORD="a-long-test-password", SWITCHBOARD_VAR_DIR=str(tmp_path))
    started = time.monotonic()
    wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=90)
    deadline = time.monotonic() + 30
    while "admin:" not in proc.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    out = proc.output()
    assert f"admin:     http://localhost:{port}/admin/" in out
    assert f"websocket: ws://localhost:{port}/ws" in out
    children = psutil.Process(proc.popen.pid).children(recursive=True)
    roles = " ".join(" ".join(c.cmdline()) for c in children)
    assert "config.web" in roles and "worker" in roles and "beat" in roles
    assert "-Q webhooks" in roles  # the webhook worker, beside the routing worker
    for prefix in ("web    |", "worker |", "hooks  |", "beat   |"):
        deadline = time.monotonic() + 30
        while prefix not in proc.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert prefix in proc.output()

    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 0
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert time.monotonic() - started < 120
