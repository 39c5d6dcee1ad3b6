"""What a client can count on, over a real socket: one frame per delivery, attempts that mean
failures, an acceptance for every stored message, and nothing lost when a node dies mid-send."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from messaging.models import Delivery, DeliveryState, Message
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system


def _messages(frames: list[dict]) -> list[dict]:
    return [f for f in frames if f["type"] == "MESSAGE"]


@pytest.mark.django_db
def test_a_linker_client_fetching_while_messages_are_pushed_sees_each_message_once(node):
    total = 40
    with WsClient(node.ws_url) as alice, WsClient(node.ws_url) as bob:
        alice.auth("ANZ-30001")
        bob.auth("ANZ-30002")
        frames: list[dict] = []
        stop = threading.Event()

        def sender() -> None:
            for i in range(total):
                alice.message("ANZ-30002", f"m-{i}")
                time.sleep(0.03)
            stop.set()

        thread = threading.Thread(target=sender)
        thread.start()
        while not stop.is_set():  # fetch and push race for the same rows
            bob.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 100})
            frames.extend(bob.collect_frames(lambda got: bool(got) and got[-1]["type"] ==
                                             "FETCH_MISSING_MESSAGES_COMPLETE", timeout=5))
        thread.join()
        frames.extend(bob.collect_frames(lambda got: False, timeout=3))
    per_message = Counter(f["data"]["id"] for f in _messages(frames))
    assert len(per_message) == total
    assert [mid for mid, n in per_message.items() if n > 1] == []  # every frame counted, not every id
    wait_for(lambda: Delivery.objects.filter(recipient="ANZ-30002", state="delivered").count() == total)


def _pushed_unless_parked(bob: WsClient, recipient: str, timeout: float = 10) -> list[dict]:
    """What the server pushes on this reconnect, until the three messages are there or `timeout`
    passes; or nothing, at once, while all three wait parked in the mailbox for a fetch (a message
    routed while its recipient was offline is not pushed when it connects: FETCH gets it)."""
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(_messages(got)) < 3 and time.monotonic() < deadline:
        if Delivery.objects.filter(recipient=recipient, state=DeliveryState.PENDING,
                                   next_attempt_at__isnull=True).count() == 3:
            break
        try:
            got.append(bob.recv(timeout=0.1))
        except TimeoutError:
            pass
    return got


@pytest.mark.django_db
def test_a_client_on_a_flapping_link_never_turns_its_messages_into_dead_letters(node):
    # ANZ allows 3 attempts; the link drops before each ACK many more times than that.
    with WsClient(node.ws_url) as alice:
        alice.auth("ANZ-31001")
        for i in range(3):
            alice.message("ANZ-31002", f"flap-{i}")
    wait_for(lambda: Delivery.objects.filter(recipient="ANZ-31002").count() == 3)
    for _ in range(6):
        with WsClient(node.ws_url) as bob:
            bob.auth("ANZ-31002", acks=True)
            got = _pushed_unless_parked(bob, "ANZ-31002")
            if len(_messages(got)) < 3:  # not pushed on this reconnect: they come by fetch
                bob.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
                got += bob.collect_frames(lambda f: len(_messages(f)) >= 3, timeout=10)
            assert sorted(m["data"]["content"] for m in _messages(got)) == ["flap-0", "flap-1", "flap-2"]
        # closed without an ACK
    assert list(Delivery.objects.filter(recipient="ANZ-31002").values_list("attempts", flat=True)) == [0, 0, 0]
    with WsClient(node.ws_url) as bob:
        bob.auth("ANZ-31002", acks=True)
        got = _pushed_unless_parked(bob, "ANZ-31002")
        if len(_messages(got)) < 3:
            bob.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 10})
            got += bob.collect_frames(lambda f: len(_messages(f)) >= 3, timeout=10)
        bob.send("ACK", {"ids": [m["data"]["id"] for m in _messages(got)]})
        bob.send("PING")
        bob.recv_type("PONG")
    wait_for(lambda: set(Delivery.objects.filter(recipient="ANZ-31002").values_list("state", flat=True))
             == {"delivered"})


def test_an_ack_mode_sender_gets_an_acceptance_for_every_stored_message(node):
    with WsClient(node.ws_url) as alice:
        alice.auth("ANZ-32001", acks=True)
        alice.message("ANZ-32002", "one", clientMessageId="c-1", reference="r-1")
        first = alice.recv_type("MESSAGE_ACCEPTED")
        assert first["data"]["clientMessageId"] == "c-1" and first["data"]["id"].isdigit()
        assert first["reference"] == "r-1" and first["data"]["recipients"] == 1
        alice.message("ANZ-32002", "one", clientMessageId="c-1")  # a resend after a doubt
        again = alice.recv_type("MESSAGE_ACCEPTED")
        assert again["data"]["id"] == first["data"]["id"] and again["data"]["duplicate"] is True
        alice.send("GROUP_MESSAGE", {"to": ["ANZ-32002", "ANZ-32003"], "content": "all"})
        assert alice.recv_type("MESSAGE_ACCEPTED")["data"]["recipients"] == 2
    with WsClient(node.ws_url) as linker:  # a client that did not opt in gets no such frame
        linker.auth("ANZ-32004")
        linker.message("ANZ-32002", "quiet")
        linker.send("PING")
        assert [f["type"] for f in linker.recv_all(quiet=1)] == ["PONG"]


@pytest.mark.django_db
def test_sends_in_flight_when_a_web_node_dies_are_resent_by_the_client_and_stored_once(processes, tmp_path):
    node_a = processes.web("web-a", **FAST_FAILURE_ENV)
    node_b = processes.web("web-b", **FAST_FAILURE_ENV)
    processes.worker("worker", **FAST_FAILURE_ENV)
    start_beat(processes, tmp_path)
    total = 300
    accepted: set[str] = set()
    sender = WsClient(node_a.ws_url)
    sender.auth("ANZ-33001", acks=True)

    def send_all() -> None:
        try:
            for i in range(total):
                sender.message("ANZ-33002", f"m-{i}", clientMessageId=f"cm-{i}")
                time.sleep(0.025)  # 40/s: within the app's rate limit
        except Exception:
            pass  # the node died under us

    def read_acceptances() -> None:
        try:
            while True:
                frame = sender.recv(timeout=10)
                if frame["type"] == "MESSAGE_ACCEPTED":
                    accepted.add(frame["data"]["clientMessageId"])
        except Exception:
            pass

    writer, reader = threading.Thread(target=send_all), threading.Thread(target=read_acceptances)
    writer.start()
    reader.start()
    time.sleep(1.0)
    node_a.kill()  # SIGKILL mid-stream
    writer.join(30)
    reader.join(30)
    assert 0 < len(accepted) < total
    # The client resends everything it has no acceptance for, on another node, with the same ids.
    with WsClient(node_b.ws_url) as again:
        again.auth("ANZ-33001", acks=True)
        missing = [i for i in range(total) if f"cm-{i}" not in accepted]
        for i in missing:
            again.message("ANZ-33002", f"m-{i}", clientMessageId=f"cm-{i}")
            time.sleep(0.025)
        acceptances = again.collect_frames(
            lambda f: sum(x["type"] == "MESSAGE_ACCEPTED" for x in f) >= len(missing), timeout=30)
        assert sum(f["type"] == "MESSAGE_ACCEPTED" for f in acceptances) == len(missing)
    contents = list(Message.objects.filter(sender="ANZ-33001").values_list("content", flat=True))
    assert sorted(contents) == sorted(f"m-{i}" for i in range(total))  # every message, each once
