"""Requests to the app's server, round trip by round trip, beside a RELIABLE message, on one fresh
platform, in one run (issue 44's targets).

    python -m bench.requests --clients 50 --duration 20 --json docs/bench/requests-issue44.json

One web node, one worker and one outbound (webhooks) worker (bench.platform_proc: a database and a
Redis of their own), the demo app ANZ with two endpoints, and then, one after the other, each with the
platform's CPU sampled (bench.cpu: web, worker and outbound, Postgres, Redis) for the window:

1. `stream`: `--clients` WebSockets, each keeping one REQUEST in flight to `bench.stream`, whose
   server (a process of the harness) reads `sbq:ANZ:requests` as the app's request-stream user and
   answers each entry on the intake (`replyTo`, `outcome`, `content`) as the app's intake user, a
   pipeline per batch read;
2. `webhook`: the same to `bench.hook`, whose server (a process of the harness, a threading HTTP
   server) answers each `request.received` call with `200 {"resolve": …}` in its response;
3. `RELIABLE`: the same clients each keeping one RELIABLE MESSAGE to itself in flight (send, then
   its receipt): the stored path's round trip, for the CPU ratio, flat out and then paced to each
   request run's throughput (`RELIABLE@stream`, `RELIABLE@webhook`: CPU per message falls as a
   batch grows, so a ratio is fair only at the same rate).

A round trip is a REQUEST's send to its RESOLVE's receipt (a MESSAGE's send to its receipt). It
prints, and writes with `--json`, round trips per second, p50/p99/max, and server CPU per round trip
for each, and the ratio of each request path's CPU to RELIABLE's. The harness's processes (clients,
the stream server, the webhook server) are not counted as server CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import redis
import websockets

from bench.compare import settle
from bench.cpu import CpuProbe
from bench.platform_proc import platform_processes
from bench.report import results_write
from bench.server_sends import _manage
from bench.servers import find_postgres, find_redis
from devstack.embedded import free_port

APP, APP_ID = "ANZ", "app-id-343"
GROUPS = ("web", "worker", "postgres", "redis")


def _hook_server(port_out: Any, stop: Any) -> None:
    """The app's webhook, in a process of its own (as an app's server is): answers each request in
    its response (`200 {"resolve": …}`), headers and body in one write, as production servers do
    (http.server's two writes, headers then body, cost every call a 40 ms delayed ACK)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            answer = json.dumps({"resolve": "done " + body["data"]["requestId"]}).encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            pass

    ThreadingHTTPServer.request_queue_size = 1024  # (socketserver's 5 drops a burst of new connections)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_out.put(server.server_address[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


def _stream_server(redis_url: str, password: str, db_prefix: str, stop: Any) -> None:
    """The app's server on the stream: read a batch, answer it in one pipeline, acknowledge it."""
    parsed = redis.connection.parse_url(redis_url)
    common = {"host": parsed["host"], "port": parsed["port"], "db": parsed.get("db", 0), "password": password}
    reader = redis.Redis(username=f"{db_prefix}{APP}:requests", **common)
    writer = redis.Redis(username=f"{db_prefix}{APP}", **common)
    key = f"sbq:{APP}:requests"
    while not stop.is_set():
        try:
            answer = reader.xreadgroup("app", "bench", {key: ">"}, count=500, block=200)
        except redis.ResponseError:  # NOGROUP: made with the first request
            time.sleep(0.05)
            continue
        for _, entries in answer or []:
            pipe = writer.pipeline(transaction=False)
            for _, fields in entries:
                pipe.xadd(f"sbq:{APP}:in", {"replyTo": fields[b"requestId"], "outcome": "resolve",
                                            "content": b"done " + fields[b"requestId"]})
            pipe.execute()
            reader.xack(key, "app", *[entry_id for entry_id, _ in entries])


async def _client(url: str, user: str, mode: str, endpoint: str, payload: str, until: float, warm: float,
                  latencies: list[float], errors: list[str], done: list[int], pace: float = 0.0) -> None:
    async with websockets.connect(url, max_size=None, ping_interval=None) as ws:
        await ws.send(json.dumps({"type": "AUTH_CLIENT", "data": {"appId": APP_ID, "userId": user, "token": "t"}}))
        while json.loads(await ws.recv())["type"] != "AUTH_CLIENT_REPLY":
            pass
        n = 0
        while time.monotonic() < until:
            n += 1
            started = time.monotonic()
            if mode == "RELIABLE":
                await ws.send(json.dumps({"type": "MESSAGE", "data": {"to": user, "content": payload}}))
                wanted = "MESSAGE"
            else:
                await ws.send(json.dumps({"type": "REQUEST", "data": {"endpoint": endpoint, "content": payload,
                                                                       "clientMessageId": f"{mode}-{n}"}}))
                wanted = "RESOLVE"
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if frame["type"] == wanted:
                    break
                if frame["type"] in ("INVALID_MESSAGE", "GENERAL_ERROR", "REJECT"):
                    errors.append(json.dumps(frame)[:200])
                    break
            done[0] += 1  # (every round trip of the CPU window, the warm-up's too)
            if started >= warm:
                latencies.append(time.monotonic() - started)
            if pace:  # (a paced run: this client's next round trip starts `pace` after the last one began)
                await asyncio.sleep(max(0.0, started + pace - time.monotonic()))


def _run_clients(url: str, mode: str, args: argparse.Namespace, user_base: int, rate: float = 0.0) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    done = [0]
    start = time.monotonic()
    warm, until = start + args.warmup, start + args.warmup + args.duration
    endpoint = {"stream": "bench.stream", "webhook": "bench.hook"}.get(mode, "")
    pace = args.clients / rate if rate else 0.0

    async def main() -> None:
        await asyncio.gather(*(_client(url, f"{APP}-{user_base + i}", mode, endpoint, "x" * args.payload, until, warm,
                                       latencies, errors, done, pace) for i in range(args.clients)))

    asyncio.run(main())
    ordered = sorted(latencies)

    def pct(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) if ordered else None

    return {"round_trips": len(ordered), "round_trips_per_second": round(len(ordered) / args.duration, 1),
            "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": round(ordered[-1] * 1000, 2) if ordered else None,
                           "mean": round(statistics.fmean(ordered) * 1000, 2) if ordered else None},
            "errors": len(errors), "first_errors": errors[:3], "all_round_trips": done[0]}


