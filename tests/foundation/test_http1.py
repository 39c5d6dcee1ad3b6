"""The outgoing calls' HTTP/1.1 client (foundation.http1), against a real server on a socket that
answers the way the test asks: kept-alive connections reused, a connection the server dropped while
idle replaced without the caller noticing, chunked answers, answers cut off at the cap, and broken
answers refused with a reason."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import pytest

from foundation.http1 import Http1Pool, HttpError


class Server:
    """A TCP server on 127.0.0.1 whose `answer(request_bytes)` writes each answer (None: close at once)."""

    def __init__(self, answer: Callable[[bytes], bytes | None], *, close_after: bool = False):
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.answer(request)
                if answer is None:
                    writer.transport.abort()
                    return
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def ok(body: bytes = b"{}") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _connect(host: str, port: int, tls: ssl.SSLContext | None):
    return await asyncio.open_connection(host, port, ssl=tls)


def pool(**kw) -> Http1Pool:
    return Http1Pool(_connect, max_connections=kw.pop("max_connections", 4), max_keepalive=kw.pop("max_keepalive", 4),
                     ssl_context=ssl.create_default_context, user_agent="test-agent", **kw)


async def post(p: Http1Pool, port: int, body: bytes = b'{"a": 1}', max_bytes: int = 1 << 20):
    return await p.request("POST", f"http://127.0.0.1:{port}/hook?x=1", content=body,
                           headers={"Content-Type": "application/json"}, max_bytes=max_bytes)


def test_calls_in_a_row_share_one_connection_and_send_the_request_whole():
    async def main():
        async with Server(lambda req: ok(b'{"n": 1}')) as server:
            p = pool()
            answers = [await post(p, server.port) for _ in range(5)]
            return server, answers

    server, answers = asyncio.run(main())
    assert [(a.status, a.body, a.complete) for a in answers] == [(200, b'{"n": 1}', True)] * 5
    assert answers[0].headers["content-type"] == "application/json"
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}".encode() in first.lower()
    assert b"user-agent: test-agent" in first.lower() and first.endswith(b'\r\n\r\n{"a": 1}')


def test_a_connection_the_server_dropped_while_idle_is_replaced_without_the_caller_noticing():
    async def main():
        async with Server(lambda req: ok()) as server:
            p = pool()
            await post(p, server.port)
            for writer in server.writers:  # the server times the idle connection out
                writer.transport.abort()
            await asyncio.sleep(0.05)
            second = await post(p, server.port)
            return server, second

    server, second = asyncio.run(main())
    assert second.status == 200 and server.connections == 2 and len(server.requests) == 2


def test_a_reused_connection_closed_as_the_request_left_is_tried_once_more_on_a_new_one():
    calls = []

    def answer(request: bytes) -> bytes | None:
        calls.append(request)
        return ok() if len(calls) != 2 else None  # the second request: the server drops the connection unanswered

    async def main():
        async with Server(answer) as server:
            p = pool()
            await post(p, server.port)
            return server, await post(p, server.port)

    server, again = asyncio.run(main())
    assert again.status == 200 and server.connections == 2 and len(calls) == 3


def test_a_new_connection_closed_before_an_answer_is_an_error_not_a_retry():
    async def main():
        async with Server(lambda req: None) as server:
            with pytest.raises(HttpError, match="closed before an answer"):
                await post(pool(), server.port)
            return server

    server = asyncio.run(main())
    assert server.connections == 1 and len(server.requests) == 1


def test_a_chunked_answer_is_read_whole_and_its_connection_kept():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

    async def main():
        async with Server(lambda req: chunked) as server:
            p = pool()
            answers = [await post(p, server.port), await post(p, server.port)]
            return server, answers

    server, answers = asyncio.run(main())
    assert [a.body for a in answers] == [b"hello world"] * 2 and server.connections == 1


def test_an_answer_over_the_cap_is_cut_there_and_its_connection_not_used_again():
    async def main():
        async with Server(lambda req: ok(b"x" * 100_000)) as server:
            p = pool()
            cut = await post(p, server.port, max_bytes=1000)
            whole = await post(p, server.port)
            return server, cut, whole

    server, cut, whole = asyncio.run(main())
    assert (cut.status, len(cut.body), cut.complete) == (200, 1000, False)
    assert (len(whole.body), whole.complete) == (100_000, True)
    assert server.connections == 2


def test_a_server_that_says_close_gets_a_new_connection_for_the_next_call():
    async def main():
        answer = b"HTTP/1.1 202 Accepted\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        async with Server(lambda req: answer, close_after=True) as server:
            p = pool()
            answers = [await post(p, server.port) for _ in range(3)]
            return server, answers

    server, answers = asyncio.run(main())
    assert [a.status for a in answers] == [202] * 3 and server.connections == 3


def test_a_malformed_answer_is_refused_with_a_reason():
    async def main():
        async with Server(lambda req: b"NOT HTTP AT ALL\r\n\r\n") as server:
            with pytest.raises(HttpError, match="malformed answer"):
                await post(pool(), server.port)

    asyncio.run(main())


def test_a_redirect_is_answered_not_followed():
    async def main():
        answer = b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n"
        async with Server(lambda req: answer) as server:
            return server, await post(pool(), server.port)

    server, answer = asyncio.run(main())
    assert answer.status == 302 and answer.headers["location"] == "http://169.254.169.254/"
    assert len(server.requests) == 1


def test_callers_beyond_the_connection_cap_wait_for_a_connection():
    async def main():
        async with Server(lambda req: ok()) as server:
            p = pool(max_connections=2, max_keepalive=2)
            answers = await asyncio.gather(*(post(p, server.port) for _ in range(10)))
            return server, answers

    server, answers = asyncio.run(main())
    assert [a.status for a in answers] == [200] * 10 and server.connections <= 2


def test_a_header_value_that_would_split_the_request_is_not_sent():
    async def main():
        async with Server(lambda req: ok()) as server:
            p = pool()
            with pytest.raises(HttpError, match="not sent"):
                await p.request("POST", f"http://127.0.0.1:{server.port}/", content=b"{}",
                                headers={"X-Evil": "a\r\nInjected: yes"}, max_bytes=100)
            return server

    server = asyncio.run(main())
    assert server.requests == []
