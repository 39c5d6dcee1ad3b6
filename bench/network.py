"""Cross-domain latency and throughput: the same messages to a user of the sender's own domain, one
hop away and two hops away, side by side in one run, on the four-domain ring of `make network`.

    python -m bench.network [--pairs 20] [--rate 40] [--duration 20] [--burst 100] [--rounds 2] [--json FILE]

The ring (devstack.ring) runs on databases of its own (`switchboard_bench_ring_*`, on the Postgres
server `make run` uses, dropped after) and a Redis server of its own: an operator's data and
`make network`'s are never touched. Senders are ANZ users homed on domain-01; receivers are homed on
domain-01 (same domain), domain-02 (one hop: 01 -> 02) and domain-03 (two hops: 01 -> 02 -> 03).

Per target, per round (the targets take turns, so drift on this shared machine spreads over all):
- latency: `--pairs` sender/receiver pairs, `--rate` messages per second in all, for `--duration`
  seconds; the time from just before the send to the receipt (RELIABLE, no confirmation);
- throughput: every sender sends `--burst` messages back to back; messages per second from the
  first send to the last receipt;
- server CPU per message over the throughput window: every process of every domain (web, worker,
  beat), the Postgres server and the Redis server (bench/cpu.py), over the messages delivered; and
  each domain's own share (its processes and its database's backends), as a domain on a machine of
  its own would pay it: the busiest domain's share bounds what a hop costs there;
- the live copy to the receivers' standby domain (make network's ring gives every range one; the
  "(no standby)" targets run with none): its worst lag in each phase, and how long after the
  phase's last receipt it had caught up (the burst's CPU window ends only then, so the copy's cost
  counts whole).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import websockets

from bench.cpu import CpuProbe
from bench.platform_proc import platform_env, private_redis
from bench.servers import find_postgres, find_redis, free_port
from devstack.ring import Ring
from devstack.ring_plan import STANDBY, domain_name

APP_ID = "app-id-343"
TARGETS = {"same domain": (1, 500_000), "one hop": (2, 1_500_000), "two hops": (3, 3_500_000),
           # The same with no standby domain anywhere (make network's ring gives every range one, so
           # the targets above include the live copy of the receivers' mailboxes to their standby).
           "same domain (no standby)": (1, 500_000), "one hop (no standby)": (2, 1_500_000)}
NO_STANDBY = " (no standby)"
SENDER_BASE = 100


async def _login(url: str, user: str):
    ws = await websockets.connect(url, max_size=None, open_timeout=30)
    await ws.send(json.dumps({"type": "AUTH_CLIENT", "data": {"appId": APP_ID, "userId": user, "token": "t"}}))
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if frame["type"] == "AUTH_CLIENT_REPLY":
            if not frame["data"].get("isAuthenticated"):
                raise SystemExit(f"{user} refused on {url}: {frame}")
            return ws


async def _receive(ws, latencies: list[float], got: dict[str, int], marker: str) -> None:
    async for raw in ws:
        frame = json.loads(raw)
        if frame.get("type") != "MESSAGE":
            continue
        body = json.loads(frame["data"]["content"])
        if body.get("m") != marker:
            continue
        latencies.append(time.time() - body["t"])
        got["n"] += 1


async def _refusals(ws, refused: dict[str, int]) -> None:
    """A sender's answers: counts the sends the server refused (INVALID_MESSAGE: "server busy"
    when its intake is full, a rate limit): those are never stored, so never received."""
    async for raw in ws:
        frame = json.loads(raw)
        if frame.get("type") in ("INVALID_MESSAGE", "GENERAL_ERROR"):
            reason = str((frame.get("data") or {}).get("reason") or (frame.get("data") or {}).get("message") or frame)
            refused[reason[:60]] = refused.get(reason[:60], 0) + 1


class _CopyLag:
    """The live copy's lag at the receivers' home while a phase runs: every 0.25 s, the oldest change
    not yet taken by the standby (messaging_standbyfeed); `stop` waits (up to 30 s) until the copy
    has caught up and says how long after the phase's last receipt that was."""

    def __init__(self, url: str):
        self.url, self.worst, self.samples = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _lag(self, conn) -> tuple[int, float]:
        count, lag = conn.execute("SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)"
                                  " FROM messaging_standbyfeed").fetchone()
        return count, float(lag)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.25):
                self.worst = max(self.worst, self._lag(conn)[1])
                self.samples += 1

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        began = time.monotonic()
        with psycopg.connect(self.url, autocommit=True) as conn:
            while self._lag(conn)[0] and time.monotonic() - began < 30:
                time.sleep(0.1)
            left = self._lag(conn)[0]
        return {"worst_lag_s": round(self.worst, 2), "caught_up_after_s": round(time.monotonic() - began, 2),
                "left": left}


