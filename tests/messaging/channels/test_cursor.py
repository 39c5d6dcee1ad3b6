"""A channel reader's cursor at the seam between history and live publishes (real Postgres)."""

from __future__ import annotations

import asyncio

import pytest

from messaging.channels.cursor import ChannelCursor
from messaging.channels.services import channel_publish
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


class HubWithAPublisherRightAfterTheSettle:
    """The moment a join has settled, publishers count the reader: one publishes at once, and its
    live event reaches the reader only after the join returns."""

    def __init__(self, app_id: int):
        self.app_id = app_id
        self.live: list[tuple[str, int, str]] = []

    async def join(self, key, reader) -> None:
        pass

    async def settle(self, key) -> None:
        from foundation.asyncdb import run_db

        offset = await run_db(channel_publish, app_id=self.app_id, channel=key[1], content="counted you")
        self.live.append((key[1], offset, "counted you"))

    async def leave(self, key, reader) -> None:
        pass


async def _read_across_the_seam(app_id: int) -> list[tuple[str, int, str]]:
    written: list[tuple[str, int, str]] = []

    async def write(channel: str, offset: int, content: str) -> bool:
        written.append((channel, offset, content))
        return True

    hub = HubWithAPublisherRightAfterTheSettle(app_id)
    cursor = ChannelCursor(app_id=app_id, hub=hub, reader=object(), write=write, transport="ws")
    await cursor.join("news")
    for channel, offset, content in hub.live:
        await cursor.publish(channel, offset, content)
    return written


def test_a_publish_that_counted_a_joining_reader_reaches_it_exactly_once():
    app = make_app()
    channel_publish(app_id=app.pk, channel="news", content="before the join")
    written = asyncio.run(_read_across_the_seam(app.pk))
    assert written == [("news", 2, "counted you")]


class QuietHub:
    async def join(self, key, reader) -> None:
        pass

    async def settle(self, key) -> None:
        pass

    async def leave(self, key, reader) -> None:
        pass


async def _replay(app_id: int, since: int) -> tuple[list[int], list[tuple]]:
    written: list[int] = []
    told: list[tuple] = []

    async def write(channel: str, offset: int, content: str) -> bool:
        written.append(offset)
        return True

    async def missed(notice: dict) -> None:
        told.append((notice["channel"], notice["missed"], notice["offset"]))

    cursor = ChannelCursor(app_id=app_id, hub=QuietHub(), reader=object(), write=write, transport="sse",
                           missed=missed)
    await cursor.join("news", since=since)
    return written, told


def _history(count: int) -> int:
    app = make_app()
    for i in range(count):
        channel_publish(app_id=app.pk, channel="news", content=f"m-{i + 1}")
    return app.pk


def test_a_replay_from_far_back_sends_the_newest_messages_after_telling_what_was_skipped(settings):
    settings.STREAM_REPLAY_MAX = 10
    written, told = asyncio.run(_replay(_history(35), since=0))
    assert written == list(range(26, 36))
    assert told == [("news", 25, 25)]


def test_a_replay_within_the_bound_is_whole_and_tells_nothing(settings):
    settings.STREAM_REPLAY_MAX = 10
    written, told = asyncio.run(_replay(_history(35), since=28))
    assert written == list(range(29, 36)) and told == []

