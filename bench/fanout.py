"""Channel fan-out: how long until the last of N subscribers has a published message.

    python -m bench.fanout --start-platform --subscribers 1000 --publishes 20 [--json FILE]
    python -m bench.fanout --start-platform --targets platform,pusher   # /ws channels against Pusher clients

Targets, run one after the other against the same subscribers count:
- `platform`: N WebSocket clients on the push-compatible stream `/ws/messages?channels=…` of a
  web node started here (DEBUG off, on a database and a Redis of its own: bench/platform_proc.py),
  or of a running one with `--platform-url` and `--key`, left as it is; each publish is the push seed's `POST /messages` (stored in
  the channel's history, then fanned out through the node's hub);
- `pusher`: N Pusher protocol clients (`/app/{key}?protocol=7`, the frames pusher-js sends) subscribed
  to the public Pusher channel `bench.fanout` (Switchboard channel `pusher.bench.fanout`) of the same
  node, each publish the Pusher HTTP API's signed `POST /apps/{app_id}/events`;
- `relay-pubsub`, `relay-core`: the hand-built Channels relay (bench/relay) on the pub/sub and core
  channel layers: N clients `SUBSCRIBE` (a Channels group per channel) and one client `PUBLISH`es
  (`group_send` to the group).

Each publish carries its send time; every subscriber notes when it arrives. Per publish: the time
until the last subscriber had it ("to last") and until half had it; a publish some subscriber
never got within the timeout counts as missed. Publishes are spaced (`--interval`) so each
measures one fan-out, not a queue. With --start-platform, the platform's processes' CPU (web node
and worker, their children included: bench.cpu) over each target's publishes is reported per
delivered message, so `platform` and `pusher` are compared on the same node in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import websockets

from bench import cpu
from bench.platform_proc import REPO_ROOT, platform_env, platform_processes
from bench.servers import free_port, relay_server

CHANNEL = "bench.fanout"
APP_ID = "app-id-343"


@dataclass
class FanoutResult:
    target: str
    subscribers: int
    connected: int
    publishes: int
    missed: int = 0
    to_last_ms: list[float] = field(default_factory=list)
    to_half_ms: list[float] = field(default_factory=list)
    server_cpu_seconds: float | None = None  # the platform's processes, over the publishes (--start-platform)

    def summary(self) -> dict:
        def med(values: list[float]) -> float | None:
            return round(statistics.median(values), 1) if values else None

        def worst(values: list[float]) -> float | None:
            return round(max(values), 1) if values else None

        def p99(values: list[float]) -> float | None:
            return round(sorted(values)[min(len(values) - 1, int(len(values) * 0.99))], 1) if values else None

        delivered = (self.publishes - self.missed) * self.connected
        cpu_per = (round(self.server_cpu_seconds * 1e6 / delivered, 1)
                   if self.server_cpu_seconds is not None and delivered else None)
        return {"target": self.target, "subscribers": self.subscribers, "connected": self.connected,
                "publishes": self.publishes, "missed": self.missed, "to_last_median_ms": med(self.to_last_ms),
                "to_last_p99_ms": p99(self.to_last_ms), "to_last_max_ms": worst(self.to_last_ms),
                "to_half_median_ms": med(self.to_half_ms), "server_cpu_us_per_delivered": cpu_per}


class Subscribers:
    def __init__(self) -> None:
        self.arrivals: dict[int, list[float]] = {}

    def note(self, text: str) -> None:
        now = time.time()
        try:
            frame = json.loads(text)
        except ValueError:
            return
        data = frame.get("data") if isinstance(frame, dict) else None
        body = data.get("message", data.get("content")) if isinstance(data, dict) else data  # (Pusher: a string)
        if isinstance(body, str) and body.startswith("fanout|"):
            self.arrivals.setdefault(int(body.split("|")[1]), []).append(now)


async def _reader(url: str, subs: Subscribers, ready: asyncio.Event, count: list[int], setup, total: int) -> None:
    async with websockets.connect(url, max_size=None, open_timeout=30, ping_interval=None) as ws:
        await setup(ws)
        count[0] += 1
        if count[0] >= total:
            ready.set()
        async for text in ws:
            if isinstance(text, str) and '"event":"ping"' in text:
                await ws.send('{"event":"pong"}')
                continue
            if isinstance(text, str) and '"event":"pusher:ping"' in text:
                await ws.send('{"event":"pusher:pong","data":{}}')
                continue
            subs.note(text)


async def _connect_all(url: str, n: int, subs: Subscribers, setup) -> tuple[list[asyncio.Task], int]:
    ready, count = asyncio.Event(), [0]
    tasks = []
    for _ in range(n):
        tasks.append(asyncio.ensure_future(_reader(url, subs, ready, count, setup, n)))
        await asyncio.sleep(0.002)  # a ramp, not a storm of handshakes
    try:
        await asyncio.wait_for(ready.wait(), 120)
    except TimeoutError:
        pass
    await asyncio.sleep(1.0)
    return tasks, count[0]


async def _measure(result: FanoutResult, subs: Subscribers, publish, args) -> None:
    for k in range(args.publishes):
        sent = time.time()
        await publish(f"fanout|{k}|{sent}")
        deadline = time.monotonic() + args.timeout
        while len(subs.arrivals.get(k, ())) < result.connected and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        got = sorted(subs.arrivals.get(k, []))
        if len(got) < result.connected:
            result.missed += 1
        elif got:
            result.to_last_ms.append((got[-1] - sent) * 1000)
            result.to_half_ms.append((got[len(got) // 2] - sent) * 1000)
        await asyncio.sleep(args.interval)


class ServerCpu:
    """CPU seconds the platform's processes (and their children) used between start() and stop()."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def start(self) -> None:
        self.first = cpu.members(self.pids, cpu.read_table())

    def stop(self) -> float:
        last = cpu.members(self.pids, cpu.read_table())
        ticks = sum(stat.total - self.first[key].total for key, stat in last.items() if key in self.first)
        ticks += sum(stat.total for key, stat in last.items() if key not in self.first)
        return ticks / os.sysconf("SC_CLK_TCK")