async def _scenario(ring: Ring, target: str, args, round_no: int, probe_groups: dict[str, list[int]]) -> dict:
    domain, receiver_base = TARGETS[target]
    _standbys(ring, on=not target.endswith(NO_STANDBY))
    senders = [await _login(ring.ws_url(1), f"ANZ-{SENDER_BASE + i}") for i in range(args.pairs)]
    receivers = [await _login(ring.ws_url(domain), f"ANZ-{receiver_base + i}") for i in range(args.pairs)]
    result: dict = {"target": target, "round": round_no}
    try:
        # Latency at a modest steady rate.
        latencies: list[float] = []
        got = {"n": 0}
        marker = f"lat-{target}-{round_no}"
        readers = [asyncio.create_task(_receive(ws, latencies, got, marker)) for ws in receivers]
        lag = _CopyLag(ring.database_url(domain))
        interval = args.pairs / args.rate
        sent = 0

        async def steady(i: int) -> None:
            nonlocal sent
            await asyncio.sleep(interval * i / args.pairs)
            deadline = time.monotonic() + args.duration
            while time.monotonic() < deadline:
                body = json.dumps({"m": marker, "t": time.time()})
                await senders[i].send(json.dumps({"type": "MESSAGE", "data": {"to": f"ANZ-{receiver_base + i}",
                                                                               "content": body}}))
                sent += 1
                await asyncio.sleep(interval)

        await asyncio.gather(*(steady(i) for i in range(args.pairs)))
        end = time.monotonic() + 30
        while got["n"] < sent and time.monotonic() < end:
            await asyncio.sleep(0.1)
        ms = sorted(x * 1000 for x in latencies)
        result["latency"] = {"sent": sent, "received": got["n"], "p50_ms": _pct(ms, 50), "p95_ms": _pct(ms, 95),
                             "p99_ms": _pct(ms, 99), "mean_ms": round(statistics.fmean(ms), 1) if ms else None,
                             "standby_copy": lag.stop()}
        for task in readers:
            task.cancel()

        # Throughput: a burst from every sender, with the servers' CPU over it.
        latencies.clear()
        got["n"] = 0
        marker = f"burst-{target}-{round_no}"
        readers = [asyncio.create_task(_receive(ws, latencies, got, marker)) for ws in receivers]
        total = args.pairs * args.burst
        refused: dict[str, int] = {}
        answers = [asyncio.create_task(_refusals(ws, refused)) for ws in senders]
        backends = _backends(ring)
        probe = CpuProbe({**probe_groups, **backends})
        probe.start()
        lag = _CopyLag(ring.database_url(domain))
        began = time.monotonic()

        async def burst(i: int) -> None:
            for _ in range(args.burst):
                body = json.dumps({"m": marker, "t": time.time()})
                await senders[i].send(json.dumps({"type": "MESSAGE", "data": {"to": f"ANZ-{receiver_base + i}",
                                                                               "content": body}}))

        await asyncio.gather(*(burst(i) for i in range(args.pairs)))
        end = time.monotonic() + 120
        while got["n"] < total - sum(refused.values()) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        wall = time.monotonic() - began
        copy = lag.stop()  # the copy's cost counts whole: the window ends after it has caught up
        await asyncio.sleep(1.0)  # the receipts' and sweeps' tails
        window = probe.stop()
        for task in (*readers, *answers):
            task.cancel()
        cpu = {name: window.seconds(name) or 0.0 for name in probe_groups}
        delivered = got["n"]
        own = {f"domain-0{n}": cpu[f"domain-0{n}"] + (window.seconds(f"db:domain-0{n}") or 0.0) for n in ring.domains()}
        result["throughput"] = {"sent": total, "received": delivered, "seconds": round(wall, 2),
                                "per_second": round(delivered / wall, 1) if wall else None,
                                "cpu_ms_per_message": round(sum(cpu.values()) * 1000 / max(delivered, 1), 2),
                                "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()}, "standby_copy": copy,
                                "refused": refused,
                                # Each domain's own processes and its database's backends (a domain
                                # on a machine of its own pays this much): the busiest bounds a hop.
                                "domain_ms_per_message": {d: round(v * 1000 / max(delivered, 1), 2)
                                                          for d, v in own.items()}}
    finally:
        for ws in (*senders, *receivers):
            await ws.close()
    return result


