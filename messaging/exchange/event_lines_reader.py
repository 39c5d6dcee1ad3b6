"""The engine's reader of the REST intake: the app's Redis stream (streams.intake_stream_key), whose
entries carry event lines (field `lines`, joined by "\\n"), fed into the same sequence as the TCP source.

Position: the reader starts at the stream's beginning and, once the events it fed are committed,
trims the stream up to the last committed entry (XTRIM MINID: that entry itself stays and is read
again after a restart, its events then duplicates). Events still held behind a gap when the engine
stops are lost with the process, as they are for the TCP source: the REST intake is idempotent by
sequence number, so a caller may send them again.
"""

from __future__ import annotations

import asyncio
import logging

from foundation.transport.redis_clients import async_client
from messaging.exchange.adapter import Exchange
from messaging.exchange.streams import INTAKE_READER_TTL, intake_reader_key, intake_stream_key

log = logging.getLogger(__name__)


def entry_lines(fields: dict) -> list[bytes]:
    lines: list[bytes] = []
    for value in fields.values():
        raw = value if isinstance(value, bytes) else str(value).encode()
        lines.extend(line + b"\n" for line in raw.replace(b"\r\n", b"\n").split(b"\n") if line)
    return lines


async def intake_loop(exchange: Exchange, *, block_ms: int = 1000) -> None:
    client = async_client()
    key, reader = intake_stream_key(exchange.app_id), intake_reader_key(exchange.app_id)
    last: bytes | str = "0-0"
    trimmed: bytes | None = None
    while True:
        try:
            committed = exchange.intake_committed
            if committed is not None and committed != trimmed:
                await client.xtrim(key, minid=committed, approximate=False)
                trimmed = committed
            await client.set(reader, b"1", ex=INTAKE_READER_TTL)  # the REST intake takes more while this is fresh
            answer = await client.xread({key: last}, count=1000, block=block_ms)
        except asyncio.CancelledError:
            raise
        except Exception:  # Redis down: the TCP path goes on; try again shortly
            log.warning("exchange %s: reading the intake stream failed; retrying", exchange.label, exc_info=True)
            await asyncio.sleep(1.0)
            continue
        for _key, entries in answer or []:
            for entry_id, fields in entries:
                last = entry_id
                exchange.lines_received(entry_lines(fields))
                exchange.intake_consumed = entry_id