async def _measured(result: FanoutResult, subs: Subscribers, publish, args, server: ServerCpu | None) -> None:
    if server is not None:
        server.start()
    await _measure(result, subs, publish, args)
    if server is not None:
        result.server_cpu_seconds = server.stop()


def _pusher_query(method: str, path: str, body: bytes, key: str, secret: str) -> str:
    """The signed query of the Pusher HTTP API (what the `pusher` server libraries send)."""
    query = {"auth_key": key, "auth_timestamp": str(int(time.time())), "auth_version": "1.0",
             "body_md5": hashlib.md5(body).hexdigest()}
    text = "\n".join([method, path, "&".join(f"{k}={v}" for k, v in sorted(query.items()))])
    query["auth_signature"] = hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()
    return "&".join(f"{k}={v}" for k, v in sorted(query.items()))


async def run_pusher(http_url: str, creds: dict, args, server: ServerCpu | None = None) -> FanoutResult:
    subs = Subscribers()
    ws_url = http_url.replace("http", "ws", 1) + f"/app/{creds['key']}?protocol=7&client=bench&version=8.4.0"

    async def setup(ws) -> None:
        await ws.recv()  # pusher:connection_established
        await ws.send(json.dumps({"event": "pusher:subscribe", "data": {"channel": CHANNEL}}))
        await ws.recv()  # pusher_internal:subscription_succeeded

    tasks, connected = await _connect_all(ws_url, args.subscribers, subs, setup)
    result = FanoutResult("pusher", args.subscribers, connected, args.publishes)
    path = f"/apps/{creds['app_id']}/events"
    async with httpx.AsyncClient(timeout=30) as http:
        async def publish(text: str) -> None:
            body = json.dumps({"name": "bench", "channel": CHANNEL, "data": text}).encode()
            response = await http.post(f"{http_url}{path}?{_pusher_query('POST', path, body, creds['key'], creds['secret'])}",
                                       content=body, headers={"Content-Type": "application/json"})
            response.raise_for_status()

        await _measured(result, subs, publish, args, server)
    for task in tasks:
        task.cancel()
    return result


async def run_platform(http_url: str, key: str, args, server: ServerCpu | None = None) -> FanoutResult:
    subs = Subscribers()
    ws_url = http_url.replace("http", "ws", 1) + f"/ws/messages?channels={CHANNEL}&app={APP_ID}"

    async def setup(ws) -> None:
        await ws.recv()  # the first ping: subscribed

    tasks, connected = await _connect_all(ws_url, args.subscribers, subs, setup)
    result = FanoutResult("platform", args.subscribers, connected, args.publishes)
    async with httpx.AsyncClient(timeout=30) as http:
        async def publish(text: str) -> None:
            response = await http.post(f"{http_url}/messages", json={"channel": CHANNEL, "message": text},
                                       headers={"Authorization": f"Bearer {key}"})
            response.raise_for_status()

        await _measured(result, subs, publish, args, server)
    for task in tasks:
        task.cancel()
    return result


