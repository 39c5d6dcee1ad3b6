"""The follower-maze TCP adapter around the engine (`manage.py eventsource`), on asyncio protocols.

- Source (event port): bytes are split into lines by hand, many per read (never a readline per
  event); each line keeps its original bytes, line end included, and is what clients receive.
  Several sources may connect, one after the other or at once: they feed the same sequence, so a
  source that reconnects continues at the next number (held events are kept).
- Clients (client port): a user id and a line end, then the lines that concern them. A second
  connection with the same user id replaces the first, which is closed (the newest connection is
  the one a user is looking at). Each client's lines of a batch go out in one write; a client whose
  unsent bytes exceed EXCHANGE_CLIENT_BUFFER_BYTES when a batch comes is disconnected and counted.
- Group commit: applied events are committed (store.exchange_batch_commit, in one database thread)
  every EXCHANGE_COMMIT_EVENTS events or EXCHANGE_COMMIT_MS, and written to clients only after
  their commit (see engine.Batch). While a commit runs, the next batch accumulates; if it grows past
  four batches, sources are paused until the commit returns.
- The REST intake's Redis stream is read by `intake_loop` (intake.py) into the same sequence.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from foundation.backoff import Backoff
from messaging.exchange import metrics
from messaging.exchange.engine import Batch, Engine, line_parse

log = logging.getLogger(__name__)

CommitFn = Callable[..., None]  # store.exchange_batch_commit's signature
COMMIT_RETRY_SECONDS = 0.25  # the wait after a failed commit, doubling with each failure in a row...
COMMIT_RETRY_MAX_SECONDS = 5.0  # ...up to this
COMMIT_RETRY = Backoff(COMMIT_RETRY_SECONDS, COMMIT_RETRY_MAX_SECONDS, jitter=0.0)  # one adapter per process
WsFn = Callable[[int, list], None]  # called in the database thread after a commit with the batch's events


class Exchange:
    def __init__(self, *, app_id: int, engine: Engine, commit: CommitFn, commit_events: int = 20000,
                 commit_ms: float = 20.0, client_buffer_bytes: int = 16 << 20, ws: WsFn | None = None,
                 label: str = "", max_ahead: int = 1_000_000, source_secret: bytes | None = None) -> None:
        self.app_id = app_id
        self.engine = engine
        self.commit_fn = commit
        self.ws_fn = ws
        self.commit_events = max(1, commit_events)
        self.commit_seconds = commit_ms / 1000.0
        self.client_buffer_bytes = client_buffer_bytes
        self.max_ahead = max_ahead  # a sequence number further ahead of the last applied is refused
        self.source_secret = source_secret  # a source's first line, where set
        self.commit_failures = 0  # in a row: the retry waits longer each time
        self.label = label or str(app_id)
        self.clients: dict[int, ClientProtocol] = {}
        self.sources: set[SourceProtocol] = set()
        self.malformed = 0  # since the last commit
        self.malformed_total = 0
        self.slow_disconnects = 0
        self.intake_consumed: bytes | None = None  # the last Redis intake entry fed to the engine
        self.intake_committed: bytes | None = None  # ...and the last one whose events are committed
        self._last_malformed_log = 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exchange-db")
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._gap_dirty = False
        self._closing = False
        self._committer: asyncio.Task | None = None
        self._ticker: asyncio.Task | None = None

    # --- life cycle ---
    def start(self) -> None:
        self._committer = asyncio.create_task(self._commit_loop())
        self._ticker = asyncio.create_task(self._tick_loop())

    async def close(self) -> None:
        """Flush: sources closed, the last batch committed and delivered, then clients closed."""
        self._closing = True
        for source in list(self.sources):
            source.transport.close()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._committer is not None:
            self._wake.set()  # the committer finishes the commit it is in (never cut mid-way), then stops
            await self._committer
        await self.commit_once()
        for client in list(self.clients.values()):
            client.transport.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)  # a pending ws call
        self._executor.shutdown(wait=True)

    # --- intake ---
    def lines_received(self, lines: list[bytes]) -> None:
        parse, engine = line_parse, self.engine
        for raw in lines:
            event = parse(raw)
            if event is None:
                if raw.strip():
                    self._malformed(raw, "malformed")
                continue
            if event[0] > engine.applied_seq + self.max_ahead:
                # Held, it would open a gap that only the timeout closes, by skipping to it: every
                # later number would then be a duplicate, and the app's exchange over for good.
                self._malformed(raw, f"more than {self.max_ahead} ahead of the last applied ({engine.applied_seq})")
                continue
            engine.offer(event)
        self._kick()

    def _malformed(self, raw: bytes, why: str) -> None:
        self.malformed += 1
        self.malformed_total += 1
        metrics.MALFORMED.labels(self.label).inc()
        now = time.monotonic()
        if now - self._last_malformed_log >= 1.0:  # rate-limited: a broken source must not flood the log
            self._last_malformed_log = now
            log.warning("exchange %s: event line refused, %s (%s refused so far): %r", self.label, why,
                        self.malformed_total, raw[:200])

    def _kick(self) -> None:
        pending = self.engine.pending_count
        if pending >= self.commit_events:
            self._wake.set()
        elif (pending or self.malformed) and self._timer is None and not self._wake.is_set():
            self._timer = asyncio.get_running_loop().call_later(self.commit_seconds, self._wake.set)
        if pending > 4 * self.commit_events and not self._paused:
            self._paused = True
            for source in self.sources:
                source.transport.pause_reading()

    # --- commit and delivery ---
    async def _commit_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not await self._commit_retried():
                if self._closing:
                    return  # close() tries once more
                continue
            if self._closing:
                return
            if self._paused:
                self._paused = False
                for source in self.sources:
                    source.transport.resume_reading()
            self._kick()

    async def _commit_retried(self) -> bool:
        """One commit; when it fails (Postgres restarted, a connection dropped while idle) its events
        go back into the next batch, the failure is logged, and the loop is woken again after a
        wait that doubles up to COMMIT_RETRY_MAX_SECONDS. False after a failure."""
        try:
            await self.commit_once()
        except Exception:
            self.commit_failures += 1
            metrics.COMMIT_FAILURES.labels(self.label).inc()
            wait = COMMIT_RETRY.seconds(self.commit_failures)
            log.exception("exchange %s: committing a batch failed (%s in a row); its events wait and are "
                          "committed again in %.1fs", self.label, self.commit_failures, wait)
            await asyncio.sleep(wait)
            self._wake.set()
            return False
        self.commit_failures = 0
        return True

    async def commit_once(self) -> None:
        engine = self.engine
        if engine.batch_empty and not (self.malformed or self._gap_dirty):
            return
        batch = engine.batch_take()
        malformed, self.malformed, self._gap_dirty = self.malformed, 0, False
        intake_position = self.intake_consumed
        gap_age = time.monotonic() - engine.gap_since if engine.gap_since is not None else None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, partial(
                self.commit_fn, app_id=self.app_id, applied_seq=batch.applied_seq, adds=batch.adds,
                removes=batch.removes, skipped=batch.skipped, malformed=malformed, gap_seq=engine.gap_seq,
                gap_age=gap_age, held=len(engine.held)))
        except BaseException:
            engine.batch_return(batch)  # nothing of it went out: it is committed with the next one
            self.malformed += malformed
            raise
        self.intake_committed = intake_position
        self.deliver(batch)
        metrics.APPLIED.labels(self.label).inc(len(batch.events))
        if batch.skipped:
            metrics.SKIPPED.labels(self.label).inc(batch.skipped)
        if self.ws_fn is not None and batch.events:
            # After the commit, in the database thread (in order with the next commit); not awaited.
            events = [e[:4] for e, _ in batch.events]
            loop.run_in_executor(self._executor, self.ws_fn, self.app_id, events)

    def deliver(self, batch: Batch) -> None:
        """Each client's lines of the batch, in sequence order, in one write."""
        clients = self.clients
        if not clients or not batch.events:
            return
        out: dict[int, list[bytes]] = {uid: [] for uid in clients}
        everyone = list(out.values())
        get = out.get
        for event, recipients in batch.events:
            raw = event[4]
            if recipients is None:
                for parts in everyone:
                    parts.append(raw)
            else:
                for uid in recipients:
                    parts = get(uid)
                    if parts is not None:
                        parts.append(raw)
        for uid, parts in out.items():
            if parts:
                clients[uid].write(b"".join(parts))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            engine = self.engine
            if engine.tick():
                self._gap_dirty = True
                self._wake.set()
            metrics.GAP_HELD.labels(self.label).set(len(engine.held))
            metrics.GAP_AGE.labels(self.label).set(
                time.monotonic() - engine.gap_since if engine.gap_since is not None else 0)

    # --- clients ---
    def client_register(self, uid: int, client: ClientProtocol) -> None:
        old = self.clients.get(uid)
        if old is not None and old is not client:
            log.info("exchange %s: user %s connected again; the older connection is closed", self.label, uid)
            old.replaced = True
            old.transport.close()
        self.clients[uid] = client
        self.engine.connected.add(uid)
        metrics.CLIENTS.labels(self.label).set(len(self.clients))

    def client_gone(self, uid: int, client: ClientProtocol) -> None:
        if self.clients.get(uid) is client:
            del self.clients[uid]
            self.engine.connected.discard(uid)
            metrics.CLIENTS.labels(self.label).set(len(self.clients))

    def client_too_slow(self, uid: int, client: ClientProtocol) -> None:
        self.slow_disconnects += 1
        metrics.SLOW_CLIENTS.labels(self.label).inc()
        log.warning("exchange %s: client %s fell more than %s bytes behind: disconnected", self.label, uid,
                    self.client_buffer_bytes)
        self.client_gone(uid, client)
        client.transport.abort()


