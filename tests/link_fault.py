"""A broken link between two domains, for ring tests: an HTTP proxy in front of one domain's internal
endpoints that drops the calls of the callers it is told to (by their `Switchboard-Domain` header)
and passes every other call through untouched, as a network fault between two sites would.

    with LinkFault(upstream_port=ring.plan(3).port) as fault:
        # point domain-03's call URL at fault.url (the meta), then:
        fault.drop_from("domain-02")      # 02 -> 03 fails (connection closed unanswered); 01, 04 -> 03 work
"""

from __future__ import annotations

import asyncio
import threading

from foundation.signed_calls import DOMAIN_HEADER
from tests.processes import free_port

HEAD_LIMIT = 64 * 1024


class LinkFault:
    def __init__(self, *, upstream_port: int, host: str = "127.0.0.1"):
        self.host, self.upstream_port = host, upstream_port
        self.port = free_port()
        self.dropping: set[str] = set()
        self.dropped = 0
        self.passed = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-fault", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[tuple[str | None, asyncio.StreamWriter]] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def drop_from(self, *callers: str) -> None:
        """Calls from `callers` fail from now on, also on connections they keep open."""
        self.dropping = set(callers)

        def cut():
            for caller, writer in list(self._open):
                if caller in self.dropping:
                    writer.transport.abort()
        self._loop.call_soon_threadsafe(cut)

    def heal(self) -> None:
        self.dropping = set()

    def __enter__(self) -> LinkFault:
        self._thread.start()
        assert self._ready.wait(10), "the link fault proxy did not start"
        return self

    def __exit__(self, *exc) -> None:
        async def close():
            self._server.close()
            for _, writer in list(self._open):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, self.host, self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        caller = _header(head, DOMAIN_HEADER)
        if caller in self.dropping:
            self.dropped += 1
            writer.transport.abort()  # the connection reset, nothing answered
            return
        self.passed += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        up_writer.write(head)
        entry = (caller, writer)
        self._open.add(entry)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)
        finally:
            self._open.discard(entry)


def _header(head: bytes, name: str) -> str | None:
    wanted = name.lower().encode()
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == wanted:
            return value.strip().decode(errors="replace")
    return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
