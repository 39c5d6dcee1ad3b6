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
        from messaging.asyncdb import run_db

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
