"""`make run` with its embedded Postgres killed under a RELIABLE load: the platform comes back by
itself, and every message it accepted is delivered."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.processes import FAST_FAILURE_ENV, free_port, wait_http
from tests.wsclient import WsClient

pytestmark = pytest.mark.system

TOTAL = 400


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _postmaster_pid(var: Path) -> int:
    return int((var / "postgres" / "data" / "postmaster.pid").read_text().split("\n", 1)[0])


class Sender:
    """An ACK-mode client that keeps sending and resends whatever was not accepted."""

    def __init__(self, url: str):
        self.url = url
        self.accepted: set[str] = set()
        self.errors = 0
        self.lock = threading.Lock()

    def run(self, ids: list[int], pace: float, until_accepted: bool = False) -> None:
        """Send `ids`, then read until the socket is quiet for 2 s (or, `until_accepted`, until
        each of them has its acceptance: a resend after the outage need not wait out the quiet)."""
        try:
            with WsClient(self.url) as client:
                client.auth("ANZ-90001", acks=True)
                for i in ids:
                    client.message("ANZ-90002", f"m-{i}", clientMessageId=f"cm-{i}")
                    time.sleep(pace)
                wanted = {f"cm-{i}" for i in ids}

                def all_accepted() -> bool:
                    return until_accepted and wanted <= {f["data"].get("clientMessageId") for f in client.frames
                                                         if f["type"] == "MESSAGE_ACCEPTED"}

                while not all_accepted():
                    try:
                        client.recv(timeout=2)
                    except TimeoutError:
                        break
                for frame in client.frames:
                    self._note(frame)
        except Exception:
            pass  # the node refused us during the outage; the next round resends

    def _note(self, frame: dict) -> None:
        with self.lock:
            if frame["type"] == "MESSAGE_ACCEPTED":
                self.accepted.add(frame["data"]["clientMessageId"])
            elif frame["type"] in ("GENERAL_ERROR", "INVALID_MESSAGE"):
                self.errors += 1

    def missing(self) -> list[int]:
        return [i for i in range(TOTAL) if f"cm-{i}" not in self.accepted]


def test_a_killed_embedded_postgres_is_restarted_and_every_accepted_message_is_delivered(processes, tmp_path):
    var = tmp_path / "var"
    port = free_port()
    proc = processes.spawn(
        "supervise", [sys.executable, "-m", "devstack.supervise"], port=port, PORT=str(port),
        ADMIN_PASSWORD="a-long-test-password", SWITCHBOARD_VAR_DIR=str(var), DATABASE_URL="", REDIS_URL="",
        **FAST_FAILURE_ENV,
    )
    wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=180)
    url = f"ws://127.0.0.1:{port}/ws"
    received: dict[str, dict] = {}
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                with WsClient(url) as bob:
                    bob.auth("ANZ-90002", acks=True)
                    while not stop.is_set():
                        bob.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 500})
                        for frame in bob.collect_frames(lambda f: bool(f) and f[-1]["type"] ==
                                                        "FETCH_MISSING_MESSAGES_COMPLETE", timeout=3):
                            if frame["type"] == "MESSAGE":
                                received[frame["data"]["content"]] = frame
                                bob.send("ACK", {"ids": [frame["data"]["id"]]})
                        time.sleep(0.3)
            except Exception:
                time.sleep(0.5)  # refused or dropped during the outage: reconnect

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = Sender(url)
    try:
        load = threading.Thread(target=sender.run, args=(list(range(TOTAL)), 0.03))
        load.start()
        time.sleep(3)
        killed_at = time.monotonic()
        os.kill(_postmaster_pid(var), signal.SIGKILL)  # no goodbye: backends orphaned, shared memory held
        load.join(120)
        # Nobody touches anything: the supervisor notices and starts Postgres again.
        deadline = time.monotonic() + 90
        while not _ready(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        back_after = time.monotonic() - killed_at
        assert _ready(port), proc.output()[-3000:]
        assert sender.errors > 0 or len(sender.accepted) < TOTAL  # the outage was felt
        for _ in range(5):  # the client resends what was never accepted, idempotently
            missing = sender.missing()
            if not missing:
                break
            sender.run(missing, 0.025, until_accepted=True)
        assert sender.missing() == []
        deadline = time.monotonic() + 60
        while len(received) < TOTAL and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        receiver.join(30)
    assert sorted(received) == sorted(f"m-{i}" for i in range(TOTAL))
    output = proc.output()
    assert "not answering; starting it again" in output
    # A repeated failure is logged once per kind and window, not once per failed frame.
    assert output.count("Traceback") < 60, f"{output.count('Traceback')} tracebacks"
    print(f"\nPostgres back (/readyz 200) {back_after:.1f} s after kill -9; {len(output.splitlines())} log lines")
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 0
