"""The app index of online users (`sb:a:<app>:online`): it lists exactly the users holding a
connection, through every way the presence cache changes, and heals within one heartbeat."""

from __future__ import annotations

import pytest

from foundation.transport.sockets import run_async
from presence import cache, online

NODE, OTHER = "node-a", "node-b"


@pytest.fixture(autouse=True)
def _empty_cache(redis_client):
    redis_client.flushdb()


def _add(user: str, channel: str, node: str = NODE) -> bool:
    return run_async(cache.connection_add(user_id=user, channel_name=channel, node_id=node, acks=False, limit=10))


def _remove(user: str, channel: str, node: str = NODE) -> bool:
    return run_async(cache.connection_remove(user_id=user, channel_name=channel, node_id=node))


def _beat(held: list[tuple[str, str]], node: str = NODE) -> list[str]:
    conns = [cache.HeldConnection(channel, user, False) for channel, user in held]
    return run_async(cache.node_heartbeat(node_id=node, ttl=20, held=conns))


def _online(app: str = "ANZ") -> list[str]:
    return run_async(online.app_online_users(app))


def test_a_user_is_listed_from_its_first_connection_until_its_last_one_closes():
    _add("ANZ-1", "ch-1")
    _add("ANZ-1", "ch-2", node=OTHER)
    assert _online() == ["ANZ-1"]
    _remove("ANZ-1", "ch-1")
    assert _online() == ["ANZ-1"]  # still connected on the other node
    _remove("ANZ-1", "ch-2", node=OTHER)
    assert _online() == []


def test_each_app_lists_only_its_own_users_in_user_id_order():
    for user, channel in (("ANZ-20", "c1"), ("BNZ-5", "c2"), ("ANZ-3", "c3"), ("ANZ.x_2-7", "c4")):
        _add(user, channel)
    assert _online("ANZ") == ["ANZ-20", "ANZ-3"]  # byte-wise: "2" before "3"
    assert _online("BNZ") == ["BNZ-5"]
    assert _online("ANZ.x_2") == ["ANZ.x_2-7"]


def test_a_refused_connection_lists_nobody():
    run_async(cache.connection_add(user_id="ANZ-1", channel_name="c1", node_id=NODE, acks=False, limit=1))
    with pytest.raises(cache.TooManyConnections):
        run_async(cache.connection_add(user_id="ANZ-2", channel_name="c2", node_id=NODE, acks=False, limit=0))
    assert _online() == ["ANZ-1"]


def test_a_ghost_the_heartbeat_removes_leaves_the_index_with_it():
    _add("ANZ-1", "ch-1")
    _add("ANZ-2", "ch-2")
    _add("ANZ-2", "ch-3", node=OTHER)
    _beat([])
    assert _beat([]) == ["ANZ-1"]
    assert _online() == ["ANZ-2"]


def test_an_index_that_misses_connected_users_is_whole_after_one_heartbeat(redis_client):
    _add("ANZ-1", "ch-1")
    _add("ANZ-2", "ch-2", node=OTHER)
    redis_client.delete(online.app_online_key("ANZ"))  # a cluster upgraded while its users were connected
    _beat([("ch-1", "ANZ-1")])
    _beat([("ch-2", "ANZ-2")], node=OTHER)
    assert _online() == ["ANZ-1", "ANZ-2"]


def test_the_heartbeat_restores_the_index_of_an_emptied_redis(redis_client):
    _add("ANZ-1", "ch-1")
    redis_client.flushdb()
    _beat([("ch-1", "ANZ-1")])
    assert _online() == ["ANZ-1"]


def test_a_dead_node_takes_its_users_out_of_the_index_unless_they_are_connected_elsewhere():
    _add("ANZ-1", "ch-1")
    _add("ANZ-2", "ch-2")
    _add("ANZ-2", "ch-3", node=OTHER)
    _add("BNZ-1", "ch-4")
    cache.node_forget(node_id=NODE)
    assert _online("ANZ") == ["ANZ-2"]
    assert _online("BNZ") == []


def test_a_node_restarted_under_its_id_drops_what_its_earlier_life_left_and_names_who_went_offline():
    _add("ANZ-1", "ch-1")
    _add("ANZ-2", "ch-2")
    _add("ANZ-2", "ch-3", node=OTHER)
    # It died between registering these and opening their session rows: nothing else cleans them up.
    gone = run_async(cache.node_revive(node_id=NODE))
    assert gone == ["ANZ-1"]
    assert _online() == ["ANZ-2"]
    assert cache.connections_of_many(["ANZ-1"])["ANZ-1"] == []


def test_a_page_of_online_users_continues_after_the_cursor_and_counts_them_all():
    for i in range(1, 6):
        _add(f"ANZ-{i}", f"ch-{i}")
    first = online.app_online_page("ANZ", after=None, limit=2)
    assert (first.users, first.count, first.more) == (["ANZ-1", "ANZ-2"], 5, True)
    _remove("ANZ-1", "ch-1")  # gone behind the cursor: the walk goes on
    second = online.app_online_page("ANZ", after="ANZ-2", limit=2)
    assert (second.users, second.count, second.more) == (["ANZ-3", "ANZ-4"], 4, True)
    last = online.app_online_page("ANZ", after="ANZ-4", limit=2)
    assert (last.users, last.more) == (["ANZ-5"], False)
