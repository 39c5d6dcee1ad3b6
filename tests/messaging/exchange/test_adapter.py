"""The TCP adapter in-process (real sockets, an in-memory stand-in for the database commit)."""

from __future__ import annotations

import asyncio
import socket

from messaging.exchange.adapter import Exchange, servers_start
from messaging.exchange.engine import Engine


class Harness:
    def __init__(self, **kw) -> None:
        self.commits: list[dict] = []
        self.keep: list = []
        self.engine = Engine(gap_report_seconds=kw.pop("gap_report_seconds", 5),
                             gap_timeout_seconds=kw.pop("gap_timeout_seconds", 30))
        self.ex = Exchange(app_id=1, engine=self.engine, commit=lambda **c: self.commits.append(c),
                           commit_ms=kw.pop("commit_ms", 5), **kw)

    async def __aenter__(self):
        self.ex.start()
        self.servers = await servers_start(self.ex, host="127.0.0.1", event_port=0, client_port=0)
        self.event_port = self.servers[0].sockets[0].getsockname()[1]
        self.client_port = self.servers[1].sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        for server in self.servers:
            server.close()
        await self.ex.close()

    async def source(self):
        writer = (await asyncio.open_connection("127.0.0.1", self.event_port))[1]
        self.keep.append(writer)
        return writer

    async def client(self, uid: int):
        reader, writer = await asyncio.open_connection("127.0.0.1", self.client_port)
        self.keep.append(writer)  # a dropped StreamWriter closes its socket when collected
        writer.write(f"{uid}\r\n".encode())
        await writer.drain()
        await self.until(lambda: uid in self.ex.clients)
        return reader, writer

    async def until(self, cond, timeout: float = 5.0):
        for _ in range(int(timeout / 0.01)):
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not met in time")


async def read_lines(reader, n: int) -> list[bytes]:
    return [await asyncio.wait_for(reader.readline(), 5) for _ in range(n)]


def test_clients_get_their_lines_byte_for_byte_in_sequence_order():
    async def scenario():
        async with Harness() as h:
            alice, _ = await h.client(1)
            bob, _ = await h.client(2)
            src = await h.source()
            # Shuffled, with CRLF and LF line ends mixed, split mid-line across writes.
            src.write(b"3|S|2\n2|F|1|2\r\n5|P|2|1\n4|B\r")
            await asyncio.sleep(0.02)
            src.write(b"\n1|F|2|1\n6|U|1|2\n7|S|2\n")
            await src.drain()
            assert await read_lines(alice, 4) == [b"1|F|2|1\n", b"3|S|2\n", b"4|B\r\n", b"5|P|2|1\n"]
            assert await read_lines(bob, 2) == [b"2|F|1|2\r\n", b"4|B\r\n"]
            await h.until(lambda: h.engine.applied_seq == 7)
            assert h.commits[-1]["applied_seq"] == 7
    asyncio.run(scenario())


def test_malformed_lines_are_counted_and_skipped_without_disturbing_the_stream():
    async def scenario():
        async with Harness() as h:
            alice, _ = await h.client(1)
            src = await h.source()
            src.write(b"1|B\nnonsense\n2|X|1|2\n2|P|9|1\n")
            assert await read_lines(alice, 2) == [b"1|B\n", b"2|P|9|1\n"]
            await h.until(lambda: sum(c["malformed"] for c in h.commits) == 2)
    asyncio.run(scenario())


def test_a_client_connecting_mid_stream_gets_what_follows():
    async def scenario():
        async with Harness() as h:
            src = await h.source()
            src.write(b"1|B\n2|P|1|5\n")
            await h.until(lambda: h.engine.applied_seq == 2)
            late, _ = await h.client(5)
            src.write(b"3|P|1|5\n4|B\n")
            assert await read_lines(late, 2) == [b"3|P|1|5\n", b"4|B\n"]
    asyncio.run(scenario())


def test_a_source_that_reconnects_continues_at_the_next_number_and_held_events_are_kept():
    async def scenario():
        async with Harness() as h:
            alice, _ = await h.client(1)
            src = await h.source()
            src.write(b"1|B\n3|B\n")
            await src.drain()
            src.close()
            await h.until(lambda: not h.ex.sources)
            again = await h.source()
            again.write(b"2|B\n4|B\n")
            assert await read_lines(alice, 4) == [b"1|B\n", b"2|B\n", b"3|B\n", b"4|B\n"]
    asyncio.run(scenario())


def test_a_second_connection_with_the_same_user_id_replaces_the_first():
    async def scenario():
        async with Harness() as h:
            first, _ = await h.client(7)
            second, _ = await h.client(7)
            assert await asyncio.wait_for(first.read(), 5) == b""  # closed by the server
            src = await h.source()
            src.write(b"1|P|1|7\n")
            assert await read_lines(second, 1) == [b"1|P|1|7\n"]
            assert list(h.ex.clients) == [7]
    asyncio.run(scenario())


