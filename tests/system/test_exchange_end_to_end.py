"""The event exchange end to end, every part a real process: events POSTed to the REST intake and
sent by a TCP event source reach `manage.py eventsource`, which puts them in order, keeps the follow
graph durable, and notifies a follower-maze TCP client (byte for byte) and a /ws user of the app
(EVENT frames) of exactly the same events."""

from __future__ import annotations

import socket
import sys
import time

import httpx
import pytest

from apps_registry.services import api_key_create
from messaging.exchange.models import ExchangeState, Follow
from tests.processes import free_port
from tests.wsclient import WsClient

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]  # the processes see the key


def _eventsource(processes, app_name: str, event_port: int, client_port: int):
    proc = processes.spawn("eventsource", [sys.executable, "manage.py", "eventsource", "--app", app_name,
                                           "--event-port", str(event_port), "--client-port", str(client_port)])
    deadline = time.monotonic() + 60
    while "eventsource ready" not in proc.output():
        assert proc.alive() and time.monotonic() < deadline, proc.output()
        time.sleep(0.1)
    return proc


def _read(sock: socket.socket, size: int, timeout: float = 15) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_rest_and_tcp_events_reach_a_tcp_client_and_a_ws_user_alike_in_sequence_order(node, demo_network,
                                                                                    module_processes):
    anz = demo_network["anz"]
    _, raw_key = api_key_create(app=anz, name="exchange end to end")
    event_port, client_port = free_port(), free_port()
    source_proc = _eventsource(module_processes, "ANZ", event_port, client_port)
    with WsClient(node.ws_url) as web_user:
        assert web_user.auth("ANZ-4077")["data"]["isAuthenticated"]
        tcp_user = socket.create_connection(("127.0.0.1", client_port), timeout=10)
        tcp_user.sendall(b"4077\n")
        time.sleep(1.5)  # registered, and the engine's check for /ws listeners (cached 1 s) sees the web user

        # 2 and 4 come from the REST intake, 1, 3 and 5 from the TCP source, out of order: a gap at 2
        # holds 3 back until the REST call fills it.
        source = socket.create_connection(("127.0.0.1", event_port))
        source.sendall(b"3|F|4077|4078\n5|P|4078|4077\r\n1|F|4078|4077\n")
        answer = httpx.post(f"{node.url}/api/v1/events", json={"events": ["2|B", "4|S|4078"]},
                            headers={"Authorization": f"Bearer {raw_key}"}, timeout=10)
        assert answer.status_code == 202, answer.text

        # 4077: followed by 4078 (1, F to 4077), the broadcast (2), 4078's status (4: 4077 follows 4078
        # since 3), a private message (5, sent with \r\n and forwarded as sent). Not 3 (F to 4078).
        expected = b"1|F|4078|4077\n2|B\n4|S|4078\n5|P|4078|4077\r\n"
        assert _read(tcp_user, len(expected)) == expected
        frames = web_user.collect_frames(lambda fs: sum(f["type"] == "EVENT" for f in fs) >= 4, 15)
        frames += web_user.recv_all(quiet=1.0)
        assert [(f["data"]["seq"], f["data"]["kind"], f["data"]["from"], f["data"]["to"])
                for f in frames if f["type"] == "EVENT"] == [
            (1, "F", 4078, 4077), (2, "B", None, None), (4, "S", 4078, None), (5, "P", 4078, 4077)]
        tcp_user.close()
        source.close()
    module_processes.stop_all()  # SIGTERM: the last batch is committed before the process ends
    assert source_proc.popen.returncode == 0 or source_proc.popen.wait(30) == 0
    assert ExchangeState.objects.get(app=anz).applied_seq == 5
    assert set(Follow.objects.filter(app=anz).values_list("follower", "followee")) == {(4078, 4077), (4077, 4078)}


def _database_backends_of(pid: int) -> list[int]:
    """The Postgres backends serving process `pid` (its application_name ends with its pid:
    config.settings.env.process_label)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s", [f"% {pid}"])
        return [row[0] for row in cur.fetchall()]


def test_the_exchange_keeps_delivering_when_its_database_connection_is_cut_under_load(module_processes):
    """Its commits fail while the connection is gone (as in a Postgres restart); their events wait
    and are committed with the next batch; nothing is lost, and the TCP client gets every line once."""
    from django.db import connection

    from apps_registry.models import ClientApp, Domain, UserDistribution

    app = ClientApp.objects.create(app_name="EXC", app_id="app-id-exc", master_user_id="EXC-1", auth_mode="none")
    UserDistribution.objects.create(app=app, domain=Domain.objects.get_or_create(name="domain-01")[0], range_from=0)
    event_port, client_port = free_port(), free_port()
    source_proc = _eventsource(module_processes, "EXC", event_port, client_port)
    tcp_user = socket.create_connection(("127.0.0.1", client_port), timeout=10)
    tcp_user.sendall(b"7001\n")
    time.sleep(0.5)
    source = socket.create_connection(("127.0.0.1", event_port))
    total, cut = 3000, 0
    for first in range(1, total + 1, 100):
        source.sendall(b"".join(b"%d|P|7002|7001\n" % seq for seq in range(first, first + 100)))
        if first in (1001, 2001):  # twice under load: every connection the eventsource holds is cut
            deadline = time.monotonic() + 10
            while not (backends := _database_backends_of(source_proc.popen.pid)):  # (back after the last cut)
                assert time.monotonic() < deadline, "the eventsource holds no database connection to cut"
                time.sleep(0.05)
            with connection.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS t(pid)", [backends])
            cut += len(backends)
        time.sleep(0.05)
    expected = b"".join(b"%d|P|7002|7001\n" % seq for seq in range(1, total + 1))
    assert _read(tcp_user, len(expected), timeout=30) == expected  # every line, once, in order
    deadline = time.monotonic() + 15
    while ExchangeState.objects.get(app=app).applied_seq != total:
        assert time.monotonic() < deadline, "the last batch was never committed"
        time.sleep(0.2)
    assert source_proc.alive() and cut >= 2
    assert "committing a batch failed" in source_proc.output()  # it did fail, and went on
    tcp_user.close()
    source.close()
