"""Benchmark of the event exchange (issue 19): `manage.py eventsource` (durable graph, on a database
of the run's own) against the naive in-memory broker (bench/exchange_naive.py), same harness.

    python -m bench.exchange --events 100000 --clients 100 --users 1000 [--client-procs 2]

The stream (bench/exchange_model.py) is shuffled within batches of 100; every client connects before
the source starts. Client processes each hold a share of the connections, compute the expected lines
themselves and check that every client got exactly its bytes, in order (and nothing more). Events/s
is end to end: from the source's first byte to the last client's last expected byte. Server CPU is
read from /proc (bench/cpu.py) for the server process and, for ours, Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform as host_platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from analytics.bench_sandbox import bench_database
from bench.cpu import CpuProbe
from bench.exchange_model import clients_choose, events_generate, expected_lines, wire_bytes
from bench.platform_proc import REPO_ROOT, platform_env
from bench.servers import find_postgres
from devstack.embedded import free_port


class _Collect(asyncio.Protocol):
    def __init__(self, want: int, done: asyncio.Event, state: dict) -> None:
        self.chunks: list[bytes] = []
        self.got = 0
        self.want = want
        self.done = done
        self.state = state

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        before = self.got
        self.got += len(data)
        if before < self.want <= self.got:
            self.state["left"] -= 1
            if self.state["left"] == 0:
                self.state["finished"] = time.time()
                self.done.set()


def client_worker(port: int, uids: list[int], n: int, users: int, seed: int, conn) -> None:
    lines = events_generate(n, users, seed)
    expected = {uid: b"".join(v) for uid, v in expected_lines(lines, set(uids)).items()}
    del lines

    async def run() -> dict:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        state = {"left": sum(1 for u in uids if expected[u]), "finished": time.time()}
        protos = {}
        for uid in uids:
            transport, proto = await loop.create_connection(lambda u=uid: _Collect(len(expected[u]), done, state),
                                                            "127.0.0.1", port)
            transport.write(b"%d\n" % uid)
            protos[uid] = proto
        await asyncio.sleep(0.5)  # registered before the source starts
        conn.send("ready")
        if state["left"]:
            try:
                await asyncio.wait_for(done.wait(), 600)
            except TimeoutError:
                pass
        finished = state["finished"]
        await asyncio.sleep(0.5)  # anything extra would arrive now
        bad = [uid for uid, p in protos.items() if b"".join(p.chunks) != expected[uid]]
        return {"finished": finished, "bad": bad, "lines": sum(v.count(b"\n") for v in expected.values())}

    conn.send(asyncio.run(run()))


def wait_output(proc: subprocess.Popen, log: Path, marker: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while marker not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"server did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


def run_one(name: str, argv: list[str], env: dict, marker: str, args, wire: bytes, postgres: list[int],
            log_dir: Path) -> dict:
    event_port, client_port = free_port(), free_port()
    log = log_dir / f"exchange-{name}.log"
    with open(log, "w") as fh:
        server = subprocess.Popen([*argv, "--event-port", str(event_port), "--client-port", str(client_port)],
                                  cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_output(server, log, marker)
        uids = clients_choose(args.users, args.clients, args.seed)
        shares = [uids[i::args.client_procs] for i in range(args.client_procs)]
        pipes, workers = [], []
        for share in shares:
            parent, child = multiprocessing.Pipe()
            worker = multiprocessing.Process(target=client_worker,
                                             args=(client_port, share, args.events, args.users, args.seed, child))
            worker.start()
            pipes.append(parent)
            workers.append(worker)
        for parent in pipes:
            assert parent.recv() == "ready"
        groups = {"server": [server.pid]} | ({"postgres": postgres} if postgres else {})
        probe = CpuProbe(groups)
        probe.start()
        started = time.time()
        with socket.create_connection(("127.0.0.1", event_port)) as source:
            source.sendall(wire)
            results = [parent.recv() for parent in pipes]
        window = probe.stop()
        for worker in workers:
            worker.join(30)
        seconds = max(r["finished"] for r in results) - started
        bad = sum(len(r["bad"]) for r in results)
        cpu = {g: window.seconds(g) or 0.0 for g in groups}
        return {"name": name, "seconds": seconds, "rate": args.events / seconds, "bad": bad,
                "lines": sum(r["lines"] for r in results), "cpu": cpu}
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


def app_create(env: dict, name: str) -> None:
    code = ("from apps_registry.models import ClientApp; "
            f"ClientApp.objects.create(app_name={name!r}, app_id={name.lower()!r}, master_user_id='{name}-0')")
    subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO_ROOT, env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--only", choices=["ours", "naive"])
    args = parser.parse_args()
    log_dir = REPO_ROOT / "var" / "bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    wire = wire_bytes(events_generate(args.events, args.users, args.seed), args.seed)
    env = platform_env()
    rows = []
    with bench_database(env["DATABASE_URL"]) as database_url:
        env["DATABASE_URL"] = database_url
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO_ROOT, env=env,
                       check=True)
        app_create(env, "XBENCH")
        if args.only in (None, "ours"):
            rows.append(run_one("eventsource", [sys.executable, "manage.py", "eventsource", "--app", "XBENCH",
                                                "--no-intake"], env, "eventsource ready", args, wire,
                                find_postgres(database_url), log_dir))
        if args.only in (None, "naive"):
            rows.append(run_one("naive", [sys.executable, "-m", "bench.exchange_naive"], env, "naive ready", args,
                                wire, [], log_dir))
    print(f"\n{args.events} events, {args.clients} clients of {args.users} users, {args.client_procs} client "
          f"processes; {host_platform.processor() or host_platform.machine()}, {os.cpu_count()} cores")
    print("| server | events/s | seconds | lines checked | wrong clients | server CPU µs/event | Postgres CPU µs/event |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        pg = r["cpu"].get("postgres")
        print(f"| {r['name']} | {r['rate']:,.0f} | {r['seconds']:.2f} | {r['lines']:,} | {r['bad']} | "
              f"{r['cpu']['server'] / args.events * 1e6:.1f} | {'' if pg is None else f'{pg / args.events * 1e6:.1f}'} |")
    if any(r["bad"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