def test_a_slow_client_is_disconnected_without_blocking_the_others():
    async def scenario():
        async with Harness(client_buffer_bytes=64 * 1024, commit_events=1000) as h:
            # A plain socket with a small kernel buffer that nobody reads.
            slow = socket.socket()
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.connect(("127.0.0.1", h.client_port))
            slow.sendall(b"1\n")
            await h.until(lambda: 1 in h.ex.clients)
            fast, _ = await h.client(2)
            src = await h.source()
            # More than the kernel's buffers can absorb for the slow one (tcp_wmem's max is 4 MiB).
            n = 700_000
            payload = b"".join(b"%d|B\n" % seq for seq in range(1, n + 1))
            src.write(payload)
            got = b""
            while len(got) < len(payload):
                got += await asyncio.wait_for(fast.read(1 << 20), 10)
            assert got == payload
            assert h.ex.slow_disconnects == 1 and 1 not in h.ex.clients
            slow.close()
    asyncio.run(scenario())


def test_a_gap_that_never_fills_is_given_up_after_the_timeout():
    async def scenario():
        async with Harness(gap_report_seconds=0.1, gap_timeout_seconds=0.6) as h:
            alice, _ = await h.client(1)
            src = await h.source()
            src.write(b"1|B\n3|B\n")
            assert await read_lines(alice, 1) == [b"1|B\n"]
            await h.until(lambda: any(c["gap_seq"] == 2 for c in h.commits))  # reported first
            assert await read_lines(alice, 1) == [b"3|B\n"]
            assert sum(c["skipped"] for c in h.commits) == 1 and h.commits[-1]["gap_seq"] is None
    asyncio.run(scenario())


def test_ws_users_get_each_committed_batch_after_its_commit():
    async def scenario():
        seen = []
        h = Harness()
        h.ex.ws_fn = lambda app_id, events: seen.append((len(h.commits), events))
        async with h:
            src = await h.source()
            src.write(b"2|F|1|2\n1|S|2\n")
            await h.until(lambda: seen)
        assert seen == [(1, [(1, "S", 2, None), (2, "F", 1, 2)])]
    asyncio.run(scenario())


def test_a_failed_commit_is_retried_with_its_events_and_nothing_is_lost_or_delivered_early():
    async def scenario():
        async with Harness() as h:
            failures = {"left": 2}

            def flaky(**commit):
                if failures["left"]:
                    failures["left"] -= 1
                    raise ConnectionError("the database went away")  # as psycopg's OperationalError would
                h.commits.append(commit)

            h.ex.commit_fn = flaky
            alice, _ = await h.client(1)
            src = await h.source()
            src.write(b"1|F|2|1\n2|B\n")
            await src.drain()
            await asyncio.sleep(0.1)
            assert h.commits == []  # not committed yet: nothing went out
            src.write(b"3|P|2|1\n")
            assert await read_lines(alice, 3) == [b"1|F|2|1\n", b"2|B\n", b"3|P|2|1\n"]
            await h.until(lambda: h.commits and h.commits[-1]["applied_seq"] == 3)
            assert h.ex.commit_failures == 0
            assert (2, 1) in [pair for c in h.commits for pair in c["adds"]]  # the follow of the failed batch
    asyncio.run(scenario())


def test_a_number_far_ahead_is_refused_and_the_exchange_goes_on():
    async def scenario():
        async with Harness(max_ahead=1000) as h:
            alice, _ = await h.client(1)
            src = await h.source()
            src.write(b"1|B\n9223372036854775806|B\n2|B\n")
            assert await read_lines(alice, 2) == [b"1|B\n", b"2|B\n"]
            await h.until(lambda: sum(c["malformed"] for c in h.commits) == 1)
            assert h.engine.held == {} and h.engine.gap_seq is None
    asyncio.run(scenario())


def test_tcp_lines_are_held_to_the_rest_intakes_rules():
    async def scenario():
        async with Harness() as h:
            alice, _ = await h.client(1)
            src = await h.source()
            # beyond a bigint, a sign, an underscore, a space, a non-ASCII digit: all refused
            src.write(b"1|P|99999999999999999999|1\n1|P|+2|1\n1|P|2_0|1\n1| B\n1|P|\xd9\xa1|1\n1|B\n")
            assert await read_lines(alice, 1) == [b"1|B\n"]
            await h.until(lambda: sum(c["malformed"] for c in h.commits) == 5)
    asyncio.run(scenario())


def test_with_a_shared_secret_a_source_is_heard_only_after_sending_it_first():
    async def scenario():
        async with Harness(source_secret=b"s3cret-of-the-source") as h:
            alice, _ = await h.client(1)
            wrong = await h.source()
            wrong.write(b"guess\n1|B\n")
            await wrong.drain()
            await h.until(lambda: not h.ex.sources)  # closed at its first line
            right = await h.source()
            right.write(b"s3cret-of-the-source\r\n1|B\n2|B\n")
            assert await read_lines(alice, 2) == [b"1|B\n", b"2|B\n"]
    asyncio.run(scenario())


def test_a_source_that_never_ends_its_line_does_not_grow_the_process():
    async def scenario():
        async with Harness() as h:
            alice, _ = await h.client(1)
            src = await h.source()
            for _ in range(20):
                src.write(b"7" * 1000)
            src.write(b"\n1|B\n")
            assert await read_lines(alice, 1) == [b"1|B\n"]
            assert all(len(s.buffer) <= 4096 for s in h.ex.sources)
            await h.until(lambda: sum(c["malformed"] for c in h.commits) >= 1)
    asyncio.run(scenario())
