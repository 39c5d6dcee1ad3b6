"""The baseline of bench/exchange.py: the event broker the way a user would write it in one asyncio
process, with no persistence. Asyncio streams and readline, a dict of writers, a dict of held events
(for correctness only), one write per notification, no flow control.

    python -m bench.exchange_naive --event-port 9090 --client-port 9099
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections import defaultdict


async def serve(host: str, event_port: int, client_port: int) -> None:
    writers: dict[int, asyncio.StreamWriter] = {}
    followers: dict[int, set[int]] = defaultdict(set)
    held: dict[int, tuple[list[bytes], bytes]] = {}
    next_seq = 1

    def send(uid: int, raw: bytes) -> None:
        writer = writers.get(uid)
        if writer is not None:
            writer.write(raw)

    def apply(fields: list[bytes], raw: bytes) -> None:
        kind = fields[1]
        if kind == b"F":
            followers[int(fields[3])].add(int(fields[2]))
            send(int(fields[3]), raw)
        elif kind == b"U":
            followers[int(fields[3])].discard(int(fields[2]))
        elif kind == b"B":
            for writer in list(writers.values()):
                writer.write(raw)
        elif kind == b"P":
            send(int(fields[3]), raw)
        elif kind == b"S":
            for uid in list(followers[int(fields[2])]):
                send(uid, raw)

    async def on_source(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal next_seq
        while raw := await reader.readline():
            fields = raw.rstrip(b"\r\n").split(b"|")
            try:
                seq = int(fields[0])
            except ValueError:
                continue
            if seq < next_seq:
                continue
            held[seq] = (fields, raw)
            while next_seq in held:
                apply(*held.pop(next_seq))
                next_seq += 1
        writer.close()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = int(await reader.readline())
        writers[uid] = writer
        try:
            await reader.read()
        finally:
            if writers.get(uid) is writer:
                del writers[uid]

    source = await asyncio.start_server(on_source, host, event_port)
    clients = await asyncio.start_server(on_client, host, client_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("naive ready", flush=True)
    await stop.wait()
    source.close()
    clients.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--event-port", type=int, default=9090)
    parser.add_argument("--client-port", type=int, default=9099)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.event_port, args.client_port))


if __name__ == "__main__":
    main()
