"""One load-generator process: opens its share of the connections and drives them on a fixed clock.

Every connection authenticates as its own user and sends MESSAGE frames to itself (or, with
protocol "socketio", `message` events over Socket.IO's WebSocket transport at /socket.io/). Sends follow a
fixed schedule (start + phase + k * interval), never "after the previous reply", so the offered
load stays constant however slow the server gets. Send times live in this process's memory
(perf_counter is per process, and a self-addressed message always comes back to its sender).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import traceback
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from bench.model import LoadConfig, WorkerPlan, WorkerResult

ERROR_FRAMES = frozenset({"INVALID_MESSAGE", "GENERAL_ERROR", "AUTH_REQUIRED"})
PONG = json.dumps({"type": "PONG", "data": {}})
SIO_PATH = "/socket.io/?EIO=4&transport=websocket"


def socketio_url(ws_url: str) -> str:
    """The Socket.IO WebSocket endpoint of the node whose /ws is `ws_url`."""
    return ws_url.split("/ws", 1)[0].rstrip("/") + SIO_PATH


@dataclass(frozen=True)
class DrainSync:
    """End of the measured window: each worker reports `drained`, then waits for `release` to close."""

    drained: Queue[Any]
    release: Event


@dataclass
class _Connection:
    index: int  # global connection index, also the user number offset
    user_id: str
    ws: ClientConnection
    reader: asyncio.Task[None] | None = None
    alive: bool = True


class Worker:
    def __init__(self, config: LoadConfig, plan: WorkerPlan, run_id: str) -> None:
        self.config = config
        self.plan = plan
        self.run_id = run_id
        self.id_prefix = f"{run_id}.{plan.index}."
        self.result = WorkerResult(index=plan.index, connections_planned=plan.connections)
        # message id -> (perf_counter at send, sent after warmup?)
        self.pending: dict[str, tuple[float, bool]] = {}
        self.received: set[str] = set()
        self.closing = False

    # -- connections --------------------------------------------------------------------------

    async def open_all(self) -> list[_Connection]:
        """Ramp up at config.ramp_rate per second so the server is not flooded with handshakes."""

        async def open_later(offset: int) -> _Connection | None:
            await asyncio.sleep(offset / self.config.ramp_rate)
            return await self._open(self.plan.first_connection + offset)

        opened = await asyncio.gather(*(open_later(i) for i in range(self.plan.connections)))
        return [c for c in opened if c is not None]

    async def _open(self, index: int) -> _Connection | None:
        cfg = self.config
        user_id = f"{cfg.app_name}-{cfg.user_base + index}"
        try:
            # No compression (clients of the linker protocol do not negotiate it), no proxy from
            # the environment, and no client keepalive pings: a ping timeout under load would
            # close connections for reasons of the harness, not the server.
            ws = await connect(
                socketio_url(cfg.url) if cfg.protocol == "socketio" else cfg.url,
                open_timeout=cfg.connect_timeout,
                compression=None,
                proxy=None,
                ping_interval=None,
                close_timeout=2,
                max_size=None,
            )
        except (OSError, WebSocketException, TimeoutError):
            self.result.errors["connect_failed"] += 1
            return None
        if not await self._authenticate(ws, user_id):
            self.result.errors["auth_failed"] += 1
            await ws.close()
            return None
        conn = _Connection(index=index, user_id=user_id, ws=ws)
        conn.reader = asyncio.create_task(self._read(conn))
        return conn

    async def _authenticate(self, ws: ClientConnection, user_id: str) -> bool:
        cfg = self.config
        if cfg.protocol == "socketio":
            return await self._socketio_connect(ws, user_id)
        auth = {"type": "AUTH_CLIENT", "data": {"appId": cfg.app_id, "userId": user_id, "token": cfg.token}}
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                await ws.send(json.dumps(auth))
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("type") == "AUTH_CLIENT_REPLY":
                        return bool((frame.get("data") or {}).get("isAuthenticated"))
                    if frame.get("type") == "PING":
                        await ws.send(PONG)
        except (TimeoutError, ConnectionClosed, ValueError, AttributeError):
            return False

    async def _socketio_connect(self, ws: ClientConnection, user_id: str) -> bool:
        """Engine.IO's OPEN, then Socket.IO's CONNECT with the login as its auth."""
        cfg = self.config
        auth = {"appId": cfg.app_id, "userId": user_id, "token": cfg.token}
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                if not str(await ws.recv()).startswith("0"):
                    return False
                await ws.send("40" + json.dumps(auth))
                while True:
                    packet = str(await ws.recv())
                    if packet == "2":
                        await ws.send("3")
                    elif packet.startswith(("40", "44")):
                        return packet.startswith("40")
        except (TimeoutError, ConnectionClosed):
            return False

    async def close_all(self, conns: list[_Connection]) -> None:
        self.closing = True
        await asyncio.gather(*(c.ws.close() for c in conns), return_exceptions=True)
        readers = [c.reader for c in conns if c.reader is not None]
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    # -- receiving ----------------------------------------------------------------------------

    async def _read(self, conn: _Connection) -> None:
        try:
            async for raw in conn.ws:
                await self._on_frame(conn, raw)
        except ConnectionClosed:
            pass
        conn.alive = False
        if not self.closing:
            self.result.errors["disconnected"] += 1

    async def _on_frame(self, conn: _Connection, raw: str | bytes) -> None:
        if self.config.protocol == "socketio":
            return await self._on_packet(conn, str(raw))
        try:
            frame = json.loads(raw)
            kind = frame.get("type")
        except (ValueError, AttributeError):
            self.result.errors["unparsable_frame"] += 1
            return
        if kind == "MESSAGE":
            self._on_message(frame.get("data") or {})
        elif kind == "PING":
            await conn.ws.send(PONG)
        elif kind in ERROR_FRAMES:
            self.result.errors[kind] += 1
        else:
            # MESSAGE_CONFIRMATION and other extensions are not part of the measurement.
            self.result.other_frames[str(kind)] += 1

    async def _on_packet(self, conn: _Connection, raw: str) -> None:
        """An Engine.IO packet: PING (answered), or a Socket.IO event (`message`, or a refusal)."""
        if raw == "2":
            await conn.ws.send("3")
            return
        if not raw.startswith("42"):
            self.result.other_frames[raw[:2]] += 1
            return
        try:
            name, data = json.loads(raw[2:])[:2]
        except (ValueError, TypeError):
            self.result.errors["unparsable_frame"] += 1
            return
        if name == "message":
            self._on_message(data or {})
        elif name == "invalid_message":
            self.result.errors["INVALID_MESSAGE"] += 1
        else:
            self.result.other_frames[str(name)] += 1

    def _on_message(self, data: dict[str, Any]) -> None:
        now = time.perf_counter()
        content = data.get("content")
        if not isinstance(content, str) or "|" not in content:
            self.result.corrupt += 1
            return
        msg_id = content.split("|", 1)[0]
        entry = self.pending.pop(msg_id, None)
        if entry is not None:
            self.received.add(msg_id)
            self.result.received += 1
            if len(content) != self.config.payload:
                self.result.corrupt += 1
            sent_at, measured = entry
            if measured:
                self.result.latencies_ms.append((now - sent_at) * 1000.0)
        elif msg_id in self.received:
            # The server may redeliver (RELIABLE after a missed ack); only the first copy counts.
            self.result.duplicates += 1
        elif not msg_id.startswith(self.run_id + "."):
            self.result.stale += 1
        else:
            self.result.unexpected += 1

    # -- sending ------------------------------------------------------------------------------

    def _frame(self, conn: _Connection, msg_id: str) -> str:
        header = f"{msg_id}|{time.time_ns()}|"
        content = header + "x" * (self.config.payload - len(header))
        frame: dict[str, Any] = {
            "type": "MESSAGE",
            "data": {"to": conn.user_id, "content": content},
            "reference": msg_id,
            "feature": self.config.feature,
        }
        if not self.config.confirmation:
            frame["confirmationEnabled"] = False
        if self.config.protocol == "socketio":  # the same, as the `message` event's object
            return "42" + json.dumps(["message", {**frame["data"], **{k: v for k, v in frame.items()
                                                                      if k not in ("type", "data")}}])
        return json.dumps(frame)

    async def drive(self, conn: _Connection, start: float, warmup_end: float, end: float) -> None:
        """Send on a fixed clock; a random phase spreads connections evenly over the interval."""
        loop = asyncio.get_running_loop()
        interval = self.config.interval_ms / 1000.0
        due = start + random.uniform(0, interval)
        counter = 0
        while due < end and conn.alive:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            measured = due >= warmup_end
            lag_ms = (loop.time() - due) * 1000.0
            msg_id = f"{self.id_prefix}{conn.index}.{counter}"
            text = self._frame(conn, msg_id)
            self.pending[msg_id] = (time.perf_counter(), measured)
            try:
                await conn.ws.send(text)
            except ConnectionClosed:
                del self.pending[msg_id]
                self.result.errors["send_failed"] += 1
                return
            self.result.sent += 1
            if measured:
                self.result.sent_measured += 1
                self.result.send_lags_ms.append(lag_ms)
            counter += 1
            due += interval

    async def drain(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while self.pending and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def finish(self) -> WorkerResult:
        self.result.lost = len(self.pending)
        self.result.lost_measured = sum(1 for _, measured in self.pending.values() if measured)
        return self.result


async def _wait_for_start(start_event: Event, start_at: Synchronized[float], timeout: float) -> float:
    """Wait until the parent says go; 0.0 if it never does."""
    if not await _wait(start_event, timeout):
        return 0.0
    return float(start_at.value)


async def _wait(event: Event, timeout: float) -> bool:
    """Block off the event loop, so readers keep answering PINGs meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, event.wait, timeout)


