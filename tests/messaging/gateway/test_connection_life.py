"""A login cancelled half-way (messaging.gateway.connection.life): the client left while the node was still
logging it in, and daphne cancelled its consumer. Whatever the login had taken by then (the node's
list, the presence entry, the connection slot, the session row) is given back, and the cancellation
still ends the consumer."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from messaging.gateway.connection.life import ConnectionLife, Refusal
from messaging.gateway.runtime import NodeRuntime
from presence import cache
from presence.models import PresenceEvent, Session
from tests.factories import make_app
from tests.processes import database_url_for_tests

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_cache(redis_client):
    redis_client.flushdb()


@pytest.fixture
def one_connection_per_user():
    return make_app(max_connections_per_user=1)


async def _closed(code: int, reason: str) -> None:
    pass


def _life(node: NodeRuntime, n: int) -> ConnectionLife:
    life = ConnectionLife(channel_name=f"specific.test!{n}", close=_closed)
    life.node = node
    return life


def _admit(life: ConnectionLife, user_id: str):
    return life.admit(app_id="app-id-343", user_id=user_id, token="", acks=False, origin=None,
                      remote_addr="10.0.0.9", user_agent="leaving")


async def _until(condition, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        assert loop.time() < deadline, "not within the deadline"
        await asyncio.sleep(0)


async def _cancelled(task: asyncio.Task) -> bool:
    """Cancel `task` as daphne cancels a consumer; whether it ended cancelled (not swallowed)."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


def test_a_login_cancelled_as_it_registers_in_presence_leaves_the_user_offline_and_its_slot_free(
        one_connection_per_user):
    async def scenario() -> tuple[bool, list, dict, Refusal | bool]:
        node = NodeRuntime()
        leaving = _life(node, 1)
        login = asyncio.ensure_future(_admit(leaving, "ANZ-7"))

        async def listed() -> bool:
            return leaving.channel_name in node.connections

        await _until(listed)  # past connection_add, waiting on presence: not yet authenticated
        cancelled = await _cancelled(login)
        await leaving.end(ledger=None, channels=None, position=None)  # the consumer's end, as on every way out
        left_online = await cache.connections_of("ANZ-7")
        again = await _admit(_life(node, 2), "ANZ-7")  # the user's one connection slot
        return cancelled, left_online, dict(node.connections), again

    cancelled, left_online, listed, again = asyncio.run(scenario())

    assert cancelled
    assert left_online == []
    assert list(listed) == ["specific.test!2"]  # the cancelled login is not in the node's list
    assert again is True  # admitted as the user's first connection: the slot was free


def test_a_login_cancelled_while_its_session_row_is_written_closes_that_row_and_leaves_the_user_offline(
        one_connection_per_user):
    async def scenario() -> tuple[bool, list, dict]:
        node = NodeRuntime()
        leaving = _life(node, 1)
        # The session row waits for the database (held here by a lock on the sessions table): the
        # presence entry is made, the login is not done.
        blocker = await psycopg.AsyncConnection.connect(database_url_for_tests())
        await blocker.execute("LOCK TABLE presence_session IN SHARE MODE")
        try:
            login = asyncio.ensure_future(_admit(leaving, "ANZ-8"))

            async def in_presence() -> bool:
                return await cache.connections_of("ANZ-8") != []

            await _until(in_presence)
            cancelled = await _cancelled(login)
        finally:
            await blocker.rollback()
            await blocker.close()
        await leaving.end(ledger=None, channels=None, position=None)
        return cancelled, await cache.connections_of("ANZ-8"), dict(node.connections)

    cancelled, left_online, listed = asyncio.run(scenario())

    assert cancelled
    assert left_online == [] and listed == {}
    session = Session.objects.get(user_id="ANZ-8")
    assert session.disconnected_at is not None
    assert PresenceEvent.objects.get(kind="disconnect", connection_id=session.connection_id).close_reason == (
        "client left during login")