STAGES_SQL = """
SELECT m.content, extract(epoch from m.created_at)::float8, extract(epoch from d.sent_at)::float8
  FROM messaging_message m JOIN messaging_delivery d ON d.message_id = m.id WHERE m.content LIKE %s
"""


async def _stages(ring: Ring, args) -> dict:
    """Where the time of a two-hop message goes: one sender, one receiver on domain-03, `--rate`
    messages per second; each domain's own timestamps (stored: the storing transaction's start;
    forwarded: after the neighbour answered), read from the three databases."""
    sender = await _login(ring.ws_url(1), f"ANZ-{SENDER_BASE}")
    receiver = await _login(ring.ws_url(3), "ANZ-3500000")
    received: dict[str, float] = {}

    async def receive() -> None:
        async for raw in receiver:
            frame = json.loads(raw)
            if frame.get("type") == "MESSAGE":
                received[frame["data"]["content"]] = time.time()

    reader = asyncio.create_task(receive())
    sent: dict[str, float] = {}
    for i in range(int(args.rate * args.duration)):
        content = f"stage-{i}"
        sent[content] = time.time()
        await sender.send(json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-3500000", "content": content}}))
        await asyncio.sleep(1 / args.rate)
    await asyncio.sleep(3)
    reader.cancel()
    await sender.close()
    await receiver.close()
    rows = {}
    for n in (1, 2, 3):
        with psycopg.connect(ring.database_url(n)) as conn:
            rows[n] = {r[0]: r[1:] for r in conn.execute(STAGES_SQL, ["stage-%"]).fetchall()}
    names = ["sent -> stored on 01", "stored on 01 -> 02 answered", "stored on 02 -> 03 answered",
             "stored on 03 -> received", "total"]
    stages: dict[str, list[float]] = {name: [] for name in names}
    for content, t0 in sent.items():
        if content not in received or content not in rows[3]:
            continue
        (s1, f1), (s2, f2), (s3, _) = rows[1][content], rows[2][content], rows[3][content]
        for name, value in zip(names, [s1 - t0, f1 - s1, f2 - s2, received[content] - s3, received[content] - t0],
                               strict=True):
            stages[name].append(value * 1000)
    return {name: {"p50_ms": _pct(sorted(v), 50), "p90_ms": _pct(sorted(v), 90), "n": len(v)}
            for name, v in stages.items()}


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(len(values) * p / 100))], 1)


def _databases(ring: Ring):
    """(domain number, an autocommit connection to its database) for each domain of the ring."""
    for n in ring.domains():
        yield n, psycopg.connect(ring.database_url(n), autocommit=True)


def _standbys(ring: Ring, *, on: bool) -> None:
    """Every domain's distributions with their standby (ring_plan.STANDBY) or with none, on all four
    databases (the meta pull copies the meta domain's): the feed's triggers and the standby's
    acceptance read the table itself, so this counts at once."""
    for _, conn in _databases(ring):
        with conn:
            for home, standby in STANDBY.items():
                conn.execute("UPDATE apps_registry_userdistribution u SET standby_id = (SELECT id FROM"
                             " apps_registry_domain WHERE name = %s AND %s) FROM apps_registry_domain h"
                             " WHERE h.id = u.domain_id AND h.name = %s",
                             [domain_name(standby), on, domain_name(home)])
            if not on:
                conn.execute("DELETE FROM messaging_standbyfeed")  # what the last target left behind


def _no_frame_rate_limit(ring: Ring) -> None:
    """The bench's senders send 300 messages back to back, scenario after scenario: the app's frame
    rate limit (per user) would refuse some ("rate limit exceeded"), and they would never arrive.
    Lifted on all four databases (the meta pull copies the meta domain's)."""
    for _, conn in _databases(ring):
        with conn:
            conn.execute("UPDATE apps_registry_clientapp SET rate_limit_per_second = 100000, rate_limit_burst = 100000")
    time.sleep(6)  # every process's cached app (apps_registry.selectors.SNAPSHOT_TTL, 5 s) has been read again


def _backends(ring: Ring) -> dict[str, list[int]]:
    """Each domain's database backends now ("db:domain-01": pids): the web nodes' and workers'
    connections are kept (DB_CONN_MAX_AGE), so these are the ones that do a burst's work."""
    out = {}
    for n, conn in _databases(ring):
        with conn:
            out[f"db:domain-0{n}"] = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    return out


