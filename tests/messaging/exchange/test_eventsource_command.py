"""`manage.py eventsource` as a real process: clients served, SIGTERM flushes and exits 0, and a
restarted process keeps the follow graph and resumes after the last applied event."""

from __future__ import annotations

import signal
import socket
import sys
import time

import pytest

from messaging.exchange.models import ExchangeState, Follow
from tests.factories import make_app
from tests.processes import ProcessFactory, free_port

pytestmark = pytest.mark.django_db(transaction=True)  # the process must see the committed app


def start(processes: ProcessFactory, app_name: str, event_port: int, client_port: int):
    proc = processes.spawn("eventsource", [sys.executable, "manage.py", "eventsource", "--app", app_name,
                                           "--event-port", str(event_port), "--client-port", str(client_port),
                                           "--no-intake"])
    deadline = time.monotonic() + 60
    while "eventsource ready" not in proc.output():
        assert proc.alive() and time.monotonic() < deadline, proc.output()
        time.sleep(0.1)
    return proc


def client(port: int, uid: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"{uid}\n".encode())
    time.sleep(0.2)  # registered before the events come
    return sock


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def processes(request):
    factory = ProcessFactory(request)
    yield factory
    factory.stop_all()


def test_sigterm_flushes_and_a_restart_keeps_the_follow_graph(processes):
    app = make_app()
    event_port, client_port = free_port(), free_port()
    proc = start(processes, app.app_name, event_port, client_port)
    nine = client(client_port, 9)
    source = socket.create_connection(("127.0.0.1", event_port))
    source.sendall(b"2|F|2|9\n1|F|1|9\r\n3|U|1|9\n4|S|9\n5|P|1|9\n")
    assert read_exactly(nine, 25) == b"1|F|1|9\r\n2|F|2|9\n5|P|1|9\n"

    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(30) == 0, proc.output()
    assert nine.recv(100) == b""  # closed by the server
    assert ExchangeState.objects.get(app=app).applied_seq == 5
    assert set(Follow.objects.filter(app=app).values_list("follower", "followee")) == {(2, 9)}

    proc = start(processes, app.app_name, event_port, client_port)
    assert "applied_seq=5" in proc.output()
    two = client(client_port, 2)
    source = socket.create_connection(("127.0.0.1", event_port))
    source.sendall(b"5|S|9\n6|S|9\n")  # 5 is a duplicate now; 6 reaches 9's only follower
    assert read_exactly(two, 6) == b"6|S|9\n"
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(30) == 0, proc.output()