def _setup(running: Any, hook_url: str) -> str:
    """ANZ's limits out of the way, its two endpoints, and its queue credential's password."""
    out = _manage(running, "shell", "-c", f"""
from apps_registry.models import ClientApp, RequestEndpoint
from messaging.intake.stream.credentials import queue_credential_create
apps = ClientApp.objects.filter(app_name='{APP}')
apps.update(api_rate_limit_per_second=100000, api_rate_limit_burst=100000, rate_limit_per_second=100000,
            rate_limit_burst=100000, deliveries_per_second=100000, deliveries_burst=100000)
anz = apps.get()
RequestEndpoint.objects.create(app=anz, name='bench.stream', stream=True, max_in_flight_per_user=100)
RequestEndpoint.objects.create(app=anz, name='bench.hook', webhook_url='{hook_url}', max_in_flight_per_user=100)
print('PASSWORD', queue_credential_create(app=anz)[1])
""")
    return next(line.split()[1] for line in out.splitlines() if line.startswith("PASSWORD"))


def _analyze(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _cpu_per_round_trip(window: Any, round_trips: int) -> dict[str, float]:
    per = {g: round(window.seconds(g) * 1000 / max(1, round_trips), 3) for g in GROUPS if window.seconds(g) is not None}
    return {**per, "total": round(sum(per.values()), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50, help="WebSockets, each with one round trip in flight")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--payload", type=int, default=100, help="characters of content per request")
    parser.add_argument("--modes", default="stream,webhook,RELIABLE,RELIABLE@stream,RELIABLE@webhook",
                        help="runs, in order: stream, webhook, RELIABLE (as fast as it goes), RELIABLE@<run> (paced "
                             "to the round trips per second that run reached) or RELIABLE@<rate>")
    parser.add_argument("--prime", type=float, default=3.0,
                        help="seconds of each kind of round trip before anything is measured (0: none)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--logs", type=Path, help="keep the platform's logs in this folder")
    args = parser.parse_args(argv)
    command = "python -m bench.requests " + " ".join(sys.argv[1:] if argv is None else argv)
    stop = mp.Event()
    port_out: Any = mp.Queue()
    hook = mp.Process(target=_hook_server, args=(port_out, stop), daemon=True)
    hook.start()
    hook_url = f"http://127.0.0.1:{port_out.get(timeout=30)}/requests"
    runs: dict[str, Any] = {}
    env = {**{k: v for k, v in os.environ.items() if k.startswith("REQUEST_")}, "WEBHOOKS_ALLOW_HTTP": "true", "OUTGOING_ALLOWED_NETWORKS": "127.0.0.0/8", "WEBHOOK_APP_CONCURRENCY": "64",
           "QUEUE_INTAKE_BLOCK_SECONDS": "0.01"}
    with tempfile.TemporaryDirectory(prefix="bench-requests-") as tmp, \
            platform_processes(free_port(), args.logs or Path(tmp), extra_env=env, outbound_worker=True) as running:
        password = _setup(running, hook_url)
        db = int(redis.connection.parse_url(running.redis_url).get("db") or 0)
        server = mp.Process(target=_stream_server, args=(running.redis_url, password, f"sbq-{db}-" if db else "sbq-",
                                                         stop), daemon=True)
        server.start()
        groups = {"web": running.web_pids, "worker": [*running.worker_pids, *running.outbound_pids],
                  "postgres": find_postgres(running.database_url), "redis": find_redis(running.redis_url)}
        # Every table with rows and statistics before anything is measured, each run after an
        # ANALYZE: plans made on a fresh database's empty tables (sequential scans, kept by the
        # statements' plan caches until autovacuum's first ANALYZE a minute later) would charge
        # whichever run comes first.
        primer = argparse.Namespace(**{**vars(args), "duration": args.prime, "warmup": 0.0})
        for index, mode in enumerate(("stream", "webhook", "RELIABLE") if args.prime else ()):
            _run_clients(running.url, mode, primer, user_base=500000 + index * 10000)
        for index, mode in enumerate(args.modes.split(",")):
            settle()
            _analyze(running.database_url)
            probe = CpuProbe(groups)
            probe.start()
            name, _, paced = mode.partition("@")  # RELIABLE@stream: at the rate the stream run reached
            rate = runs[paced]["round_trips_per_second"] if paced in runs else float(paced or 0)
            result = _run_clients(running.url, name, args, user_base=600000 + index * 10000, rate=rate)
            window = probe.stop()
            result["cpu_ms_per_round_trip"] = _cpu_per_round_trip(window, result["all_round_trips"])
            runs[mode] = result
            print(mode, json.dumps(result), flush=True)
        stop.set()
        server.join(5)
    hook.join(5)
    summary: dict[str, Any] = {mode: {"round_trips_per_second": r["round_trips_per_second"],
                                      "p99_ms": r["latency_ms"]["p99"],
                                      "cpu_ms_per_round_trip": r["cpu_ms_per_round_trip"]["total"]}
                               for mode, r in runs.items()}
    for mode in ("stream", "webhook"):  # against RELIABLE at the same throughput, and flat out
        for baseline in (f"RELIABLE@{mode}", "RELIABLE"):
            if mode in runs and baseline in runs:
                summary[mode][f"cpu_ratio_to_{baseline}"] = round(
                    runs[mode]["cpu_ms_per_round_trip"]["total"] / runs[baseline]["cpu_ms_per_round_trip"]["total"], 2)
    print(json.dumps(summary, indent=2))
    if args.json:
        results_write(args.json, command=command, summary=summary, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
