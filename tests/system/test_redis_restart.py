"""A restarted Redis (channel layer, broker and presence cache) loses no stored message."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from config.embedded import _redis_bin
from tests.processes import FAST_FAILURE_ENV, free_port, start_beat
from tests.wsclient import WsClient

pytestmark = pytest.mark.system


class PrivateRedis:
    """A Redis of this test's own (append-only, like the embedded one), so it can be killed."""

    def __init__(self, directory):
        self.port = free_port()
        self.dir = directory
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run([str(_redis_bin("redis-server")), "--port", str(self.port), "--bind", "127.0.0.1",
                        "--dir", str(self.dir), "--appendonly", "yes", "--save", "", "--daemonize", "yes",
                        "--pidfile", str(self.dir / "redis.pid")], check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError("private Redis did not start")

    def kill(self) -> None:
        pid = int((self.dir / "redis.pid").read_text())
        subprocess.run(["kill", "-9", str(pid)], check=True)
        time.sleep(0.5)


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    try:
        server.kill()
    except Exception:
        pass


def test_messages_sent_around_a_redis_restart_all_arrive(processes, private_redis, tmp_path):
    env = {**FAST_FAILURE_ENV, "REDIS_URL": private_redis.url}
    web = processes.web("web", **env)
    processes.worker("worker", **env)
    start_beat(processes, tmp_path, REDIS_URL=private_redis.url)
    with WsClient(web.ws_url) as alice, WsClient(web.ws_url) as bob:
        alice.auth("ANZ-60001")
        bob.auth("ANZ-60002")
        alice.message("ANZ-60002", "before")
        assert bob.recv_type("MESSAGE")["data"]["content"] == "before"

        private_redis.kill()
        alice.message("ANZ-60002", "while redis is down")  # stored in Postgres; routing waits for Redis
        time.sleep(1)
        private_redis.start()
        time.sleep(1)
        for i in range(3):
            alice.message("ANZ-60002", f"after {i}")

        got = set(bob.collect_messages(4, timeout=45).values())
        assert got == {"while redis is down", "after 0", "after 1", "after 2"}
        # and the connections still work both ways
        bob.message("ANZ-60001", "still here")
        assert alice.recv_type("MESSAGE", timeout=20)["data"]["content"] == "still here"
        assert [f for f in alice.frames if f["type"] in ("INVALID_MESSAGE", "GENERAL_ERROR")] == []
