"""Reconnect storms: every client dropped at once, then all back and authenticated.

    python -m bench.storm --clients 2000 --web-nodes 1 --rounds 3 [--platform-root PATH ...]
        [--webhooks none|endpoint|both] [--json FILE]

Per platform (this checkout, or each `--platform-root`: a worktree of another commit, for a
before/after comparison run side by side on the same machine in one go), a fresh platform is
started (bench/platform_proc.py: `--web-nodes` web nodes and a worker, on a database and a Redis of
their own) and the demo app is switched to signed tokens (what production uses). The clients
(bench/storm_client.py: bare sockets in `--client-procs` processes, spread over the web nodes
directly, a share `--acks-share` of them in ACK mode) connect and authenticate; then, per round,
all are dropped at once (the socket aborted, no close frame) and reconnect and authenticate again.

`--webhooks endpoint` gives the app one webhook endpoint subscribed to every event (a receiver in
this process that answers 204 at once, bench/webhook_sink.py; an outbound worker makes the calls, as
under `make run`); `--webhooks both` runs each platform twice, without an endpoint and with one, and
reports what the endpoint costs as ratios. Every platform of such a run gets the same outbound
worker and settings (plain http:// to loopback allowed), endpoint or not. The outbound worker makes
the calls during the storms (`--webhook-calls during`, as under `make run`, on the same cores as the
web nodes), or is held stopped (SIGSTOP) until the last storm is over (`--webhook-calls after`:
what recording the events costs the platform, without the calls competing for the machine).

Reported per platform:
- the wall time from the drop to the last client admitted again (median and worst of the rounds);
- server CPU per AUTH_CLIENT, per process kind (web nodes, worker, Postgres, Redis: every process of
  each tree, bench/cpu.py), over the storm window (drop, cleanup, reconnect, authenticate, plus
  `--settle` seconds for the closes' tails), minus an idle baseline measured over a window of the
  same length with the clients held;
- RSS per held connection on the web nodes: their RSS holding every client minus before, over the
  count (after a warm-up of a few connections, so the node's own start-up is not counted);
- what bounds the wall time on a small machine: the client processes' own CPU per admission and how
  busy the whole machine was (every core, every process, other users' too) during the storm;
- with an endpoint: the webhook events recorded per storm (rows, by event), and, at the end of the
  run, how many calls the receiver got (all of them, once the outbound worker caught up).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jwt
import psutil
import psycopg

from bench.cpu import CpuProbe
from bench.platform_proc import OUTBOUND_CONCURRENCY, REPO_ROOT, RunningPlatform, platform_env, platform_processes
from bench.servers import find_postgres, find_redis, free_port
from bench.storm_client import Login, client_process
from bench.webhook_sink import WebhookSink

APP_ID = "app-id-343"
FIRST_USER = 1000
WARMUP_CLIENTS = 20
KINDS = ("web", "worker", "outbound", "postgres", "redis")
WEBHOOK_VARIANTS = {"none": (False,), "endpoint": (True,), "both": (False, True)}
# Every platform of a run with webhooks: the receiver is plain HTTP on loopback, which production
# refuses; and the app may have as many calls in flight as the outbound worker has threads, so no
# call is put back for the beat's sweep (the run has no beat): every call is made once, at once.
WEBHOOK_ENV = {"WEBHOOKS_ALLOW_HTTP": "true", "OUTGOING_ALLOWED_NETWORKS": "127.0.0.0/8",
               "WEBHOOK_APP_CONCURRENCY": str(OUTBOUND_CONCURRENCY)}
DELIVERIES_WAIT = 180.0  # seconds the run waits at its end for the receiver to get every recorded call


def prepare_app(root: Path, env: dict[str, str], endpoint_url: str | None = None) -> str:
    """The demo app on signed tokens, with room for a user's old and new connection at once (and an
    endpoint for every event at `endpoint_url`); its secret."""
    code = ("from apps_registry.models import ClientApp; app = ClientApp.objects.get(app_name='ANZ'); "
            "app.auth_mode = 'signed_token'; app.max_connections_per_user = 10; app.save(); ")
    if endpoint_url:
        code += ("from messaging.webhooks.services import webhook_endpoint_create; "
                 f"webhook_endpoint_create(app_id=app.pk, url={endpoint_url!r}); ")
    code += "print(app.token_secret)"
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=root, env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def webhook_rows(database_url: str) -> dict[str, int]:
    """Webhook deliveries recorded so far, by event."""
    with psycopg.connect(database_url) as conn:
        return dict(conn.execute("SELECT event, count(*) FROM messaging_webhookdelivery GROUP BY event").fetchall())


def settled_webhook_rows(database_url: str, quiet: float = 2.0, timeout: float = 60.0) -> dict[str, int]:
    """Webhook deliveries by event, once no new one has been recorded for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last = webhook_rows(database_url)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = webhook_rows(database_url)
        if now == last:
            break
        last = now
    return last


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in sorted(after.items()) if n - before.get(k, 0)}


