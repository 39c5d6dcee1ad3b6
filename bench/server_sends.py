"""Server-side sending against a /ws sender, on one fresh platform, in one run (issue 29's targets).

    python -m bench.server_sends --duration 15 --concurrency 32 --payload 200 --users 200 \
        --json docs/bench/server-sends.json

One web node and one worker (bench.platform_proc, a database and a Redis of their own), then, one
after the other, each with the platform's server CPU sampled (bench.cpu: web, worker, Postgres,
Redis) from its first send until its deliveries have drained:

1. `rest-RELIABLE`: `--concurrency` keep-alive HTTP clients (bench.rest) send back to back, each
   `POST /api/v1/messages` with an Idempotency-Key of its own and a `--payload`-character content,
   to `--users` users who are connected (a receiver process holds a WebSocket for each and counts
   what arrives), so every send is stored, routed and delivered;
2. `ws-RELIABLE`: `make bench`'s load test (bench.loadtest: `--users` connections, each sending to
   itself) at the rate the REST run reached, so both are measured at the same throughput; then
   both again in the other order (a run pays for some of the previous run's background work in
   Postgres), and /ws at `--ws-rate` (1,000 msg/s, the REST target) when REST fell short of it;
3. `rest-batch`: `--batch-concurrency` clients sending `POST /api/v1/messages/batch` of `--batch`
   messages each (to connected users too).

It prints, and writes with `--json`, sends per second, latency (a REST send's round trip; a /ws
message's send to its receipt), messages delivered against accepted, server CPU per message, and
the ratio of REST's CPU per message to /ws's over both orders (and without Postgres's share).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import websockets

from bench.compare import PLATFORM_GROUPS, settle
from bench.cpu import CpuProbe
from bench.loadtest import WindowHooks, run_loadtest
from bench.model import LoadConfig
from bench.platform_proc import REPO_ROOT, platform_processes
from bench.report import results_write
from bench.rest import RestConfig
from bench.rest import run as rest_run
from bench.servers import find_postgres, find_redis
from devstack.embedded import free_port

APP, APP_ID = "ANZ", "app-id-343"


def _receive(ws_url: str, users: list[str], ready: Any, stop: Any, counts: Any) -> None:
    """A process holding a WebSocket per user; puts the number of MESSAGE frames received when told to stop."""

    async def hold(user: str, total: list[int]) -> None:
        async with websockets.connect(ws_url, max_size=None, ping_interval=None) as ws:
            await ws.send(json.dumps({"type": "AUTH_CLIENT", "data": {"appId": APP_ID, "userId": user,
                                                                      "token": "bench"}}))
            async for raw in ws:
                kind = json.loads(raw).get("type")
                if kind == "AUTH_CLIENT_REPLY":
                    ready.put(user)
                elif kind == "MESSAGE":
                    total[0] += 1
                elif kind == "PING":
                    await ws.send(json.dumps({"type": "PONG"}))

    async def main() -> None:
        total = [0]
        tasks = [asyncio.create_task(hold(u, total)) for u in users]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        counts.put(total[0])
        for task in tasks:
            task.cancel()

    asyncio.run(main())


class Receivers:
    """A process of connected users, for the REST runs' deliveries."""

    def __init__(self, ws_url: str, users: list[str]) -> None:
        ctx = mp.get_context("spawn")
        self.ready, self.stop, self.counts = ctx.Queue(), ctx.Event(), ctx.Queue()
        self.process = ctx.Process(target=_receive, args=(ws_url, users, self.ready, self.stop, self.counts))
        self.process.start()
        for _ in users:
            self.ready.get(timeout=60)

    def close(self) -> int:
        self.stop.set()
        count = self.counts.get(timeout=30)
        self.process.join(10)
        return count


