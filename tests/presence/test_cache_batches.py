"""A node registers and forgets connections in batches (one Redis round trip for a storm's tick):
every entry gets the answer it would have got alone, in order."""

from __future__ import annotations

import pytest

from foundation.transport.sockets import run_async
from presence import cache
from presence.cache import ConnectionEntry

NODE = "node-a"


@pytest.fixture(autouse=True)
def _empty_cache(redis_client):
    redis_client.flushdb()


def add(*entries: ConnectionEntry) -> list:
    return run_async(cache.connections_add(entries=list(entries)))


def remove(*entries: ConnectionEntry) -> list:
    return run_async(cache.connections_remove(entries=list(entries)))


def entry(user: str, channel: str, node: str = NODE, limit: int = 10) -> ConnectionEntry:
    return ConnectionEntry(user_id=user, channel_name=channel, node_id=node, limit=limit)


def online(user: str) -> list[str]:
    return sorted(c.channel_name for c in cache.connections_of_many([user])[user])


def test_in_one_batch_only_a_users_first_connection_is_the_first():
    assert add(entry("ANZ-1", "ch-1"), entry("ANZ-1", "ch-2"), entry("ANZ-2", "ch-3")) == [True, False, True]
    assert online("ANZ-1") == ["ch-1", "ch-2"]


def test_in_one_batch_only_a_users_last_connection_is_the_last():
    add(entry("ANZ-1", "ch-1"), entry("ANZ-1", "ch-2"))
    assert remove(entry("ANZ-1", "ch-1"), entry("ANZ-1", "ch-2"), entry("ANZ-1", "ch-2")) == [False, True, False]
    assert online("ANZ-1") == []


def test_a_connection_over_the_users_limit_is_refused_alone():
    results = add(entry("ANZ-1", "ch-1", limit=1), entry("ANZ-1", "ch-2", limit=1), entry("ANZ-2", "ch-3", limit=1))

    assert results[0] is True and results[2] is True
    assert isinstance(results[1], cache.TooManyConnections) and results[1].limit == 1
    assert online("ANZ-1") == ["ch-1"]


def test_a_node_declared_dead_has_every_connection_of_the_batch_refused(redis_client):
    cache.node_forget(node_id=NODE)

    results = add(entry("ANZ-1", "ch-1"), entry("ANZ-2", "ch-2"))

    assert all(isinstance(r, cache.NodeDeclaredDead) for r in results)
    assert online("ANZ-1") == online("ANZ-2") == []


def test_a_redis_that_lost_its_scripts_is_given_them_again(redis_client):
    add(entry("ANZ-1", "ch-1"))
    redis_client.script_flush()

    assert add(entry("ANZ-2", "ch-2")) == [True]
    redis_client.script_flush()
    assert remove(entry("ANZ-2", "ch-2")) == [True]