SOURCE_LINE_MAX = 4096  # bytes without a line end: no event line is this long (the REST intake's cap is 64)


class SourceProtocol(asyncio.Protocol):
    """An event source. With a shared secret set (EXCHANGE_SOURCE_SECRET), its first line must be
    that secret, or the connection is closed before any event is read (docs/security.md)."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.buffer = b""
        self.transport: asyncio.Transport
        self.admitted = exchange.source_secret is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.exchange.sources.add(self)
        if self.exchange._paused:
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        if not self.admitted:
            first, sep, buffer = buffer.partition(b"\n")
            if not sep:
                self.buffer = first
                if len(first) > SOURCE_LINE_MAX:
                    self._refuse("no secret line")
                return
            if not hmac.compare_digest(first.rstrip(b"\r"), self.exchange.source_secret or b""):
                self._refuse("a wrong secret")
                return
            self.admitted = True
        end = buffer.rfind(b"\n")
        if end < 0:
            if len(buffer) > SOURCE_LINE_MAX:  # a source that never ends its line does not grow the process
                self.exchange._malformed(buffer[:200], f"no line end in {SOURCE_LINE_MAX} bytes")
                self.exchange._kick()  # the count is committed like any other
                buffer = b""
            self.buffer = buffer
            return
        self.buffer = buffer[end + 1:]
        lines = buffer[:end].split(b"\n")
        # Each line keeps its own bytes: "\r" stays before the "\n" given back here.
        self.exchange.lines_received([line + b"\n" for line in lines])

    def _refuse(self, why: str) -> None:
        metrics.SOURCES_REFUSED.labels(self.exchange.label).inc()
        log.warning("exchange %s: an event source sent %s: closed", self.exchange.label, why)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        # A last line without its line end is incomplete: dropped (the source will send it again).
        self.exchange.sources.discard(self)


class ClientProtocol(asyncio.Protocol):
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.uid: int | None = None
        self.buffer = b""
        self.replaced = False
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.uid is not None:
            return  # clients only listen; anything after the user id is ignored
        self.buffer += data
        end = self.buffer.find(b"\n")
        if end < 0:
            if len(self.buffer) > 64:
                self.transport.close()
            return
        try:
            self.uid = int(self.buffer[:end].strip())
        except ValueError:
            self.transport.close()
            return
        self.buffer = b""
        self.exchange.client_register(self.uid, self)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport.is_closing():
            return
        # Bytes still unsent from earlier batches: the client is not reading (a batch itself may be
        # larger than the bound; memory per client stays under the bound plus one batch).
        if transport.get_write_buffer_size() > self.exchange.client_buffer_bytes:
            self.exchange.client_too_slow(self.uid, self)  # type: ignore[arg-type]
            return
        transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.uid is not None:
            self.exchange.client_gone(self.uid, self)


async def servers_start(exchange: Exchange, *, host: str, event_port: int,
                        client_port: int) -> tuple[asyncio.Server, asyncio.Server]:
    loop = asyncio.get_running_loop()
    source_server = await loop.create_server(lambda: SourceProtocol(exchange), host, event_port)
    client_server = await loop.create_server(lambda: ClientProtocol(exchange), host, client_port)
    return source_server, client_server
