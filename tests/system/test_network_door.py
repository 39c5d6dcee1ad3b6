"""The door between domains, against a real daphne node playing domain-02 (linked to domain-01;
its link to domain-03 disabled): a call under /internal/ is checked from its headers before any of
its body is read, so an unsigned, unknown, stale or replayed call is refused while its client is
still sending, and many such sockets cost the node nothing; a link has at most its share of large
bodies read at once; and a body that trickles is dropped after HTTP_BODY_TIMEOUT_SECONDS. A
genuine call, however large, is still taken."""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest

from apps_registry.models import Domain, DomainLink
from foundation import signed_calls
from messaging.federation.wire.transport import FORWARD_PATH, NOT_A_NEIGHBOUR, PING_PATH
from tests.processes import ModuleRequest, ProcessFactory

pytestmark = pytest.mark.system

SECRET = "door-secret-" + "x" * 32
LARGE_OVER = 100_000  # the node's NETWORK_LARGE_BODY_BYTES
BODY_TIMEOUT = 2  # the node's HTTP_BODY_TIMEOUT_SECONDS
CHUNK = b"x" * 1024


@pytest.fixture(scope="module")
def door(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        here = Domain.objects.create(name="domain-02")
        DomainLink.objects.create(n1=Domain.objects.create(name="domain-01"), n2=here, shared_secret=SECRET)
        DomainLink.objects.create(n1=Domain.objects.create(name="domain-03"), n2=here, shared_secret=SECRET,
                                  enabled=False)
    factory = ProcessFactory(ModuleRequest("network_door"))
    try:
        yield factory.web("domain-02", DOMAIN_NAME="domain-02", NETWORK_LARGE_BODY_BYTES=str(LARGE_OVER),
                          NETWORK_LARGE_BODIES_PER_LINK="1", HTTP_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT))
    finally:
        factory.stop_all()
        with django_db_blocker.unblock():
            DomainLink.objects.all().delete()
            Domain.objects.all().delete()


def signed(body: bytes, *, sender: str = "domain-01", path: str = PING_PATH, **signing) -> dict[str, str]:
    return signed_calls.signed_headers(secret=SECRET, sender=sender, method="POST", path=path, body=body, **signing)