async def _run(
    config: LoadConfig,
    plan: WorkerPlan,
    run_id: str,
    ready: Queue[Any],
    start_event: Event,
    start_at: Synchronized[float],
    sync: DrainSync,
) -> WorkerResult:
    worker = Worker(config, plan, run_id)
    conns = await worker.open_all()
    worker.result.connections_ok = len(conns)
    ready.put((plan.index, len(conns)))
    start_wall = await _wait_for_start(start_event, start_at, timeout=config.connect_timeout + 120)
    if start_wall <= 0:  # the parent gave up (another worker failed)
        await worker.close_all(conns)
        return worker.finish()

    # Map the parent's wall-clock start onto this process's monotonic loop clock.
    loop = asyncio.get_running_loop()
    start = loop.time() + (start_wall - time.time())
    end = start + config.duration
    cpu_before = time.process_time()
    await asyncio.gather(*(worker.drive(c, start, start + config.warmup, end) for c in conns))
    worker.result.cpu_seconds = time.process_time() - cpu_before
    await worker.drain(loop.time() + config.drain)
    # The parent reads the servers' CPU once every process has drained, and only then may the
    # sockets close: closing costs the server work (disconnect handlers) that is not messaging.
    sync.drained.put(plan.index)
    await _wait(sync.release, config.drain + 30)
    await worker.close_all(conns)
    return worker.finish()


def worker_main(
    config: LoadConfig,
    plan: WorkerPlan,
    run_id: str,
    ready: Queue[Any],
    results: Queue[Any],
    start_event: Event,
    start_at: Synchronized[float],
    sync: DrainSync,
) -> None:
    """Process entry point; always reports back, even if the run crashed."""
    try:
        result = asyncio.run(_run(config, plan, run_id, ready, start_event, start_at, sync))
    except BaseException:  # noqa: BLE001 - the parent must hear about any failure
        result = WorkerResult(index=plan.index, connections_planned=plan.connections, failure=traceback.format_exc())
        ready.put((plan.index, -1))
    results.put(result)
