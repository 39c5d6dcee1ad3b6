"""What one connection has written of each channel it reads: every message once, in offset order.

Every reader (a /ws connection, an SSE stream, a push-compatible stream socket) owns a
`ChannelCursor` and calls it from its own event handling, one event at a time:

- `join(name, since)`: the hub subscription is confirmed before the head is read, so replaying the
  history up to the head and then taking live publishes leaves nothing between the two; the replay
  starts after `since`, or without it at the head as it was before subscribing. A replay holds at
  most STREAM_REPLAY_MAX messages, the newest: a `since` further back starts there instead, and the
  reader's `missed` is handed the notice first, `{"channel", "missed", "offset"}` (what it skipped,
  and after which offset the replay starts; every transport sends it as it is), so its client knows
  it has a gap;
- `publish(name, offset, content)`: a live publish from the hub. An offset already written is
  skipped; a jump (an earlier publish overtaken, or lost while Redis hiccupped) is filled from the
  history first;
- `repair()`: the reader fell behind (its queue overflowed) or the hub reconnected: catch every
  marked channel up from the history.

Writing goes through the reader's `write(channel, offset, content)`, which answers False when the
socket took nothing (closed, gone, or cut off as a slow reader): the cursor then stops where it was,
and queries no more history for a reader that has gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from django.conf import settings

from foundation.asyncdb import run_db
from messaging.channels.hub import ChannelHub, ChannelReader
from messaging.channels.services import channel_heads, channel_history
from messaging.core import metrics

CATCH_UP_BATCH = 500
Write = Callable[[str, int, str], Awaitable[bool]]
Missed = Callable[[dict], Awaitable[object]]  # the notice {channel, missed, offset} of a replay cut short


class ChannelCursor:
    def __init__(self, *, app_id: int, hub: ChannelHub, reader: ChannelReader, write: Write, transport: str,
                 missed: Missed | None = None):
        self.app_id = app_id
        self.hub = hub
        self.reader = reader
        self.write = write
        self.missed = missed
        self.transport = transport
        self.positions: dict[str, int] = {}  # channel -> last offset written
        self.needs_repair: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.positions

    def __len__(self) -> int:
        return len(self.positions)

    async def join(self, name: str, since: int | None = None) -> int:
        """Read `name` live (and replay after `since`); returns the offset written up to."""
        if name not in self.positions:
            # Without `since`, reading starts at the head as it was before the hub subscribed. Once
            # the hub has settled, a publisher counts this reader; what it publishes before the
            # head below is read lies at or under that head, and must still be written (by the
            # catch-up), not taken as already read.
            self.positions[name] = since if since is not None else await self._head(name)
            await self.hub.join((self.app_id, name), self.reader)
            await self.hub.settle((self.app_id, name))
        elif since is not None:
            self.positions[name] = since
        head = await self._head(name)
        self.positions[name] = min(self.positions[name], head)
        floor = head - settings.STREAM_REPLAY_MAX
        if self.positions[name] < floor:  # a bounded replay: the newest messages, and a notice of the gap
            skipped, self.positions[name] = floor - self.positions[name], floor
            metrics.STREAM_REPLAY_CUT.labels(self.transport).inc()
            if self.missed is not None:
                await self.missed({"channel": name, "missed": skipped, "offset": floor})
        await self._catch_up(name, upto=head)
        return self.positions.get(name, head)

    async def _head(self, name: str) -> int:
        return (await run_db(channel_heads, app_id=self.app_id, channels=[name]))[name]

    async def leave(self, name: str) -> None:
        if self.positions.pop(name, None) is not None:
            await self.hub.leave((self.app_id, name), self.reader)

    async def leave_all(self) -> None:
        for name in list(self.positions):
            await self.leave(name)

    async def publish(self, name: str, offset: int, content: str) -> None:
        last = self.positions.get(name)
        if last is not None and offset > last:
            if offset > last + 1:
                await self._catch_up(name, upto=offset - 1)  # an earlier publish is late or lost
            if self.positions.get(name, offset) < offset and await self.write(name, offset, content):
                self.positions[name] = offset
                metrics.CHANNEL_MESSAGES.labels(self.transport).inc()
        await self.repair()

    def mark(self, name: str) -> None:
        self.needs_repair.add(name)

    async def repair(self) -> None:
        while self.needs_repair:
            name = self.needs_repair.pop()
            if name in self.positions:
                await self._catch_up(name)

    async def _catch_up(self, name: str, upto: int | None = None) -> None:
        while name in self.positions:
            items = await run_db(channel_history, app_id=self.app_id, channel=name, after=self.positions[name],
                                 upto=upto, limit=CATCH_UP_BATCH)
            for item in items:
                if not await self.write(name, item.offset, item.content):
                    return
                self.positions[name] = item.offset
            metrics.CHANNEL_MESSAGES.labels(self.transport).inc(len(items))
            if len(items) < CATCH_UP_BATCH:
                if upto is not None and self.positions.get(name, upto) < upto:
                    self.positions[name] = upto  # the rest expired with the app's retention
                return
