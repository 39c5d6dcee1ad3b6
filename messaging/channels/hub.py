"""The node-local hub: one Redis pub/sub connection per web node fans channel publishes out to
every reader on the node (/ws connections, SSE streams, push-compatible stream sockets).

A reader joins a channel through the hub; the first local reader of a channel makes the node
subscribe to its Redis channel, and `join` returns only once Redis has confirmed that subscription,
so a reader that then reads the channel's head or history misses nothing published after. Each
publish arrives once per node and is handed to each local reader without another round trip; a
reader takes it without blocking (it queues it, or notes that it fell behind and repairs from the
history). If the pub/sub connection breaks, the hub reconnects, subscribes again, and tells every
reader to repair from the history what it may have missed.

How many local readers each channel has is written to the cluster registry
(messaging.channels.registry) in the background, coalesced: a thousand joins are one update. A
reader joining through a cursor settles its channel's count before it is told it is subscribed,
so a publish anywhere counts it in `subscribers`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from foundation.backoff import Backoff
from foundation.transport.redis_clients import async_client, pubsub_namespace
from messaging.channels import registry

log = logging.getLogger(__name__)
ChannelKey = tuple[int, str]  # (app id, channel name)
# The wait before each try to subscribe again after the hub's Redis connection broke: 0.2 s, doubling
# with each failed try, at most 5 s.
RECONNECT_BACKOFF = Backoff(base=0.2, cap=5.0, jitter=0.0)


class ChannelReader(Protocol):
    def channel_event(self, key: ChannelKey, offset: int, content: str) -> None:
        """A publish on a joined channel; must not block."""

    def channel_resync(self, key: ChannelKey) -> None:
        """Publishes may have been missed: repair from the history; must not block."""


OccupancyHook = Callable[[int, str, bool], Awaitable[None]]


class ChannelHub:
    def __init__(self, node_id: str, on_occupancy: OccupancyHook | None = None) -> None:
        self.node_id = node_id
        self.readers: dict[ChannelKey, set[ChannelReader]] = {}
        self.on_occupancy = on_occupancy
        self._pubsub = None
        self._subscribed: set[ChannelKey] = set()
        self._confirmations: dict[str, list[asyncio.Future]] = {}
        self._dirty: set[ChannelKey] = set()
        self._flushing: set[ChannelKey] = set()  # taken from _dirty, registry not written yet
        self._flush_wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()  # one subscribe/unsubscribe at a time

    @property
    def control_channel(self) -> str:
        return f"{pubsub_namespace()}sb:hub:{self.node_id}"

    async def start(self) -> None:
        self._pubsub = async_client().pubsub()
        await self._pubsub.subscribe(self.control_channel)
        self._tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._flush_counts())]

    # --- joining and leaving -------------------------------------------------------------------

    async def join(self, key: ChannelKey, reader: ChannelReader) -> None:
        self.readers.setdefault(key, set()).add(reader)
        self._mark(key)
        if key not in self._subscribed:
            async with self._lock:
                if key not in self._subscribed and self.readers.get(key):
                    await self._subscribe(key)

    async def leave(self, key: ChannelKey, reader: ChannelReader) -> None:
        readers = self.readers.get(key)
        if not readers or reader not in readers:
            return
        readers.discard(reader)
        self._mark(key)
        if not readers:
            del self.readers[key]
            async with self._lock:
                if key in self._subscribed and key not in self.readers:
                    self._subscribed.discard(key)
                    try:
                        await self._pubsub.unsubscribe(registry.fanout_key(*key))
                    except Exception:
                        log.exception("unsubscribing %s failed", key)  # a reconnect drops it anyway

    def reader_count(self, key: ChannelKey) -> int:
        return len(self.readers.get(key, ()))

    async def _subscribe(self, key: ChannelKey) -> None:
        name = registry.fanout_key(*key)
        confirmed = asyncio.get_running_loop().create_future()
        self._confirmations.setdefault(name, []).append(confirmed)
        await self._pubsub.subscribe(name)
        await asyncio.wait_for(confirmed, 10)
        self._subscribed.add(key)

    # --- reading -------------------------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=False, timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("channel hub lost its Redis connection (%r); reconnecting", exc)
                await self._reconnect()
                continue
            if message is not None:
                self._handle(message)

    def _handle(self, message: dict) -> None:
        name = message["channel"].decode() if isinstance(message["channel"], bytes) else message["channel"]
        if message["type"] == "subscribe":
            for future in self._confirmations.pop(name, []):
                if not future.done():
                    future.set_result(None)
            return
        key = registry.fanout_parse(name) if message["type"] == "message" else None
        if key is None:
            return
        try:
            payload = json.loads(message["data"])
            if "s" in payload:  # a signal, not a publish (messaging.gateway.pusher.presence.channel_signal)
                self._signal(key, payload["s"])
                return
            offset, content = int(payload["o"]), payload["c"]
        except (ValueError, KeyError, TypeError):
            log.warning("malformed publish on %s", name)
            return
        for reader in list(self.readers.get(key, ())):
            reader.channel_event(key, offset, content)

    def _signal(self, key: ChannelKey, data: object) -> None:
        """Something every reader of the channel that listens for signals is told, outside the
        channel's history (a presence channel's member came or went): to readers with `channel_signal`."""
        for reader in list(self.readers.get(key, ())):
            signal = getattr(reader, "channel_signal", None)
            if signal is not None:
                signal(key, data)

    async def _reconnect(self) -> None:
        tries = 0
        while True:
            tries += 1
            await asyncio.sleep(RECONNECT_BACKOFF.seconds(tries))
            try:
                try:
                    await self._pubsub.aclose()
                except Exception:
                    pass
                self._pubsub = async_client().pubsub()
                await self._pubsub.subscribe(self.control_channel,
                                             *(registry.fanout_key(*k) for k in self.readers))
                self._subscribed = set(self.readers)
                for futures in self._confirmations.values():
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
                self._confirmations.clear()
                break
            except Exception as exc:
                log.warning("channel hub reconnect failed (%r)", exc)
        for key, readers in list(self.readers.items()):
            self._mark(key)
            for reader in list(readers):
                reader.channel_resync(key)

    # --- the cluster registry ------------------------------------------------------------------

    def _mark(self, key: ChannelKey) -> None:
        self._dirty.add(key)
        self._flush_wake.set()

    async def _flush_counts(self) -> None:
        while True:
            await self._flush_wake.wait()
            self._flush_wake.clear()
            await asyncio.sleep(0.05)  # coalesce a burst of joins
            dirty, self._dirty = self._dirty, set()
            self._flushing |= dirty
            for key in dirty:
                await self._write_count(key)

    async def settle(self, key: ChannelKey) -> None:
        """Write the channel's count now if it is still waiting for the coalesced flush: a reader
        told it is subscribed is then counted by a publish anywhere (`subscribers`)."""
        if key in self._dirty:
            self._dirty.discard(key)
            self._flushing.add(key)
            await self._write_count(key)

    async def _write_count(self, key: ChannelKey) -> None:
        try:
            before, after = await registry.readers_set(app_id=key[0], channel=key[1], node_id=self.node_id,
                                                       count=self.reader_count(key))
        except Exception:
            log.exception("updating the reader count of %s failed", key)
            self._dirty.add(key)  # the next flush (or heartbeat) tries again
            return
        finally:
            self._flushing.discard(key)
        if self.on_occupancy is not None and (before == 0) != (after == 0):
            try:
                await self.on_occupancy(key[0], key[1], after > 0)
            except Exception:
                log.exception("occupancy hook for %s failed", key)

    async def reassert(self) -> None:
        """The heartbeat's part: the registry holds this node's counts (heals a restarted Redis).

        Counts still on their way to the registry are left to the flush: written here first, they
        would hide a channel's first reader from the flush, and "occupied" would never be told."""
        pending = self._dirty | self._flushing
        await registry.readers_reassert(
            node_id=self.node_id,
            counts={key: len(readers) for key, readers in self.readers.items() if key not in pending})
