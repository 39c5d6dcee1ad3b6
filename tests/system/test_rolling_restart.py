"""Issue 17's done-means: three web nodes behind a real HAProxy and two routing workers, under
ACK-mode RELIABLE load through the balancer, are restarted one after another (SIGTERM: each drains)
and one is killed (SIGKILL). Clients reconnect as the protocol page says (tests.loadclients).

With SIGTERM every client is closed with 1012, nothing accepted is lost, nothing comes again after
its ACK, users who leave are announced to a master on another node within 10 s, and at the end the
master's view is who is connected. With SIGKILL nothing accepted is lost either (a message whose
ACK died in the killed node's socket buffer may come again: counted, allowed), and the master's
view converges."""

from __future__ import annotations

import signal
import time

import pytest

from presence.online import app_online_users_sync
from tests.cluster import NODES, Cluster
from tests.loadclients import Master, Peer
from tests.processes import Proc, start_beat
from tests.wsclient import wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]

MASTER = "ANZ-123223"
# Drains of 2 s, cut after 32 (2 + a grace of 30: on a two-core CI machine slowed down and busy
# with a whole ring beside, a node's 15 connections took 12.4 s to end, their releases' database
# calls queued); a killed node is declared dead after 4 s of silence (the reaper, run by beat as in
# `make run`, looks every second): the defaults are 10 s, 20 s and 5 s.
NODE_ENV = {"DRAIN_SECONDS": "2", "DRAIN_GRACE_SECONDS": "30",
            "PRESENCE_HEARTBEAT_SECONDS": "1", "PRESENCE_NODE_TIMEOUT": "4"}
PEERS = 24
RATE = 5.0  # messages per second per peer: 120 a second in all
LEAVERS = 6  # idle users, some of whom leave for good during the test
ANNOUNCED_WITHIN = 10.0


class RollingCluster(Cluster):
    """The load balancer's cluster with two routing workers and beat, whose nodes can be stopped
    and started again under the same NODE_ID and port."""

    def __init__(self, factory, directory):
        super().__init__(factory, directory, workers=2, **NODE_ENV)
        start_beat(factory, directory, **NODE_ENV)
        self.factory = factory
        self.lives = dict.fromkeys(NODES, 0)

    def stop(self, name: str, sig: signal.Signals) -> None:
        proc = self.nodes[name]
        proc.popen.send_signal(sig)
        proc.popen.wait(60)  # (past the drain's cut)
        if sig == signal.SIGTERM:
            assert proc.popen.returncode == 0, f"{name} did not drain cleanly:\n{proc.output()[-2000:]}"

    def start(self, name: str) -> Proc:
        self.lives[name] += 1
        old = self.nodes[name]
        self.nodes[name] = self.factory.web(f"{name}.{self.lives[name]}", port=old.port, NODE_ID=name,
                                            TRUSTED_PROXIES="127.0.0.1", **NODE_ENV)
        wait_for(lambda: self.states().get(name) == "UP", timeout=20)
        return self.nodes[name]

    def failures(self) -> list[str]:
        """The lines every life of every node logged about something that failed (the last 40)."""
        lines = [f"{proc.name}: {line}" for proc in self.factory.procs if proc.name.startswith("web")
                 for line in proc.output().splitlines() if "failed" in line or "Error" in line]
        return lines[-40:]

    def all_up(self) -> None:
        wait_for(lambda: self.states() == dict.fromkeys(NODES, "UP"), timeout=20)


