"""A master user catches up: whenever it authenticates it gets who is online (ONLINE_USERS), and
its view (that snapshot, then the announcements after it) is who is connected, even when its own
web node is killed under churn, again and again."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed

from presence import cache
from presence.online import app_online_users_sync
from tests.processes import FAST_FAILURE_ENV, Proc, ProcessFactory, free_port
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system

MASTER = "ANZ-123223"
ENV = {**FAST_FAILURE_ENV, "PRESENCE_SNAPSHOT_PAGE": "3"}


@pytest.fixture(autouse=True)
def _presence_starts_empty(redis_client):
    """No reaper runs in these tests: what earlier tests' nodes left in presence is removed first."""
    for pattern in ("sb:u:*", "sb:a:*", "sb:n:*"):
        keys = list(redis_client.scan_iter(match=pattern, count=1000))
        if keys:
            redis_client.delete(*keys)


class MasterView:
    """A master client that keeps the view a master app would: the snapshot's pages, then every
    USER_CONNECTED / USER_DISCONNECTED after it, applied in the order they arrive."""

    def __init__(self, url: str):
        self.client = WsClient(url)
        self.online: set[str] = set()
        self.lock = threading.Lock()
        assert self.client.auth(MASTER)["data"]["isAuthenticated"] is True
        self.snapshot = self._snapshot()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _snapshot(self) -> list[dict]:
        """The frames right after AUTH_CLIENT_REPLY: the snapshot's pages, before any announcement."""
        pages = [self.client.recv()]
        while pages[-1]["type"] == "ONLINE_USERS" and pages[-1]["data"]["page"] < pages[-1]["data"]["pages"]:
            pages.append(self.client.recv())
        assert [p["type"] for p in pages] == ["ONLINE_USERS"] * len(pages)
        assert [p["data"]["page"] for p in pages] == list(range(1, pages[0]["data"]["pages"] + 1))
        for page in pages:
            self.online.update(page["data"]["users"])
        assert len(self.online) == pages[0]["data"]["count"]
        return pages

    def _read(self) -> None:
        try:
            while True:
                frame = self.client.recv(timeout=3600)
                with self.lock:
                    if frame["type"] == "USER_CONNECTED":
                        self.online.add(frame["data"]["userId"])
                    elif frame["type"] == "USER_DISCONNECTED":
                        self.online.discard(frame["data"]["userId"])
        except (ConnectionClosed, OSError, TimeoutError):
            return

    def view(self) -> set[str]:
        with self.lock:
            return set(self.online)

    def close(self) -> None:
        self.client.close()


def test_a_master_that_connects_gets_the_users_already_online_in_pages(processes):
    web = processes.web("web", **ENV)
    users = [f"ANZ-3000{i}" for i in range(7)]
    clients = [WsClient(web.ws_url) for _ in users]
    other_master = WsClient(web.ws_url)
    try:
        for client, user in zip(clients, users, strict=True):
            client.auth(user)
        other_master.auth(MASTER)  # the master's own other connection: never listed to itself
        master = MasterView(web.ws_url)
        try:
            assert [page["data"] for page in master.snapshot] == [
                {"users": users[0:3], "page": 1, "pages": 3, "count": 7},
                {"users": users[3:6], "page": 2, "pages": 3, "count": 7},
                {"users": users[6:7], "page": 3, "pages": 3, "count": 7},
            ]
            clients[0].close()
            wait_for(lambda: master.view() == set(users[1:]))
        finally:
            master.close()
    finally:
        for client in [*clients, other_master]:
            client.close()


def test_a_notice_lost_on_the_way_is_made_up_for_by_the_masters_periodic_re_check(processes):
    """Pub/sub delivers at most once: a user who came online (or left) without the master hearing of
    it is announced to the master at its next re-check, once."""
    web = processes.web("web", **ENV, PRESENCE_MASTER_RESYNC_SECONDS="1")
    master = MasterView(web.ws_url)
    quiet = {"user_id": "ANZ-3400001", "channel_name": "specific.lost!1", "node_id": "elsewhere"}
    try:
        # Registered in presence as a node would, but its announcement never reaches the master.
        asyncio.run(cache.connection_add(**quiet, acks=False, limit=10))
        wait_for(lambda: master.view() == {"ANZ-3400001"}, timeout=10)
        asyncio.run(cache.connection_remove(**quiet))
        wait_for(lambda: master.view() == set(), timeout=10)
        time.sleep(2.5)  # two more re-checks: nothing to say, nothing said
        notices = [f for f in master.client.frames if f["type"] in ("USER_CONNECTED", "USER_DISCONNECTED")]
        assert [(f["type"], f["data"]["userId"]) for f in notices] == [
            ("USER_CONNECTED", "ANZ-3400001"), ("USER_DISCONNECTED", "ANZ-3400001")]
    finally:
        master.close()


