"""The Python realtime client (switchboard_client.realtime.Realtime, clients/python) against a real
web node and worker: a send returns the stored id, a send whose acceptance was lost with its
connection is sent again and stored once, a message that comes again is handed over once, what was
missed while away is fetched after the reconnect, and in ACK mode a message is acknowledged only once
its handler is done (one that failed comes again)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from switchboard_client import Closed, Message, Realtime, SwitchboardClient, reconnect_delay

from apps_registry.services import api_key_create
from messaging.models import Message as StoredMessage

pytestmark = [pytest.mark.system, pytest.mark.django_db]
APP = "app-id-343"  # ANZ of the demo network: auth mode none


@pytest.fixture(scope="module")
def web(module_processes, demo_network, django_db_blocker):
    node = module_processes.web("web")
    module_processes.worker("worker")
    with django_db_blocker.unblock():
        node.api_key = api_key_create(app=demo_network["anz"], name="realtime tests")[1]
    return node


@pytest.fixture
def api(web):
    with SwitchboardClient(web.url, web.api_key, retries=0) as client:
        yield client


class Frames:
    """Every frame a client wrote ("out") and read ("in"), as the `debug` option hands them over."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []
        self.hooks: list[Any] = []

    def __call__(self, direction: str, text: str) -> None:
        frame = json.loads(text)
        self.seen.append((direction, frame))
        for hook in list(self.hooks):
            hook(direction, frame)

    def of(self, direction: str, frame_type: str) -> list[dict]:
        return [f for d, f in self.seen if d == direction and f["type"] == frame_type]


def user(web, user_id: str, **options: Any) -> Realtime:
    options.setdefault("min_delay", 0.05)
    options.setdefault("first_max_delay", 0.2)
    return Realtime(web.ws_url, app_id=APP, user_id=user_id, **options)


def run(scenario: Awaitable[Any], timeout: float = 40) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, timeout))


async def until(condition: Callable[[], bool], timeout: float = 15) -> None:
    """Wait for `condition` (asked in a thread: it may call the REST API) while the clients run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(condition):
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


def delivered(api: SwitchboardClient, message_id: str) -> bool:
    """What the app's server sees: every delivery of the message acknowledged."""
    return all(d["state"] == "delivered" for d in api.message(message_id)["deliveries"])


def test_a_send_in_ack_mode_returns_the_stored_id_and_the_recipient_gets_it_once_and_acknowledges_it(web, api):
    async def scenario():
        async with user(web, "ANZ-51001", acks=True) as alice, user(web, "ANZ-51002", acks=True) as bob:
            got: list[Message] = []

            async def read():
                async for message in bob.messages():
                    got.append(message)

            reader = asyncio.create_task(read())
            accepted = await alice.send("ANZ-51002", "hello bob", reference="r-1")
            await until(lambda: len(got) == 1)
            await until(lambda: delivered(api, accepted.id))
            await asyncio.sleep(0.5)
            await bob.close()
            await reader  # the loop ends when its client closes
            return accepted, got

    accepted, got = run(scenario())
    assert accepted.id.isdigit() and accepted.duplicate is False and accepted.recipients == 1
    assert [(m.sender, m.content, m.id, m.reference) for m in got] == [("ANZ-51001", "hello bob", accepted.id, "r-1")]


def test_a_send_whose_acceptance_was_lost_with_its_connection_is_sent_again_and_stored_once(web, api):
    frames = Frames()

    async def scenario():
        async with user(web, "ANZ-51011", acks=True, debug=frames) as alice, user(web, "ANZ-51012") as bob:
            got: list[Message] = []
            bob.on_message(got.append)

            def lose_the_first_acceptance(direction: str, frame: dict) -> None:
                if direction == "in" and frame["type"] == "MESSAGE_ACCEPTED":
                    frames.hooks.remove(lose_the_first_acceptance)
                    alice.reconnect()  # the acceptance is read from a socket that is gone

            frames.hooks.append(lose_the_first_acceptance)
            accepted = await alice.send("ANZ-51012", "exactly once", client_message_id="c-51011")
            await until(lambda: len(got) >= 1)
            await asyncio.sleep(1.0)  # time for a second copy, were there one
            return accepted, got

    accepted, got = run(scenario())
    sends = frames.of("out", "MESSAGE")
    assert [f["data"]["clientMessageId"] for f in sends] == ["c-51011", "c-51011"]
    acceptances = frames.of("in", "MESSAGE_ACCEPTED")
    assert [a["data"]["id"] for a in acceptances] == [accepted.id, accepted.id]
    assert accepted.duplicate is True and accepted.client_message_id == "c-51011"
    assert len(frames.of("in", "AUTH_CLIENT_REPLY")) == 2
    assert [(m.content, m.id) for m in got] == [("exactly once", accepted.id)]
    assert StoredMessage.objects.filter(client_message_id="c-51011").count() == 1