@pytest.fixture(scope="module")
def cluster(module_processes, tmp_path_factory):
    import redis
    from django.conf import settings

    # Earlier modules' killed nodes may have left users in presence, and no reaper runs here.
    client = redis.Redis.from_url(settings.REDIS_URL)
    for pattern in ("sb:u:*", "sb:a:*", "sb:n:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()
    return RollingCluster(module_processes, tmp_path_factory.mktemp("lb"))


class Load:
    """The peers sending to each other, the idle users who may leave, and the master."""

    def __init__(self, cluster: RollingCluster, base: int):
        users = [f"ANZ-{base + i}" for i in range(PEERS)]
        self.peers = [Peer(user, cluster.ws_url, users, RATE) for user in users]
        self.idle = [Peer(f"ANZ-{base + 500 + i}", cluster.ws_url, [], 0) for i in range(LEAVERS)]
        self.master = Master(MASTER, cluster.ws_url)
        self.left: dict[str, float] = {}

    def start(self) -> None:
        self.master.start()
        wait_for(lambda: self.master.snapshots == 1)
        for peer in [*self.peers, *self.idle]:
            peer.start()
        wait_for(lambda: all(p.connected.is_set() for p in [*self.peers, *self.idle]), timeout=30)
        for peer in self.peers:
            peer.sending.set()

    def leave_from_another_node_than_the_masters(self) -> None:
        """One idle user closes normally and does not come back; one on another node than the
        master's when there is one."""
        from presence.models import Session

        live = dict(Session.objects.filter(disconnected_at__isnull=True).values_list("user_id", "node_id"))
        staying = [p for p in self.idle if p.user not in self.left]
        elsewhere = [p for p in staying if live.get(p.user) not in (None, live.get(MASTER))]
        leaver = (elsewhere or staying)[0]
        self.left[leaver.user] = leaver.leave()

    def stop_sending_and_settle(self, timeout: float = 30) -> None:
        """No new messages; wait until everything sent is accepted and everything accepted arrived,
        then fetch once more everywhere (a fetch answers what is still in a mailbox)."""
        for peer in self.peers:
            peer.sending.clear()
        deadline = time.monotonic() + timeout
        while (missing := self.missing()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for peer in self.peers:
            peer.fetch()
        wait_for(lambda: all(p.record.left_missing == 0 for p in self.peers), timeout=20)
        assert missing == {} or self.missing() == {}, f"{self.summary()}; missing: {self.missing()}"

    def expected(self) -> dict[str, set[str]]:
        """Recipient -> the ids of every message the server accepted for it."""
        out: dict[str, set[str]] = {p.user: set() for p in self.peers}
        for peer in self.peers:
            for message_id, to in peer.accepted().items():
                out[to].add(message_id)
        return out

    def missing(self) -> dict[str, object]:
        """What is not there yet: messages never accepted, and accepted ones not received."""
        gaps: dict[str, object] = {}
        unaccepted = {p.user: p.unaccepted() for p in self.peers if p.unaccepted()}
        if unaccepted:
            gaps["unaccepted"] = unaccepted
        by_user = {p.user: p for p in self.peers}
        lost = {user: ids - by_user[user].received() for user, ids in self.expected().items()}
        if any(lost.values()):
            gaps["not received"] = {user: sorted(ids) for user, ids in lost.items() if ids}
        return gaps

    def connected_users(self) -> set[str]:
        return {p.user for p in [*self.peers, *self.idle] if p.user not in self.left}

    def assert_master_converges(self, timeout: float = 20) -> None:
        """The master's view (and the app's presence index) become the users connected, and stay so."""
        expected = self.connected_users()

        def state() -> dict[str, object]:
            view, index = self.master.view(), set(app_online_users_sync("ANZ")) - {MASTER}
            return {"master lacks": expected - view, "master has left": view - expected,
                    "index lacks": expected - index, "index has left": index - expected,
                    "not connected": {p.user for p in [*self.peers, *self.idle]
                                      if p.user in expected and not p.connected.is_set()}}

        deadline = time.monotonic() + timeout
        while any(state().values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # nothing late undoes it
        now = state()
        assert not any(now.values()), (now, self._story(now["master lacks"] | now["master has left"]))

    def _story(self, users: set[str]) -> dict[str, dict]:
        """What the clients and the master saw of `users`, in seconds since the master's first snapshot."""
        t0 = self.master.log[0][0] if self.master.log else 0.0
        by_user = {p.user: p for p in [*self.peers, *self.idle]}
        return {user: {"authenticated at": [round(t - t0, 2) for t in by_user[user].record.connected_at],
                       "closes": by_user[user].record.close_codes,
                       "notices": [(round(t - t0, 2), kind) for t, kind, u in self.master.notices if u == user]}
                for user in users if user in by_user}

    def stop(self) -> None:
        self.master.stop()
        for peer in [*self.peers, *self.idle]:
            if peer.is_alive():
                peer.leave()

    def summary(self) -> str:
        records = [p.record for p in self.peers]
        accepted = sum(len(p.accepted()) for p in self.peers)
        again = sum(count - 1 for r in records for count in r.deliveries.values())
        codes = sorted({code for r in records for code in r.close_codes})
        return (f"{accepted} messages accepted, {again} delivered again before their ACK, "
                f"{sum(len(r.after_ack) for r in records)} after it; "
                f"{sum(len(r.close_codes) for r in records)} closes (codes {codes}); "
                f"master: {self.master.snapshots} snapshots, closes {self.master.close_codes}")


def test_a_rolling_restart_under_load_closes_with_1012_loses_nothing_and_the_master_keeps_up(cluster):
    cluster.all_up()
    load = Load(cluster, base=1700000)
    load.start()
    try:
        time.sleep(2.0)  # the load going on all over the cluster
        for i, name in enumerate(NODES):
            cluster.stop(name, signal.SIGTERM)
            if i < 2:
                load.leave_from_another_node_than_the_masters()  # while clients are still reconnecting
            cluster.start(name)
            time.sleep(1.0)
        load.leave_from_another_node_than_the_masters()  # after the last restart: three left in all
        time.sleep(1.0)
        load.stop_sending_and_settle()
        print(load.summary())

        records = {p.user: p.record for p in load.peers}
        everyone = {p.user: p.record for p in [*load.peers, *load.idle]}
        assert sum(len(p.accepted()) for p in load.peers) > 500
        # every client was closed, each time with 1012 (the master too), and nothing else went wrong
        assert {user for user, r in everyone.items() if not r.close_codes and user not in load.left} == set()
        assert {user: r.close_codes for user, r in everyone.items() if set(r.close_codes) - {1012}} == {}
        assert set(load.master.close_codes) == {1012}  # its own node was restarted under it
        assert {user: r.problems for user, r in everyone.items() if r.problems} == {}
        assert load.master.problems == []
        # nothing accepted is lost, nothing arrives that was not accepted, nothing comes after its ACK
        assert load.missing() == {}
        assert {user: set(r.deliveries) for user, r in records.items()} == load.expected()
        # (key, when and where ACKed, when and where it came again), and what the nodes logged as failed
        assert {user: r.again for user, r in records.items() if r.again} == {}, cluster.failures()
        # leavers were announced within 10 s; the master's view is who is connected
        announced = {user: load.master.gone_since(user) for user in load.left}
        after = {user: round(at - load.left[user], 2) for user, at in announced.items() if at is not None}
        print(f"leavers gone from the master's view after {after} s")
        assert sorted(after) == sorted(load.left)
        assert {user: seconds for user, seconds in after.items() if seconds >= ANNOUNCED_WITHIN} == {}
        load.assert_master_converges()
    finally:
        load.stop()


def test_a_node_killed_under_load_loses_nothing_and_the_master_converges(cluster):
    cluster.all_up()
    load = Load(cluster, base=1710000)
    load.start()
    try:
        time.sleep(2.0)
        cluster.stop("web-2", signal.SIGKILL)
        time.sleep(1.0)  # its clients reconnect to the others meanwhile
        cluster.start("web-2")  # same NODE_ID and port; its last life is ended by the reaper or its first connection
        load.leave_from_another_node_than_the_masters()
        time.sleep(2.0)
        load.stop_sending_and_settle()
        print(load.summary())

        records = {p.user: p.record for p in load.peers}
        everyone = {p.user: p.record for p in [*load.peers, *load.idle]}
        assert sum(len(p.accepted()) for p in load.peers) > 200
        assert any(r.close_codes for r in records.values())  # the killed node's clients were cut off
        assert {user: r.problems for user, r in everyone.items() if r.problems} == {}
        assert load.master.problems == []
        assert load.missing() == {}
        assert {user: set(r.deliveries) for user, r in records.items()} == load.expected()
        # An ACK that was still in the killed node's socket buffer is lost with it: that message
        # comes again (at least once). Counted in the summary above, not a failure.
        load.assert_master_converges()
    finally:
        load.stop()
