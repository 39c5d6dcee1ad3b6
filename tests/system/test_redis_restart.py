"""A restarted Redis (channel layer, broker and presence cache) loses no stored message."""

from __future__ import annotations

import time

import pytest

from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.wsclient import WsClient

pytestmark = pytest.mark.system


def test_messages_sent_around_a_redis_restart_all_arrive(private_redis, processes, tmp_path):
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