async def run_relay(ws_url: str, name: str, args) -> FanoutResult:
    subs = Subscribers()

    async def setup(ws) -> None:
        await ws.send(json.dumps({"type": "AUTH_CLIENT", "data": {"appId": APP_ID, "userId": "ANZ-1"}}))
        await ws.recv()
        await ws.send(json.dumps({"type": "SUBSCRIBE", "data": {"channel": CHANNEL}}))
        await ws.recv()

    tasks, connected = await _connect_all(ws_url, args.subscribers, subs, setup)
    result = FanoutResult(name, args.subscribers, connected, args.publishes)
    async with websockets.connect(ws_url) as publisher:
        await publisher.send(json.dumps({"type": "AUTH_CLIENT", "data": {"appId": APP_ID, "userId": "ANZ-2"}}))
        await publisher.recv()

        async def publish(text: str) -> None:
            await publisher.send(json.dumps({"type": "PUBLISH", "data": {"channel": CHANNEL, "content": text}}))

        await _measure(result, subs, publish, args)
    for task in tasks:
        task.cancel()
    return result


def _prepare_platform(env: dict[str, str]) -> tuple[str, dict]:
    """The demo app reads `bench.*` publicly; returns a fresh API key with room for the load, and
    the app's Pusher credentials."""
    code = ("import json; from apps_registry.models import ClientApp; from apps_registry.services import api_key_create; "
            "app = ClientApp.objects.get(app_name='ANZ'); app.public_channel_patterns = ['bench.*']; "
            "app.api_rate_limit_per_second = 10000; app.api_rate_limit_burst = 10000; app.save(); "
            "print(json.dumps({'key': app.pusher.key, 'secret': app.pusher.secret, 'app_id': app.pusher.pusher_app_id})); "
            "print(api_key_create(app=app, name='bench fanout')[1])")
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO_ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    lines = out.strip().splitlines()
    return lines[-1], json.loads(lines[-2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--start-platform", action="store_true", help="start a web node and a worker here")
    parser.add_argument("--platform-url", default="http://127.0.0.1:8000", help="a running platform")
    parser.add_argument("--key", help="an API key of app ANZ (with --platform-url)")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--publishes", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between publishes")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a publish may take to reach all")
    parser.add_argument("--targets", default="platform,relay-pubsub,relay-core")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if ("platform" in targets or "pusher" in targets) and not (args.start_platform or args.key):
        # Preparing the app means changing it (public channels, rate limits): only on a platform started here.
        parser.error("--platform-url needs --key (an API key of app ANZ); or pass --start-platform")
    results: list[FanoutResult] = []
    env = platform_env()
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp, ExitStack() as stack:
        if "platform" in targets or "pusher" in targets:
            server = None
            if args.start_platform:
                port = free_port()
                # 1,000 subscribers come from one address: the per-address caps of streams raised out of the way.
                running = stack.enter_context(platform_processes(port, Path(tmp), extra_env={
                    "STREAM_MAX_PER_ADDRESS": str(args.subscribers + 100)}))
                env.update(DATABASE_URL=running.database_url, REDIS_URL=running.redis_url)  # the run's own
                args.platform_url = f"http://127.0.0.1:{port}"
                server = ServerCpu([*running.web_pids, *running.worker_pids])
            key, creds = _prepare_platform(env) if args.start_platform else (args.key, None)
            if "platform" in targets:
                results.append(asyncio.run(run_platform(args.platform_url, key, args, server)))
                print(results[-1].summary(), flush=True)
            if "pusher" in targets:
                if creds is None:
                    parser.error("the pusher target needs --start-platform")
                results.append(asyncio.run(run_pusher(args.platform_url, creds, args, server)))
                print(results[-1].summary(), flush=True)
        for target in targets:
            if target.startswith("relay"):
                layer = target.split("-", 1)[1]
                with relay_server(env["REDIS_URL"], Path(tmp) / f"{target}.log", layer=layer) as relay:
                    results.append(asyncio.run(run_relay(relay.url, target, args)))
                print(results[-1].summary(), flush=True)
    if args.json:
        args.json.write_text(json.dumps([{**r.summary(), "raw": asdict(r)} for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
