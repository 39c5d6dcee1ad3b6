"""Memory of held connections: Socket.IO (over WebSocket, at /socket.io/) against the native /ws.

    python -m bench.socketio_hold --clients 2000 [--json FILE]

For each protocol, a fresh platform (bench/platform_proc.py: one web node and a worker, on a
database and a Redis of their own, dropped after) is warmed up with a few connections, then
`--clients` clients connect and log in (each its own user of the demo app, at `--ramp` a second)
and are held. Reported: the web node's RSS holding them minus before, per connection, and how many
were admitted. Issue 28's target: at most 40 KB per Socket.IO connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil
from websockets.asyncio.client import connect

from bench.platform_proc import platform_processes
from bench.report import machine_info
from bench.servers import free_port
from bench.worker import socketio_url

WARMUP = 20


def rss_kb(pids: list[int]) -> float:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids) / 1024


async def _login(url: str, protocol: str, user: str):
    ws = await connect(socketio_url(url) if protocol == "socketio" else url, compression=None, proxy=None,
                       ping_interval=None, max_size=None, open_timeout=30)
    if protocol == "socketio":
        await ws.recv()  # OPEN
        await ws.send("40" + json.dumps({"appId": "app-id-343", "userId": user, "token": "bench"}))
        while not (packet := str(await ws.recv())).startswith(("40", "44")):
            if packet == "2":
                await ws.send("3")
        ok = packet.startswith("40")
    else:
        await ws.send(json.dumps({"type": "AUTH_CLIENT", "data": {"appId": "app-id-343", "userId": user,
                                                                  "token": "bench"}}))
        while (frame := json.loads(await ws.recv()))["type"] != "AUTH_CLIENT_REPLY":
            pass
        ok = frame["data"]["isAuthenticated"]
    return ws, ok


async def _answer_pings(ws) -> None:
    try:
        async for packet in ws:
            if packet == "2":
                await ws.send("3")
    except Exception:
        pass


async def hold(url: str, protocol: str, count: int, first: int, ramp: float) -> list:
    async def one(i: int):
        await asyncio.sleep(i / ramp)
        try:
            ws, ok = await _login(url, protocol, f"ANZ-{first + i}")
        except Exception:
            return None
        asyncio.ensure_future(_answer_pings(ws))
        return ws if ok else None

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def measure(protocol: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sio-hold-") as tmp, \
            platform_processes(free_port(), Path(tmp), worker_concurrency=2) as running:
        loop = asyncio.new_event_loop()
        try:
            warm = loop.run_until_complete(hold(running.url, protocol, WARMUP, 800_000, 50))
            for ws in warm:
                if ws is not None:
                    loop.run_until_complete(ws.close())
            time.sleep(2)
            before = rss_kb(running.web_pids)
            held = loop.run_until_complete(hold(running.url, protocol, args.clients, 600_000, args.ramp))
            time.sleep(args.settle)
            after = rss_kb(running.web_pids)
            admitted = sum(ws is not None for ws in held)
            for ws in held:
                if ws is not None:
                    loop.run_until_complete(ws.close())
        finally:
            loop.close()
    result = {"protocol": protocol, "clients": args.clients, "admitted": admitted,
              "rss_kb_before": round(before), "rss_kb_held": round(after),
              "kb_per_connection": round((after - before) / max(1, admitted), 1)}
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.socketio_hold", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--ramp", type=float, default=400.0, help="new connections per second")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds held before the RSS is read")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = [measure(protocol, args) for protocol in ("socketio", "ws")]
    print("| protocol | admitted | web RSS before (MB) | holding (MB) | KB per connection |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['protocol']} | {r['admitted']} / {r['clients']} | {r['rss_kb_before'] / 1024:.0f} | "
              f"{r['rss_kb_held'] / 1024:.0f} | {r['kb_per_connection']} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "args": sys.argv[1:], "results": results},
                                        indent=2))
    ok = all(r["admitted"] == r["clients"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