def test_a_message_that_comes_again_after_a_reconnect_is_handed_over_once_and_acknowledged_when_its_handler_is_done(
        web, api):
    frames = Frames()

    async def scenario():
        release = asyncio.Event()
        handled: list[Message] = []

        async def slow(message: Message) -> None:
            handled.append(message)
            await release.wait()

        async with user(web, "ANZ-51021", acks=True, debug=frames) as bob:
            bob.on_message(slow)
            sent = await asyncio.to_thread(api.send, "ANZ-51021", "once only")
            await until(lambda: len(handled) == 1)
            bob.reconnect()  # the handler is still at it: the message was not acknowledged
            await until(lambda: len(frames.of("in", "MESSAGE")) == 2)
            await asyncio.sleep(0.5)
            acked_while_handling = [f for f in frames.of("out", "ACK") if sent["id"] in f["data"]["ids"]]
            was_delivered = await asyncio.to_thread(delivered, api, sent["id"])
            release.set()
            await until(lambda: delivered(api, sent["id"]))
            return sent, handled, acked_while_handling, was_delivered

    sent, handled, acked_while_handling, was_delivered = run(scenario())
    assert [f["data"]["id"] for f in frames.of("in", "MESSAGE")] == [sent["id"], sent["id"]]
    assert [(m.content, m.id) for m in handled] == [("once only", sent["id"])]
    assert acked_while_handling == [] and was_delivered is False
    assert [f["data"]["ids"] for f in frames.of("out", "ACK")] == [[sent["id"]]]


def test_what_was_sent_while_the_user_was_away_is_fetched_after_it_reconnects(web, api):
    frames = Frames()

    async def scenario():
        back = asyncio.Event()
        logins = 0

        async def token() -> str:
            nonlocal logins
            logins += 1
            if logins > 1:
                await back.wait()  # away: the second connection waits for its token
            return "token-1"

        async with user(web, "ANZ-51031", token=token, debug=frames) as bob:
            got: list[Message] = []
            bob.on_message(got.append)
            bob.reconnect()
            await until(lambda: api.presence("ANZ-51031")["connections"] == 0)
            sent = [(await asyncio.to_thread(api.send, "ANZ-51031", f"meanwhile-{i}"))["id"] for i in range(3)]
            back.set()
            await until(lambda: len(got) == 3)
            return sent, got

    sent, got = run(scenario())
    assert [(m.content, m.id) for m in got] == [(f"meanwhile-{i}", sent[i]) for i in range(3)]
    assert [m.seq for m in got] == sorted(m.seq for m in got)
    order = [(d, f["type"]) for d, f in frames.seen if f["type"] in ("AUTH_CLIENT_REPLY", "FETCH_MISSING_MESSAGES_REQUEST",
                                                                         "MESSAGE")]
    assert order == [("in", "AUTH_CLIENT_REPLY"), ("out", "FETCH_MISSING_MESSAGES_REQUEST"),
                     ("in", "AUTH_CLIENT_REPLY"), ("out", "FETCH_MISSING_MESSAGES_REQUEST"),
                     ("in", "MESSAGE"), ("in", "MESSAGE"), ("in", "MESSAGE")]


def test_in_ack_mode_a_message_whose_handler_failed_is_not_acknowledged_and_is_handed_over_again(web, api):
    async def scenario():
        calls: list[str] = []

        def flaky(message: Message) -> None:
            calls.append(message.id)
            if len(calls) == 1:
                raise RuntimeError("the app's database is away")

        async with user(web, "ANZ-51041", acks=True) as bob:
            bob.on("error", lambda error: None)
            bob.on_message(flaky)
            sent = await asyncio.to_thread(api.send, "ANZ-51041", "try again")
            await until(lambda: len(calls) == 1)
            await asyncio.sleep(0.5)
            before = await asyncio.to_thread(delivered, api, sent["id"])
            bob.reconnect()
            await until(lambda: len(calls) == 2)
            await until(lambda: delivered(api, sent["id"]))
            return sent, calls, before

    sent, calls, before = run(scenario())
    assert calls == [sent["id"], sent["id"]] and before is False


def test_a_refused_login_ends_the_client_with_the_close_code_and_the_reason(web):
    async def scenario():
        rt = Realtime(web.ws_url, app_id="no-such-app", user_id="ANZ-51051")
        with pytest.raises(Closed) as refused:
            await rt.connect()
        return refused.value, rt.state

    refused, state = run(scenario())
    assert refused.code == 1008 and refused.reason and state == "closed"


def test_reconnects_wait_longer_after_each_failure_but_a_restart_is_answered_at_once():
    ceilings = [reconnect_delay(n, 1006, min_delay=0.5, first_max_delay=2, max_delay=60, random=lambda: 1.0)
                for n in range(8)]
    assert ceilings == [2, 4, 8, 16, 32, 60, 60, 60]
    assert reconnect_delay(7, 1012, random=lambda: 1.0) == 2 and reconnect_delay(7, 1013, random=lambda: 1.0) == 60
    assert reconnect_delay(3, 1006, random=lambda: 0.0) == 0.5
