"""The Redis presence cache: first/last connection, the per-user limit, and a heartbeat that heals."""

from __future__ import annotations

import pytest

from foundation.transport.sockets import run_async
from presence import cache

NODE = "node-a"


@pytest.fixture(autouse=True)
def _empty_cache(redis_client):
    redis_client.flushdb()


def _add(user: str, channel: str, node: str = NODE, limit: int = 10) -> bool:
    return run_async(cache.connection_add(user_id=user, channel_name=channel, node_id=node, acks=False, limit=limit))


def _remove(user: str, channel: str, node: str = NODE) -> bool:
    return run_async(cache.connection_remove(user_id=user, channel_name=channel, node_id=node))


def _beat(held: list[tuple[str, str]], node: str = NODE) -> list[str]:
    conns = [cache.HeldConnection(channel, user, False) for channel, user in held]
    return run_async(cache.node_heartbeat(node_id=node, ttl=20, held=conns))


def _online(user: str) -> list[str]:
    return sorted(c.channel_name for c in cache.connections_of_many([user])[user])


def test_the_first_and_the_last_connection_of_a_user_are_told_apart():
    assert _add("ANZ-1", "ch-1") is True
    assert _add("ANZ-1", "ch-2", node="node-b") is False
    assert _remove("ANZ-1", "ch-1") is False
    assert _remove("ANZ-1", "ch-2", node="node-b") is True
    assert _remove("ANZ-1", "ch-2", node="node-b") is False  # a second removal announces nothing


def test_a_user_cannot_hold_more_connections_than_the_app_allows():
    for i in range(3):
        _add("ANZ-1", f"ch-{i}", limit=3)
    with pytest.raises(cache.TooManyConnections):
        _add("ANZ-1", "ch-3", limit=3)
    assert _online("ANZ-1") == ["ch-0", "ch-1", "ch-2"]


def test_a_connection_whose_disconnect_never_reached_redis_is_removed_by_the_heartbeat():
    _add("ANZ-1", "ch-1")
    _add("ANZ-2", "ch-2")
    _add("ANZ-2", "ch-3", node="node-b")
    # ch-1 and ch-2 closed on node-a, but Redis was away when they did: only the node knows.
    assert _beat([]) == []  # first sighting: suspects, not yet removed
    assert _online("ANZ-1") == ["ch-1"]
    assert _beat([]) == ["ANZ-1"]  # ANZ-1's last connection is gone; ANZ-2 still has node-b's
    assert _online("ANZ-1") == [] and _online("ANZ-2") == ["ch-3"]


def test_a_connection_registered_while_a_heartbeat_was_in_flight_is_not_taken_for_a_ghost():
    _beat([])
    _add("ANZ-1", "ch-new")  # registered after the node took its snapshot of what it holds
    assert _beat([]) == []  # the stale-looking entry is only a suspect
    assert _beat([("ch-new", "ANZ-1")]) == []  # the next snapshot holds it: cleared
    assert _beat([("ch-new", "ANZ-1")]) == []
    assert _online("ANZ-1") == ["ch-new"]


def test_a_connection_that_ended_while_a_heartbeat_was_in_flight_is_not_put_back_as_a_ghost():
    _add("ANZ-1", "ch-1")
    held = [("ch-1", "ANZ-1")]  # the node's snapshot, taken before...
    assert _remove("ANZ-1", "ch-1") is True  # ... the connection ended and its removal reached Redis
    _beat(held)  # the beat with the stale snapshot arrives after it
    assert _online("ANZ-1") == []
    assert _add("ANZ-1", "ch-2") is True  # so the user's next connection is its first
    _beat([("ch-2", "ANZ-1")])
    assert _online("ANZ-1") == ["ch-2"]


def test_the_heartbeat_restores_what_an_emptied_redis_forgot(redis_client):
    _add("ANZ-1", "ch-1")
    redis_client.flushdb()  # a restarted Redis without persistence
    _beat([("ch-1", "ANZ-1")])
    assert _online("ANZ-1") == ["ch-1"]


def test_a_node_declared_dead_is_told_so_and_cannot_re_add_its_sockets():
    _add("ANZ-1", "ch-1")
    forgotten = cache.node_forget(node_id=NODE)
    assert [(f.channel_name, f.user_id, f.was_last) for f in forgotten] == [("ch-1", "ANZ-1", True)]
    with pytest.raises(cache.NodeDeclaredDead):
        _beat([("ch-1", "ANZ-1")])
    with pytest.raises(cache.NodeDeclaredDead):
        _add("ANZ-1", "ch-2")
    assert _online("ANZ-1") == []
    run_async(cache.node_revive(node_id=NODE))  # the node's new life
    assert _add("ANZ-1", "ch-2") is True