def logins(urls: tuple[str, ...], secret: str, count: int, acks_share: float, first: int = FIRST_USER) -> list[Login]:
    exp = int(time.time()) + 3000
    every = round(1 / acks_share) if acks_share > 0 else 0
    return [Login(url=urls[i % len(urls)], user_id=f"ANZ-{first + i}", acks=bool(every) and i % every == 0,
                  token=jwt.encode({"sub": f"ANZ-{first + i}", "exp": exp}, secret, algorithm="HS256"))
            for i in range(count)]


class Clients:
    """The client processes, commanded together."""

    def __init__(self, all_logins: list[Login], procs: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes, self.procs = [], []
        for k in range(procs):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=client_process, args=(child, all_logins[k::procs], APP_ID), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)

    def command(self, what: str) -> list:
        for pipe in self.pipes:
            pipe.send(what)
        return [pipe.recv() for pipe in self.pipes]

    def connect(self) -> tuple[dict[str, int], float | None]:
        outcomes: dict[str, int] = {}
        last = None
        for answer in self.command("connect"):
            for key, n in answer["outcomes"].items():
                outcomes[key] = outcomes.get(key, 0) + n
            if answer["last_admitted"] is not None:
                last = max(last or 0.0, answer["last_admitted"])
        return outcomes, last

    def close(self) -> None:
        self.command("quit")
        for proc in self.procs:
            proc.join(10)


def rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def _groups(running: RunningPlatform) -> dict[str, list[int]]:
    return {"web": running.web_pids, "worker": running.worker_pids, "outbound": list(running.outbound_pids),
            "postgres": find_postgres(running.database_url), "redis": find_redis(running.redis_url)}


def _window(groups: dict[str, list[int]], body) -> tuple[dict[str, float], float, object]:
    """CPU seconds per group over `body`; the "machine" entry is every core's busy time together."""
    probe = CpuProbe(groups)
    probe.start()
    started = time.monotonic()
    result = body()
    window = probe.stop()
    return ({k: window.seconds(k) or 0.0 for k in groups} | {"machine": window.machine_busy_seconds or 0.0},
            time.monotonic() - started, result)