def _groups(ring: Ring, postgres_url: str, redis_url: str) -> dict[str, list[int]]:
    groups = {f"domain-0{n}": [c.proc.pid for c in ring.children[n] if c.proc is not None] for n in ring.domains()}
    groups["postgres"] = find_postgres(postgres_url)  # the whole server: other databases' work counts too
    groups["redis"] = find_redis(redis_url)
    return groups


def _table(results: list[dict]) -> str:
    lines = ["| target | latency p50 / p95 / p99 (ms) | throughput (msg/s) | server CPU per message (ms) "
             "| busiest domain's own CPU per message (ms) |",
             "|---|---|---|---|---|"]
    base = {}
    for target in TARGETS:
        rows = [r for r in results if r["target"] == target]
        if not rows:
            continue
        p50 = statistics.median(r["latency"]["p50_ms"] for r in rows)
        p95 = statistics.median(r["latency"]["p95_ms"] for r in rows)
        p99 = statistics.median(r["latency"]["p99_ms"] for r in rows)
        tput = statistics.median(r["throughput"]["per_second"] for r in rows)
        cpu = statistics.median(r["throughput"]["cpu_ms_per_message"] for r in rows)
        own = statistics.median(max(r["throughput"]["domain_ms_per_message"].values()) for r in rows)
        base.setdefault("tput", tput)
        base.setdefault("cpu", cpu)
        base.setdefault("own", own)
        lines.append(f"| {target} | {p50} / {p95} / {p99} | {tput:.0f} ({tput / base['tput']:.2f}x) "
                     f"| {cpu:.2f} ({cpu / base['cpu']:.2f}x) | {own:.2f} ({own - base['own']:+.2f}) |")
    return "\n".join(lines)


def ring_ports() -> list[int]:
    """Four free ports for a ring of its own, none of `make run`'s and `make network`'s (8000-8009)."""
    ports: list[int] = []
    while len(ports) < 4:
        port = free_port()
        if port not in ports and not 8000 <= port < 8010:
            ports.append(port)
    return ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--rate", type=float, default=40.0, help="messages per second in all, latency phase")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=100, help="messages per sender, throughput phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--log-dir", type=Path, help="keep every process's log here (default: thrown away)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every domain's processes (repeat it), e.g. WORKER_CONCURRENCY=4")
    parser.add_argument("--stages", action="store_true",
                        help="instead: where a two-hop message's time goes, stage by stage (--rate, --duration)")
    parser.add_argument("--targets", default="same domain,one hop,two hops",
                        help="a comma-separated subset of: " + ", ".join(TARGETS))
    args = parser.parse_args(argv)

    env = platform_env()
    postgres_url = env["DATABASE_URL"]
    with tempfile.TemporaryDirectory(prefix="bench-ring-") as tmp, private_redis(Path(tmp)) as redis_url:
        ports = ring_ports()
        ring = Ring(Path(tmp) / "ring", postgres_url, redis_url, ports=ports, database_prefix="switchboard_bench_ring_",
                    env_overrides={"DEBUG": "false", "DRAIN_SECONDS": "1",
                                   **dict(item.split("=", 1) for item in args.env)}, log_dir=args.log_dir or Path(tmp) / "logs",
                    base_env=env)
        try:
            print(f"starting the ring on ports {ports} ...", flush=True)
            ring.start()
            if args.stages:
                stages = asyncio.run(_stages(ring, args))
                for name, figures in stages.items():
                    print(f"{name:30s} p50 {figures['p50_ms']:7.1f} ms  p90 {figures['p90_ms']:7.1f} ms  ({figures['n']})")
                if args.json:
                    args.json.write_text(json.dumps({"stages": stages, "args": vars(args)}, indent=2, default=str))
                return 0
            groups = _groups(ring, postgres_url, redis_url)
            _no_frame_rate_limit(ring)
            results = []
            for round_no in range(1, args.rounds + 1):
                chosen = [t for t in TARGETS if t in args.targets.split(",")]
                order = chosen if round_no % 2 else list(reversed(chosen))
                for target in order:
                    result = asyncio.run(_scenario(ring, target, args, round_no, groups))
                    print(json.dumps(result), flush=True)
                    results.append(result)
        finally:
            ring.stop()
            ring.reset()
    table = _table(results)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
            "args": vars(args), "results": results, "table": table}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
