"""The node's channel hub tells the cluster when a channel gets its first reader and loses its
last one (the "occupied" / "vacated" webhooks), whatever the heartbeat does meanwhile. Real Redis."""

from __future__ import annotations

import asyncio

from messaging.channels import registry
from messaging.channels.hub import ChannelHub


class Reader:
    def channel_event(self, key, offset, content) -> None:
        pass

    def channel_resync(self, key) -> None:
        pass


async def _occupancy_around_a_heartbeat(key: tuple[int, str]) -> tuple[list, int]:
    told: list[bool] = []

    async def hook(app_id: int, channel: str, occupied: bool) -> None:
        told.append(occupied)

    hub = ChannelHub("hub-test-node", on_occupancy=hook)
    await hub.start()
    reader = Reader()
    try:
        await hub.join(key, reader)
        await hub.reassert()  # the heartbeat lands before the coalesced count update
        await asyncio.sleep(0.3)
        readers = await registry.readers_count_async(*key)
        await hub.leave(key, reader)
        await hub.reassert()
        await asyncio.sleep(0.3)
        return told, readers
    finally:
        for task in hub._tasks:
            task.cancel()
        await hub._pubsub.aclose()


def test_a_heartbeat_between_a_first_join_and_its_count_update_does_not_hide_the_occupancy():
    told, readers = asyncio.run(_occupancy_around_a_heartbeat((987654, "news.hub-test")))
    assert readers == 1
    assert told == [True, False]


async def _count_right_after_a_settled_join(key: tuple[int, str]) -> int:
    hub = ChannelHub("hub-test-node-2")
    await hub.start()
    reader = Reader()
    try:
        await hub.join(key, reader)
        await hub.settle(key)
        counted = await registry.readers_count_async(*key)  # no wait for the coalesced flush
        await hub.leave(key, reader)
        return counted
    finally:
        for task in hub._tasks:
            task.cancel()
        await hub._pubsub.aclose()


def test_a_reader_told_it_is_subscribed_is_already_counted_by_publishers():
    assert asyncio.run(_count_right_after_a_settled_join((987655, "news.hub-test"))) == 1


async def _registry_after_the_last_reader_leaves(key: tuple[int, str]) -> tuple[bool, bool, bool]:
    from foundation.transport.redis_clients import async_client
    from presence.cache import node_registrations_key

    hub = ChannelHub("hub-test-node-3")
    await hub.start()
    client, entry, listing = async_client(), registry.registry_key(*key), node_registrations_key("hub-test-node-3")
    try:
        await hub.join(key, Reader())
        await hub.settle(key)
        listed_while_read = bool(await client.sismember(listing, entry))
        reader = next(iter(hub.readers[key]))
        await hub.leave(key, reader)
        await asyncio.sleep(0.3)  # the coalesced count update
        return listed_while_read, bool(await client.exists(entry)), bool(await client.sismember(listing, entry))
    finally:
        for task in hub._tasks:
            task.cancel()
        await hub._pubsub.aclose()


def test_a_channel_leaves_nothing_in_the_registry_once_its_last_reader_has_gone():
    listed_while_read, entry_left, listing_left = asyncio.run(
        _registry_after_the_last_reader_leaves((987656, "news.made-up-by-a-client")))
    assert listed_while_read
    assert not entry_left and not listing_left