def head(path: str, headers: dict[str, str], *, length: int | None = None) -> bytes:
    """A POST's line and headers: chunked, or with `length` declared."""
    framing = {"Transfer-Encoding": "chunked"} if length is None else {"Content-Length": str(length)}
    lines = [f"POST {path} HTTP/1.1", "Host: domain-02", "Content-Type: application/json",
             *(f"{k}: {v}" for k, v in {**headers, **framing}.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def opened(node, request_head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    sock.sendall(request_head)
    return sock


def answer_of(sock: socket.socket, timeout: float = 10) -> tuple[int, dict, bool]:
    """(status, JSON body, whether the node closed the connection after it)."""
    sock.settimeout(timeout)
    got, closed = b"", False
    try:
        while chunk := sock.recv(65536):
            got += chunk
        closed = True
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    if not got:
        return 0, {}, closed  # no answer
    status_line, _, rest = got.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.split(b"\r\n\r\n", 1)[1]), closed


def trickled(sock: socket.socket, *, budget: float = 3.0, every: float = 0.02) -> int:
    """Send a chunked body a kilobyte at a time until the node answers (or `budget` seconds have
    gone): the bytes of body sent meanwhile."""
    sent = 0
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if select.select([sock], [], [], every)[0]:
            return sent
        try:
            sock.sendall(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
        except (BrokenPipeError, ConnectionResetError):
            return sent
        sent += len(CHUNK)
    raise AssertionError(f"no answer while {sent} bytes of body were sent in {budget} s")


def linked(node) -> None:
    """Wait until the node has read the link (it reads its links every second)."""
    deadline = time.monotonic() + 10
    while httpx.post(node.url + PING_PATH, content=b"{}", headers=signed(b"{}"), timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the node never heard a genuine ping"
        time.sleep(0.1)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_an_unsigned_chunked_call_is_refused_from_its_headers_while_its_client_is_still_sending(door):
    for headers, refusal in [({}, "missing or malformed Switchboard-Domain header"),
                             ({"Switchboard-Domain": "domain-01"}, "missing or malformed signature")]:
        sock = opened(door, head(FORWARD_PATH, headers))
        sent = trickled(sock)
        assert sent <= 4 * len(CHUNK)  # answered at once: the body was never waited for
        assert answer_of(sock) == (403, {"error": refusal}, True)  # and the connection closed


def test_a_stranger_a_disabled_link_a_stale_or_a_replayed_call_is_refused_before_its_body(door):
    linked(door)
    replayed = signed(b"{}")
    assert httpx.post(door.url + PING_PATH, content=b"{}", headers=replayed, timeout=10).status_code == 200
    cases = [
        (signed(b"{}", sender="domain-77"), 403, NOT_A_NEIGHBOUR),
        (signed(b"{}", sender="domain-03"), 403, NOT_A_NEIGHBOUR),  # its link is disabled here: no name told
        (signed(b"{}", timestamp=int(time.time()) - 3600), 403, "timestamp outside the allowed 300 s window"),
        (replayed, 409, "replayed call (nonce already used)"),
    ]
    for headers, status, refusal in cases:
        sock = opened(door, head(PING_PATH, headers))
        assert trickled(sock) <= 4 * len(CHUNK)
        assert answer_of(sock) == (status, {"error": refusal}, True)
    sock = opened(door, head("/internal/v1/elsewhere", signed(b"{}")))
    assert trickled(sock) <= 4 * len(CHUNK)
    assert answer_of(sock)[:2] == (404, {"error": "/internal/v1/elsewhere is not an internal endpoint of domain-02"})
    sock = opened(door, head("/internal/v1/config", {}))  # the meta role's export is a GET: no body
    assert trickled(sock) <= 4 * len(CHUNK)
    assert answer_of(sock)[:2] == (400, {"error": "refused: the configuration export takes no request body"})


def queued_bytes(port: int) -> int:
    """Bytes waiting in the kernel on the TCP connections to `port`, either side, either way: 0 once
    the node has read (or refused) everything its clients sent."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                ends = {int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)}
                if port in ends:
                    tx, rx = fields[4].split(":")
                    total += int(tx, 16) + int(rx, 16)
    return total


def test_fifty_sockets_sending_unsigned_bodies_do_not_grow_the_node(door):
    before = rss_bytes(door.popen.pid)
    socks = []
    try:
        for _ in range(50):
            sock = opened(door, head(FORWARD_PATH, {"Switchboard-Domain": "domain-01"}))
            sock.settimeout(5)
            try:
                for _ in range(64):  # a megabyte each, as fast as the node takes it
                    sock.sendall(b"%x\r\n%s\r\n" % (16 * len(CHUNK), 16 * CHUNK))
            except OSError:
                pass  # refused and closed: the rest was never read
            socks.append(sock)
        deadline = time.monotonic() + 20
        while queued_bytes(door.port):  # (what the clients sent is in the node, or was refused)
            assert time.monotonic() < deadline, f"{queued_bytes(door.port)} bytes still on their way to the node"
            time.sleep(0.05)
        grown = rss_bytes(door.popen.pid) - before
        assert grown < 16 * 1024 * 1024, f"the node grew {grown} bytes"  # 50 MB if the bodies had been read
        assert [answer_of(sock, timeout=2)[0] for sock in socks] == [403] * 50
    finally:
        for sock in socks:
            sock.close()


def test_a_genuine_call_larger_than_the_public_cap_is_still_taken_whole_or_chunked(door):
    linked(door)
    body = b"{" + b" " * 3_000_000 + b"}"  # past HTTP_MAX_BODY_BYTES (2.5 MB): only the calls between domains may
    whole = httpx.post(door.url + PING_PATH, content=body, headers=signed(body), timeout=20)
    assert (whole.status_code, whole.json()) == (200, {"domain": "domain-02"})
    chunked = httpx.post(door.url + PING_PATH, content=iter([body[i:i + 65536] for i in range(0, len(body), 65536)]),
                         headers=signed(body), timeout=20)
    assert (chunked.status_code, chunked.json()) == (200, {"domain": "domain-02"})


def test_a_link_has_at_most_its_share_of_large_bodies_read_at_once(door):
    linked(door)
    body = b"{" + b" " * (3 * LARGE_OVER) + b"}"
    first = opened(door, head(PING_PATH, signed(body), length=len(body)))
    first.sendall(body[:LARGE_OVER])  # and the rest is slow to come
    try:
        deadline = time.monotonic() + 10
        while True:  # (until the node has let the first one in: then the link's one place is taken)
            second = opened(door, head(PING_PATH, signed(body), length=len(body)))
            if select.select([second], [], [], 1.0)[0]:
                break
            second.close()
            assert time.monotonic() < deadline, "a second large body was let in beside the first"
        assert answer_of(second) == (503, {"error": f"1 calls over {LARGE_OVER} bytes from domain-01 are being read "
                                                    "here already; retry"}, True)
        small = httpx.post(door.url + PING_PATH, content=b"{}", headers=signed(b"{}"), timeout=10)
        assert small.status_code == 200  # a call of ordinary size goes on
        assert not select.select([first], [], [], 0)[0]  # the first is still being read
    finally:
        first.close()  # gone: its place is free again
    deadline = time.monotonic() + 10
    while (again := httpx.post(door.url + PING_PATH, content=body, headers=signed(body), timeout=10)).status_code != 200:
        assert again.status_code == 503 and time.monotonic() < deadline
        time.sleep(0.1)


def test_a_body_that_trickles_is_dropped_after_the_body_timeout_on_any_path(door):
    linked(door)
    body = b"{" + b" " * 1000 + b"}"
    socks = [opened(door, head(PING_PATH, signed(body), length=len(body))),
             opened(door, head("/api/v1/messages", {}, length=len(body)))]
    started = time.monotonic()
    answered = {}
    try:
        for n in range(200):  # a byte each at a time (Twisted's idle timeout starts again with each)
            for sock in socks:
                if sock not in answered and select.select([sock], [], [], 0)[0]:
                    answered[sock] = time.monotonic() - started
                elif sock not in answered:
                    sock.sendall(body[n:n + 1])
            if len(answered) == len(socks):
                break
            time.sleep(0.05)
        assert len(answered) == 2, "a trickling body was never dropped"
        for sock in socks:
            assert answer_of(sock) == (408, {"error": "request_timeout", "detail": (
                f"the request body did not arrive within {BODY_TIMEOUT} s of its headers")}, True)
        assert all(BODY_TIMEOUT - 0.5 <= seconds <= BODY_TIMEOUT + 3 for seconds in answered.values())
    finally:
        for sock in socks:
            sock.close()