class Churn:
    """Users that connect and disconnect in a loop, to whichever node is up, until paused."""

    def __init__(self, urls: list[str], users: list[str]):
        self.urls = urls
        self.go, self.stop = threading.Event(), threading.Event()
        self.busy: set[str] = set()
        self.lock = threading.Lock()
        self.cycles = 0
        self.threads = [threading.Thread(target=self._run, args=(user,), daemon=True) for user in users]

    def _run(self, user: str) -> None:
        rng = random.Random(user)
        while not self.stop.is_set():
            if not self.go.wait(0.1):
                continue
            with self.lock:
                self.busy.add(user)
            try:
                with WsClient(rng.choice(self.urls)) as client:
                    client.auth(user)
                    time.sleep(rng.uniform(0.02, 0.2))
                self.cycles += 1
            except Exception:  # its node is down: try again (elsewhere, maybe)
                time.sleep(0.05)
            finally:
                with self.lock:
                    self.busy.discard(user)

    def resume(self) -> None:
        self.go.set()

    def pause(self) -> None:
        """Stopped, with every churner's connection closed."""
        self.go.clear()
        wait_for(lambda: not self.busy, timeout=30)

    def __enter__(self) -> Churn:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def _node_a(processes: ProcessFactory, port: int, life: int) -> Proc:
    return processes.web(f"web-a{life}", port=port, NODE_ID="web-a", **ENV)


def _settles_on(master: MasterView, expected: set[str]) -> None:
    """The master's view becomes `expected` (the app's index too), and stays so."""
    try:
        wait_for(lambda: master.view() == expected, timeout=20)
        time.sleep(1.0)  # nothing late undoes it
    finally:
        view, index = master.view(), set(app_online_users_sync("ANZ")) - {MASTER}
    assert (view - expected, expected - view) == (set(), set()), master.client.frames[-30:]
    assert index == expected


def test_the_masters_view_is_who_is_connected_after_its_own_node_is_killed_repeatedly(processes):
    port_a = free_port()
    node_a = _node_a(processes, port_a, 0)
    node_b = processes.web("web-b", **ENV)
    steady_a = [f"ANZ-3100{i}" for i in range(4)]  # on A: killed with it, back on A once it is up
    steady_b = [f"ANZ-3200{i}" for i in range(4)]  # on B throughout
    connected = {user: WsClient(node_a.ws_url) for user in steady_a}
    connected |= {user: WsClient(node_b.ws_url) for user in steady_b}
    for user, client in connected.items():
        client.auth(user)
    expected = set(steady_a) | set(steady_b)
    master = MasterView(node_a.ws_url)
    try:
        with Churn([node_a.ws_url, node_b.ws_url], [f"ANZ-3300{i}" for i in range(6)]) as churn:
            for life in range(1, 4):
                churn.resume()
                time.sleep(1.0)  # churn going on all around the master
                node_a.kill()  # SIGKILL: the master's own node, with users and churners on it
                master.close()
                if life % 2:
                    # Straight back, to the node that is up: A's dead connections are still listed
                    # there, and leave once A's restart cleans them up.
                    master = MasterView(node_b.ws_url)
                node_a = _node_a(processes, port_a, life)  # its first connection cleans up its last life
                if not life % 2:
                    master = MasterView(node_a.ws_url)  # back where it was, while the churn goes on
                for user in steady_a:
                    connected[user].close()
                    connected[user] = WsClient(node_a.ws_url)
                    connected[user].auth(user)
                churn.pause()
                _settles_on(master, expected)
                if life % 2:
                    master.close()
                    master = MasterView(node_a.ws_url)  # back on A, to be killed with it next time
                    assert master.view() == expected  # its snapshot alone is right
        assert churn.cycles > 20
    finally:
        master.close()
        for client in connected.values():
            client.close()


@pytest.mark.django_db
def test_an_announcement_that_is_no_longer_true_or_tells_nothing_new_is_not_written_to_the_master(processes):
    from foundation.transport import sockets
    from presence.models import Session
    from presence.services import presence_frame

    web = processes.web("web", **ENV)
    with WsClient(web.ws_url) as back:
        back.auth("ANZ-34001")
        master = MasterView(web.ws_url)
        try:
            assert master.view() == {"ANZ-34001"}
            channel = Session.objects.get(user_id=MASTER, disconnected_at__isnull=True).channel_name

            def announce(event_type: str, user: str) -> None:
                event = sockets.presence_event(presence_frame(event_type, user), user_id=user,
                                               online=event_type == "USER_CONNECTED")
                sockets.send_many_sync([(channel, event)])

            # A dead node's cleanup, late: the user is already back on this node.
            announce("USER_DISCONNECTED", "ANZ-34001")
            announce("USER_CONNECTED", "ANZ-34002")  # and a connect whose user has left since
            announce("USER_CONNECTED", "ANZ-34001")  # true, but the master has it already: not again
            back.close()  # true and new: written (after the three above: one channel, in order)
            wait_for(lambda: any(f["type"] == "USER_DISCONNECTED" for f in master.client.frames))
            presence = [f for f in master.client.frames if f["type"].startswith("USER_")]
            assert presence == [{"type": "USER_DISCONNECTED", "data": {"userId": "ANZ-34001"}}]
            assert master.view() == set()
        finally:
            master.close()
