"""A /ws client that leaves while the node is still busy with it, and daphne cancels its consumer
(as it does to one that outlives its client by its application close timeout): in-process
(tests/inprocess.py), over the consumer loop daphne runs, with real Postgres and Redis. What the
connection took is given back, whichever await the cancellation lands on."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from messaging.gateway.runtime import runtime
from presence import cache
from presence.models import PresenceEvent, Session
from tests.inprocess import InProcessClient, InProcessNode
from tests.processes import database_url_for_tests
from tests.wsclient import APP_ID, wait_for

pytestmark = pytest.mark.django_db


def _channel_of(node: InProcessNode, user_id: str) -> str | None:
    async def look() -> str | None:
        return next((name for name, conn in runtime().connections.items() if conn.user_id == user_id), None)

    return node.loop.run(look())


def _leaves_and_is_cancelled(node: InProcessNode, client: InProcessClient) -> None:
    """The client's socket closes, and daphne cancels the consumer still busy with it."""
    async def gone() -> None:
        await client.communicator.send_input({"type": "websocket.disconnect", "code": 1006})
        client.communicator.future.cancel()

    node.loop.run(gone())


def _ended_cancelled(node: InProcessNode, client: InProcessClient) -> bool:
    async def ended() -> bool:
        await asyncio.wait({client.communicator.future}, timeout=10)
        return client.communicator.future.cancelled()

    return node.loop.run(ended())


def _session_closed(user_id: str) -> bool:
    return Session.objects.filter(user_id=user_id, disconnected_at__isnull=False).exists()


def test_a_client_that_leaves_during_its_login_is_not_left_online_and_frees_its_slot(node):
    # The login waits for its session row (the sessions table is locked): the presence entry is made,
    # the login is not done, when the client leaves.
    blocker = psycopg.connect(database_url_for_tests())
    blocker.execute("LOCK TABLE presence_session IN SHARE MODE")
    try:
        client = InProcessClient(node)
        client.send("AUTH_CLIENT", {"appId": APP_ID, "userId": "ANZ-8201", "token": "t"})
        wait_for(lambda: cache.connections_of_many(["ANZ-8201"])["ANZ-8201"] != [], interval=0.01)
        _leaves_and_is_cancelled(node, client)
    finally:
        blocker.rollback()
        blocker.close()

    wait_for(lambda: cache.connections_of_many(["ANZ-8201"])["ANZ-8201"] == [])
    assert _channel_of(node, "ANZ-8201") is None  # the node's list holds no place for it either
    assert _ended_cancelled(node, client)  # the cancellation was not swallowed
    wait_for(lambda: _session_closed("ANZ-8201"))
    session = Session.objects.get(user_id="ANZ-8201")
    assert PresenceEvent.objects.get(kind="disconnect", connection_id=session.connection_id).close_reason == (
        "client left during login")
    with node.client() as again:  # and it logs in again as its first connection anywhere
        assert again.auth("ANZ-8201")["data"]["isAuthenticated"] is True


def test_a_consumer_cancelled_while_it_ends_still_closes_its_session_and_leaves_the_user_offline(node):
    client = InProcessClient(node)
    assert client.auth("ANZ-8211")["data"]["isAuthenticated"] is True
    channel = _channel_of(node, "ANZ-8211")

    async def leave_then_cancel_mid_end() -> None:
        await client.communicator.send_input({"type": "websocket.disconnect", "code": 1001})
        while channel in runtime().connections:  # its end has begun (the node's list is its first step)
            await asyncio.sleep(0)
        client.communicator.future.cancel()  # daphne's cancel lands on the end's first await

    node.loop.run(leave_then_cancel_mid_end())

    wait_for(lambda: _session_closed("ANZ-8211"))
    session = Session.objects.get(user_id="ANZ-8211")
    assert PresenceEvent.objects.get(kind="disconnect", connection_id=session.connection_id).close_reason == (
        "client closed (1001)")
    assert cache.connections_of_many(["ANZ-8211"])["ANZ-8211"] == []
    assert _ended_cancelled(node, client)