def _manage(running: Any, *argv: str) -> str:
    env = {**os.environ, "DATABASE_URL": running.database_url, "REDIS_URL": running.redis_url,
           "PYTHONPATH": f"{REPO_ROOT / 'platform'}{os.pathsep}{REPO_ROOT}"}
    return subprocess.run([sys.executable, "manage.py", *argv], cwd=REPO_ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout


def _api_key(running: Any) -> str:
    """A key of the demo app, whose limits are raised out of the way (the run measures the server)."""
    _manage(running, "shell", "-c",
            "from apps_registry.models import ClientApp; ClientApp.objects.filter(app_name='ANZ').update("
            "api_rate_limit_per_second=100000, api_rate_limit_burst=100000, rate_limit_per_second=100000, "
            "rate_limit_burst=100000, deliveries_per_second=100000, deliveries_burst=100000)")
    out = _manage(running, "apikey", "create", APP)
    return next(word for word in out.split() if word.startswith("sb_"))


def _cpu_ms(window: Any, messages: int) -> dict[str, float]:
    per = {group: round(window.seconds(group) * 1000 / max(1, messages), 3)
           for group in PLATFORM_GROUPS if window.seconds(group) is not None}
    return {**per, "total": round(sum(per.values()), 3)}


def _rest(args: argparse.Namespace, url: str, key: str, groups: dict, ws_url: str, users: list[str],
          *, batch: int = 0, concurrency: int) -> dict[str, Any]:
    receivers = Receivers(ws_url, users)
    probe = CpuProbe(groups)
    config = RestConfig(url=url, key=key, concurrency=concurrency, duration=args.duration, warmup=0,
                        app_name=APP, user_base=int(users[0].split("-")[1]), users=len(users), payload=args.payload,
                        batch=batch)
    probe.start()
    result = asyncio.run(rest_run(config))
    time.sleep(args.drain)
    window = probe.stop()
    delivered = receivers.close()
    return {"sends_per_second": result.sends_per_second, "accepted": result.sends, "delivered": delivered,
            "latency_ms": result.latency_ms, "errors": result.errors,
            "cpu_ms_per_message": _cpu_ms(window, result.sends)}


def _ws(args: argparse.Namespace, ws_url: str, groups: dict, rate: float, user_base: int) -> dict[str, Any]:
    probe = CpuProbe(groups)
    config = LoadConfig(url=ws_url, connections=args.users, interval_ms=args.users * 1000.0 / rate,
                        duration=args.duration, warmup=0, feature="RELIABLE", payload=args.payload,
                        processes=2, user_base=user_base, drain=args.drain)
    result = run_loadtest(config, WindowHooks(at_start=probe.start, after_drain=probe.stop))
    return {"sends_per_second": result.achieved_rate, "accepted": result.sent, "delivered": result.received,
            "lost": result.lost, "latency_ms": {"p50": result.p50_ms, "p95": result.p95_ms, "p99": result.p99_ms},
            "errors": result.errors, "cpu_ms_per_message": _cpu_ms(probe.window, result.sent)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of sending per run")
    parser.add_argument("--concurrency", type=int, default=32, help="keep-alive clients of the REST run")
    parser.add_argument("--users", type=int, default=200, help="connected recipients (and /ws senders)")
    parser.add_argument("--payload", type=int, default=200, help="characters of content per message")
    parser.add_argument("--batch", type=int, default=1000, help="messages per batch call")
    parser.add_argument("--batch-concurrency", type=int, default=4)
    parser.add_argument("--ws-rate", type=float, default=1000.0, help="also run /ws at this rate when REST fell short of it")
    parser.add_argument("--drain", type=float, default=5.0, help="seconds to wait for deliveries after sending")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    command = "python -m bench.server_sends " + " ".join(sys.argv[1:] if argv is None else argv)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sends-") as tmp, \
            platform_processes(free_port(), Path(tmp)) as running:
        http_url = running.url.replace("ws://", "http://").removesuffix("/ws")
        key = _api_key(running)
        groups = {"web": running.web_pids, "worker": running.worker_pids,
                  "postgres": find_postgres(running.database_url), "redis": find_redis(running.redis_url)}

        def users(base: int) -> list[str]:
            return [f"{APP}-{base + i}" for i in range(args.users)]

        def run(name: str, measure: Any) -> dict[str, Any]:
            settle()
            runs[name] = measure()
            print(name, json.dumps(runs[name]), flush=True)
            return runs[name]

        # Round 1 sends by REST first, round 2 by /ws first: a run pays for some of the background
        # work (Postgres's) of the run before it, so each path is measured in both places.
        rest1 = run("rest-RELIABLE", lambda: _rest(args, http_url, key, groups, running.url, users(700000),
                                                  concurrency=args.concurrency))
        rate = max(50.0, rest1["sends_per_second"])
        run("ws-RELIABLE", lambda: _ws(args, running.url, groups, rate, user_base=800000))
        run("ws-RELIABLE again", lambda: _ws(args, running.url, groups, rate, user_base=810000))
        run("rest-RELIABLE again", lambda: _rest(args, http_url, key, groups, running.url, users(710000),
                                                 concurrency=args.concurrency))
        if rest1["sends_per_second"] < args.ws_rate:
            run(f"ws-RELIABLE at {args.ws_rate:g}/s", lambda: _ws(args, running.url, groups, args.ws_rate,
                                                                   user_base=850000))
        run("rest-batch", lambda: _rest(args, http_url, key, groups, running.url, users(900000), batch=args.batch,
                                        concurrency=args.batch_concurrency))

    def cpu(name: str, groups: tuple[str, ...] = ("web", "worker", "postgres", "redis")) -> float:
        return sum(runs[name]["cpu_ms_per_message"].get(g, 0.0) for g in groups)

    rests, wss = ("rest-RELIABLE", "rest-RELIABLE again"), ("ws-RELIABLE", "ws-RELIABLE again")
    ratio = sum(cpu(r) for r in rests) / max(1e-9, sum(cpu(w) for w in wss))
    app_side = ("web", "worker", "redis")
    summary = {"rest_sends_per_second": [runs[r]["sends_per_second"] for r in rests],
               "rest_p99_ms": [runs[r]["latency_ms"].get("p99") for r in rests],
               "rest_cpu_ms_per_message": [round(cpu(r), 3) for r in rests],
               "ws_cpu_ms_per_message": [round(cpu(w), 3) for w in wss],
               "cpu_ratio_rest_to_ws": round(ratio, 2),
               "cpu_ratio_rest_to_ws_without_postgres": round(sum(cpu(r, app_side) for r in rests)
                                                              / max(1e-9, sum(cpu(w, app_side) for w in wss)), 2),
               "batch_messages_per_second": runs["rest-batch"]["sends_per_second"]}
    print(json.dumps(summary, indent=2))
    if args.json:
        results_write(args.json, command=command, summary=summary, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
