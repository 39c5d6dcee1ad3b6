from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from devstack import balancer
from tests.processes import free_port, wait_http
from tests.wsclient import WsClient, wait_for

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
    assert "-Q webhooks,forwarding" in roles  # the outbound worker, beside the routing worker
    for prefix in ("web      |", "worker   |", "outbound |", "beat     |"):
        deadline = time.monotonic() + 30
        while prefix not in proc.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert prefix in proc.output()

    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 0
    assert not _still_running(children)
    assert time.monotonic() - started < 120


def _still_running(children: list[psutil.Process], timeout: float = 5) -> list[psutil.Process]:
    """Those of `children` still running (a zombie has exited) once all have exited or `timeout` passed."""
    def running(child: psutil.Process) -> bool:
        try:
            return child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    while (left := [c for c in children if running(c)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _web_nodes(proc) -> dict[str, psutil.Process]:
    """The supervisor's web node processes by NODE_ID."""
    return {c.environ()["NODE_ID"]: c for c in _children_named(proc, "config.web")}


def _port(node: psutil.Process) -> str:
    argv = node.cmdline()
    return argv[argv.index("--port") + 1]


def _children_named(proc, text: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(proc.popen.pid).children(recursive=True):
        try:
            if text in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.Error, OSError):  # a short-lived helper process that ended meanwhile
            continue
    return found


def test_make_run_with_three_web_nodes_serves_behind_haproxy_and_restarts_them_one_at_a_time(processes, tmp_path):
    port = free_port()
    proc = processes.spawn("supervise-lb", [sys.executable, "-m", "devstack.supervise"], port=port,
                           PORT=str(port), WEB_NODES="3", WORKERS="2", ADMIN_PASSWORD="a-long-test-password",
                           SWITCHBOARD_VAR_DIR=str(tmp_path), DRAIN_SECONDS="1", DRAIN_GRACE_SECONDS="2")
    wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=90)
    wait_for(lambda: "Ctrl-C stops everything" in proc.output(), timeout=30)
    assert "HAProxy in front of web-1, web-2, web-3" in proc.output()
    assert len(_children_named(proc, "-Q celery,routing")) == 2  # WORKERS=2
    nodes = {name: (node.pid, _port(node)) for name, node in _web_nodes(proc).items()}
    assert sorted(nodes) == ["web-1", "web-2", "web-3"]
    stats_port = int(re.search(r"its stats: http://localhost:(\d+)/", proc.output()).group(1))
    assert balancer.server_states(stats_port) == {"web-1": "UP", "web-2": "UP", "web-3": "UP"}

    with WsClient(f"ws://127.0.0.1:{port}/ws") as before:
        assert before.auth("ANZ-17201")["data"]["isAuthenticated"] is True
        rolling = subprocess.run([sys.executable, "-m", "devstack.rolling", str(port)], env=processes.env(
            SWITCHBOARD_VAR_DIR=str(tmp_path)), capture_output=True, text=True, timeout=240)
        assert rolling.returncode == 0, rolling.stdout + rolling.stderr
        lines = rolling.stdout.splitlines()
        # one node after the other: each back (and UP in HAProxy) before the next is stopped
        order = [line.split(":")[0] for line in lines if "draining" in line or "serving again" in line]
        assert order == ["web-1", "web-1", "web-2", "web-2", "web-3", "web-3"]
        assert all("(UP in HAProxy)" in line for line in lines if "serving again" in line)
        assert lines[-1] == "done"
        before.wait_closed(timeout=10)  # its node was restarted: it was disconnected (1012 once nodes drain)

    # new processes on the same ports, under the same names; clients are served through HAProxy again
    again = _web_nodes(proc)
    assert {name: (node.pid != nodes[name][0], _port(node)) for name, node in again.items()} == {
        name: (True, port) for name, (_, port) in nodes.items()}
    assert balancer.server_states(stats_port) == {"web-1": "UP", "web-2": "UP", "web-3": "UP"}
    with WsClient(f"ws://127.0.0.1:{port}/ws") as after:
        assert after.auth("ANZ-17201")["data"]["isAuthenticated"] is True

    children = psutil.Process(proc.popen.pid).children(recursive=True)
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 0
    assert not _still_running(children)


def test_the_rolling_restart_command_without_a_running_make_run_says_so(processes, tmp_path):
    rolling = subprocess.run([sys.executable, "-m", "devstack.rolling", str(free_port())],
                             env=processes.env(SWITCHBOARD_VAR_DIR=str(tmp_path)), capture_output=True, text=True)
    assert rolling.returncode == 1
    assert "is it running, with this PORT?" in rolling.stderr