def run_platform(root: Path, args: argparse.Namespace, progress, endpoint: bool = False) -> dict:
    hooks = args.webhooks != "none"
    extra = WEBHOOK_ENV if hooks else {}
    env = {**platform_env(root), **extra}
    name = f"{root.name}{' + endpoint' if endpoint else ''}"
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp, WebhookSink() as sink:
        ports = [free_port() for _ in range(args.web_nodes)]
        with platform_processes(ports[0], Path(tmp), worker_concurrency=args.worker_concurrency,
                                more_ports=tuple(ports[1:]), root=root, extra_env=extra,
                                outbound_worker=hooks) as running:
            env.update(DATABASE_URL=running.database_url, REDIS_URL=running.redis_url)
            secret = prepare_app(root, env, sink.url if endpoint else None)
            held = hooks and args.webhook_calls == "after"
            if held:
                for pid in running.outbound_pids:
                    os.killpg(pid, signal.SIGSTOP)
            groups = _groups(running)
            warm = Clients(logins(running.urls, secret, WARMUP_CLIENTS * args.web_nodes, 0.5, first=900_000), 1)
            warm.connect()
            warm.close()
            progress(f"{name}: warmed up with {WARMUP_CLIENTS * args.web_nodes} clients")
            time.sleep(1)
            clients = Clients(logins(running.urls, secret, args.clients, args.acks_share), args.client_procs)
            rss_before = rss(running.web_pids)
            outcomes, _ = clients.connect()
            time.sleep(args.settle)
            rss_held = rss(running.web_pids)
            progress(f"{name}: {outcomes} held, web RSS +{(rss_held - rss_before) / 1024 / args.clients:.1f} KB each")
            rounds = []
            for r in range(args.rounds):
                recorded_before = webhook_rows(running.database_url) if hooks else {}
                def storm():
                    dropped_at = min(clients.command("drop"))
                    got, last = clients.connect()
                    time.sleep(args.settle)
                    if endpoint and not held:  # the window takes in making the storm's calls (the outbound worker's CPU)
                        sink.wait_for(sum(webhook_rows(running.database_url).values()), DELIVERIES_WAIT)
                    return got, (last - dropped_at) if last else None

                # The client processes are measured too (not counted as server CPU): on a small
                # machine they compete with the servers for the same cores.
                measured = {**groups, "harness": [proc.pid for proc in clients.procs]}
                busy, wall, (got, to_all) = _window(measured, storm)
                idle, _, _ = _window(measured, lambda w=wall: time.sleep(w))
                admitted = got.get("admitted", 0)
                net = {k: max(0.0, busy[k] - idle[k]) for k in groups}
                per_auth = {k: 1000 * net[k] / max(1, admitted) for k in groups}
                rounds.append({"outcomes": got, "to_all_back_s": to_all, "window_s": wall, "busy_cpu_s": busy,
                               "idle_cpu_s": idle, "cpu_ms_per_auth": per_auth,
                               "cpu_ms_per_auth_total": sum(per_auth.values()),
                               "harness_cpu_ms_per_auth": 1000 * busy["harness"] / max(1, admitted),
                               "machine_busy_share": busy["machine"] / (wall * (os.cpu_count() or 1)),
                               # held again after the storm: what the storm left behind, per client
                               "rss_kb_per_connection_after": (rss(running.web_pids) - rss_before) / 1024 / args.clients,
                               "webhooks_recorded": _minus(webhook_rows(running.database_url), recorded_before)
                               if hooks else {}})
                progress(f"{name} round {r + 1}/{args.rounds}: {got} all back in "
                         f"{to_all if to_all is None else round(to_all, 2)} s, "
                         f"{sum(per_auth.values()):.2f} ms CPU/auth ({', '.join(f'{k} {v:.2f}' for k, v in per_auth.items())}); "
                         f"harness {rounds[-1]['harness_cpu_ms_per_auth']:.2f} ms/auth, machine "
                         f"{100 * rounds[-1]['machine_busy_share']:.0f}% busy; web RSS now "
                         f"+{rounds[-1]['rss_kb_per_connection_after']:.1f} KB per client"
                         + (f"; webhooks recorded {rounds[-1]['webhooks_recorded']}" if hooks else ""))
            clients.close()
            if held:
                for pid in running.outbound_pids:
                    os.killpg(pid, signal.SIGCONT)
            webhooks = {}
            if endpoint:
                recorded = settled_webhook_rows(running.database_url)  # the clients' last ends recorded too
                received = sink.wait_for_each(recorded, DELIVERIES_WAIT)
                webhooks = {"recorded": recorded, "received": received}
                progress(f"{name}: webhook calls recorded {recorded}, received {received}")
    return {"root": str(root), "name": name, "endpoint": endpoint, "webhook_calls": args.webhook_calls if hooks else None,
            "clients": args.clients, "web_nodes": args.web_nodes,
            "rss_kb_per_connection": (rss_held - rss_before) / 1024 / args.clients, "held": outcomes,
            "rounds": rounds, "webhooks": webhooks, **summary(rounds)}


