"""Presence converges by itself: after a Redis failure mid-disconnect, and after a node that was
declared dead while frozen comes back."""

from __future__ import annotations

import os
import signal
import time

import pytest

from presence.models import Session
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system


def _presence_of(master: WsClient, event: str, user: str, timeout: float) -> dict:
    return master.recv_until(lambda f: f["type"] == event and f["data"]["userId"] == user, timeout=timeout)


def test_a_disconnect_during_a_redis_outage_leaves_no_ghost(private_redis, processes, tmp_path):
    env = {**FAST_FAILURE_ENV, "REDIS_URL": private_redis.url}
    web = processes.web("web", **env)
    processes.worker("worker", **env)
    start_beat(processes, tmp_path, REDIS_URL=private_redis.url)
    with WsClient(web.ws_url) as master:
        master.auth("ANZ-123223")
        victim = WsClient(web.ws_url)
        victim.auth("ANZ-40001")
        _presence_of(master, "USER_CONNECTED", "ANZ-40001", 10)

        private_redis.kill()
        victim.close()  # its node cannot tell Redis: the entry survives in the append-only file
        time.sleep(1.5)
        private_redis.start()

        # The node's heartbeat finds the entry it no longer holds, removes it, and tells the master.
        _presence_of(master, "USER_DISCONNECTED", "ANZ-40001", 30)
        with WsClient(web.ws_url) as back:
            back.auth("ANZ-40001")
            _presence_of(master, "USER_CONNECTED", "ANZ-40001", 10)


@pytest.mark.django_db
def test_a_node_declared_dead_while_frozen_closes_its_sockets_with_1012_when_it_wakes(processes, tmp_path):
    frozen = processes.web("web-frozen", **FAST_FAILURE_ENV)
    other = processes.web("web-other", **FAST_FAILURE_ENV)
    processes.worker("worker", **FAST_FAILURE_ENV)
    start_beat(processes, tmp_path)
    with WsClient(other.ws_url) as master:
        master.auth("ANZ-123223")
        ghost = WsClient(frozen.ws_url)
        ghost.auth("ANZ-41001")
        _presence_of(master, "USER_CONNECTED", "ANZ-41001", 10)

        os.killpg(frozen.popen.pid, signal.SIGSTOP)  # a long GC pause, a frozen VM
        try:
            _presence_of(master, "USER_DISCONNECTED", "ANZ-41001", 30)  # the reaper ended it
            wait_for(lambda: not Session.objects.filter(user_id="ANZ-41001", disconnected_at__isnull=True).exists())
        finally:
            os.killpg(frozen.popen.pid, signal.SIGCONT)

        # Awake, the node learns it was declared dead and does not live on as a ghost.
        assert ghost.wait_closed(timeout=30) == 1012
        with WsClient(frozen.ws_url) as back:  # clients reconnect (here to the same node) and are whole again
            assert back.auth("ANZ-41001")["data"]["isAuthenticated"] is True
            _presence_of(master, "USER_CONNECTED", "ANZ-41001", 10)
            wait_for(lambda: Session.objects.filter(user_id="ANZ-41001", disconnected_at__isnull=True).count() == 1)