def summary(rounds: list[dict]) -> dict:
    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    return {"to_all_back_s_median": med(r["to_all_back_s"] for r in rounds),
            "to_all_back_s_worst": max((r["to_all_back_s"] or float("inf") for r in rounds), default=None),
            "cpu_ms_per_auth_median": med(r["cpu_ms_per_auth_total"] for r in rounds),
            "cpu_ms_per_auth_by_kind": {k: med(r["cpu_ms_per_auth"].get(k) for r in rounds) for k in KINDS},
            "web_cpu_ms_per_auth_rounds": [round(r["cpu_ms_per_auth"]["web"], 3) for r in rounds],
            "harness_cpu_ms_per_auth_median": med(r["harness_cpu_ms_per_auth"] for r in rounds),
            "machine_busy_share_median": med(r["machine_busy_share"] for r in rounds)}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{b / a:.2f}" if a and b is not None else "n/a"


def render(results: list[dict]) -> str:
    lines = ["| platform | clients | web nodes | all back (s, median / worst) | CPU ms/auth | web (rounds) | worker "
             "| outbound | postgres | redis | KB per held connection | harness CPU ms/auth | machine busy |",
             "|" + "---|" * 13]
    for res in results:
        kinds = res["cpu_ms_per_auth_by_kind"]
        web = f"{kinds['web']} ({', '.join(str(v) for v in res['web_cpu_ms_per_auth_rounds'])})"
        lines.append(f"| {res['name']} | {res['clients']} | {res['web_nodes']} | {res['to_all_back_s_median']} / "
                     f"{round(res['to_all_back_s_worst'], 3)} | {res['cpu_ms_per_auth_median']} | {web} | "
                     + " | ".join(str(kinds[k]) for k in KINDS[1:]) + f" | {res['rss_kb_per_connection']:.1f} | "
                     f"{res['harness_cpu_ms_per_auth_median']} | {100 * res['machine_busy_share_median']:.0f}% |")
    hooked = [r for r in results if r["webhooks"]]
    if hooked:
        lines.append("")
        for res in hooked:
            lines.append(f"{res['name']}: webhook calls recorded {res['webhooks']['recorded']}, "
                         f"received {res['webhooks']['received']}")
    pairs = [(a, b) for a, b in zip(results, results[1:], strict=False)
             if a["root"] == b["root"] and not a["endpoint"] and b["endpoint"]]
    if pairs:
        lines.append("")
    for a, b in pairs:
        lines.append(f"{b['name']} / without: web CPU per auth "
                     f"{_ratio(a['cpu_ms_per_auth_by_kind']['web'], b['cpu_ms_per_auth_by_kind']['web'])}, "
                     f"server CPU per auth {_ratio(a['cpu_ms_per_auth_median'], b['cpu_ms_per_auth_median'])}, "
                     f"all back {_ratio(a['to_all_back_s_median'], b['to_all_back_s_median'])}")
    if len(results) == 2 and not pairs:
        a, b = results
        lines.append("")
        lines.append(f"ratios (second / first): all back {b['to_all_back_s_median'] / a['to_all_back_s_median']:.2f}, "
                     f"CPU per auth {b['cpu_ms_per_auth_median'] / a['cpu_ms_per_auth_median']:.2f}, KB per "
                     f"connection {b['rss_kb_per_connection'] / a['rss_kb_per_connection']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--web-nodes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--platform-root", type=Path, action="append",
                        help="run the platform from this checkout (repeat to compare; default: this one)")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--acks-share", type=float, default=0.5, help="share of clients in ACK mode")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after the last admission in a window")
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--webhooks", choices=sorted(WEBHOOK_VARIANTS), default="none",
                        help="the app's webhook endpoint: none, one for every event, or both runs per platform")
    parser.add_argument("--webhook-calls", choices=("during", "after"), default="during",
                        help="the outbound worker makes the calls during the storms, or only after the last one")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    def progress(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    results = [run_platform(root.resolve(), args, progress, endpoint=endpoint)
               for root in (args.platform_root or [REPO_ROOT]) for endpoint in WEBHOOK_VARIANTS[args.webhooks]]
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
