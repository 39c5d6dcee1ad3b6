"""Switchboard (RELIABLE and FAST) against two baseline relays, under the same load, in one run.

The relays are always started here (daphne subprocesses on free ports): `relay-core` on Channels'
core Redis layer and `relay-pubsub` on its pub/sub layer. The platform is either the caller's
(`--platform-url`, e.g. a running `make run`) or, with `--start-platform`, a web node and a worker
started here with DEBUG off, on a database (on the embedded Postgres, or DATABASE_URL's server) and
a Redis of its own, both gone after the run (what `make bench` does; bench/platform_proc.py). Every run reports
the servers' CPU per delivered message, split by process group (see bench/cpu.py).

    python -m bench.compare --start-platform --no-confirmation --connections 200 --rates 300,400,600 \
        --duration 20 --warmup 5 --processes 2 --json out.json --write-docs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.chart import Point, Series, render_chart, render_cpu_chart
from bench.cpu import CpuProbe, cmdline, platform_roots
from bench.loadtest import WindowHooks, add_load_arguments, config_from_args, run_loadtest
from bench.loop_lag import LagProbe
from bench.report import (
    MARKER_END,
    MARKER_START,
    Row,
    benchmarks_markdown,
    best_rates,
    best_table,
    cpu_table,
    load_rows,
    machine_info,
    ratio_sentence,
    reference_rate,
    results_table,
    row_to_json,
    server_cpu_text,
    splice_generated,
    split_text,
)
from bench.servers import REPO_ROOT, RunningRelay, find_postgres, find_redis, free_port, port_open, relay_server

DOCS = REPO_ROOT / "docs"
CPU_CHART = Path("bench") / "cpu-chart.svg"  # relative to docs/
TARGETS = ("platform-RELIABLE", "platform-FAST", "relay-core", "relay-pubsub")  # the default run
# On request (--targets): the platform through Socket.IO over WebSocket (docs/benchmarks.md, issue 28).
SOCKETIO_TARGETS = ("socketio-RELIABLE", "socketio-FAST")
PLATFORM_TARGETS = ("platform", "socketio")  # the platform by /ws, and by Socket.IO over WebSocket
# `relay` was the only relay before the pub/sub one joined; old commands keep working.
TARGET_ALIASES = {"relay": "relay-core"}
RELAY_LAYERS = {"relay-core": "core", "relay-pubsub": "pubsub"}
PLATFORM_GROUPS = ("web", "worker", "postgres", "redis")
# Lets the servers finish closing the previous run's sockets before the next run connects.
PAUSE_BETWEEN_RUNS = 2.0
# An overloaded target goes on working through its backlog after its run ends (the relay's
# channel layer, a platform's queued routing tasks). The next run, of another target, waits until
# the machine is quiet again, so it does not pay for its predecessor.
SETTLE_BUSY_BELOW = 0.25
SETTLE_MAX_SECONDS = 60.0


@dataclass(frozen=True)
class Target:
    name: str  # "platform", "socketio", "relay-core" or "relay-pubsub"
    feature: str  # what is sent; a relay ignores it
    url: str
    server_groups: Mapping[str, str] = field(default_factory=dict)  # role -> measured group name

    @property
    def is_relay(self) -> bool:
        return self.name in RELAY_LAYERS

    @property
    def shown_feature(self) -> str:
        return "-" if self.is_relay else self.feature


# -- which processes are whose --------------------------------------------------------------------


def parse_pids(text: str) -> dict[str, list[int]]:
    """`web=123,web=124,worker=130` -> {"web": [123, 124], "worker": [130]}."""
    groups: dict[str, list[int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, pid = part.partition("=")
        if not sep or name not in PLATFORM_GROUPS or not pid.isdigit():
            raise argparse.ArgumentTypeError(
                f"--platform-pids takes GROUP=PID pairs with GROUP in {', '.join(PLATFORM_GROUPS)}, e.g. web=123,worker=130"
            )
        groups.setdefault(name, []).append(int(pid))
    return groups


def measured_groups(
    args: argparse.Namespace,
    platform: Mapping[str, list[int]] | None,
    relays: Mapping[str, RunningRelay],
    platform_redis_url: str | None,
    platform_database_url: str | None,
) -> tuple[dict[str, list[int]], dict[str, dict[str, str]]]:
    """Root pids of every group to sample, and per target which groups are its server.

    Every run samples every group: the ones that are not the target's server show what the idle
    servers cost meanwhile (kept in the JSON as background).
    """
    groups: dict[str, list[int]] = {}
    server: dict[str, dict[str, str]] = {}
    if platform is not None:
        given = args.platform_pids
        found = {
            "web": given.get("web") or platform.get("web", []),
            "worker": given.get("worker") or platform.get("worker", []),
            "postgres": given.get("postgres") or find_postgres(platform_database_url),
            "redis": given.get("redis") or find_redis(platform_redis_url),
        }
        missing = [g for g, pids in found.items() if not pids]
        if missing:
            print(f"warning: no processes found for {', '.join(missing)}; their CPU is not counted "
                  "and totals are marked ≥ (pass --platform-pids GROUP=PID)", flush=True)
        groups.update({g: pids for g, pids in found.items() if pids})
        # A group that was not found stays in the split, so the report marks the total incomplete.
        server["platform"] = {g: g for g in PLATFORM_GROUPS}
    if relays:
        relay_redis = find_redis(args.redis_url)
        redis_group = "redis"
        if relay_redis != groups.get("redis", relay_redis):
            redis_group = "relay-redis"  # the relays were pointed at another Redis than the platform's
        if relay_redis:
            groups[redis_group] = relay_redis
        else:
            print(f"warning: no redis-server found for {args.redis_url}; the relays' Redis CPU is not counted",
                  flush=True)
        for name, relay in relays.items():
            groups[name] = [relay.pid]
            server[name] = {"relay": name, "redis": redis_group}
    return groups, server


def describe_groups(groups: Mapping[str, list[int]]) -> str:
    lines = []
    for name, pids in groups.items():
        shown = ", ".join(f"{pid} ({' '.join(cmdline(pid)[:4])[:70]})" for pid in pids) or "not found"
        lines.append(f"  {name:<13} {shown}")
    return "CPU groups (root pids; descendants are found at each sample):\n" + "\n".join(lines)


# -- the sweep ------------------------------------------------------------------------------------


def parse_rates(text: str) -> list[float]:
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError("--rates takes positive numbers, e.g. 400,800,1200")
    return rates


def _rate(rate: float | None) -> str:
    return "none" if rate is None else f"{rate:g}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def summary_line(row: Row) -> str:
    r = row.result
    return (
        f"rate {row.rate:g}/s {row.label:<18} sent {r.sent} received {r.received} lost {r.lost} "
        f"errors {r.error_count} | p50 {_ms(r.p50_ms)} p95 {_ms(r.p95_ms)} p99 {_ms(r.p99_ms)} "
        f"max {_ms(r.max_ms)} ms | achieved {r.achieved_rate:.0f}/s, send lag p99 {_ms(r.send_lag_p99_ms)} ms"
        + (f" | {row.loop_lag.summary()}" if row.loop_lag else "")
    )


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def settle() -> float:
    """Wait (up to SETTLE_MAX_SECONDS) until the machine is under SETTLE_BUSY_BELOW busy for a second."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_MAX_SECONDS:
        busy0, total0 = _cpu_times()
        time.sleep(1.0)
        busy1, total1 = _cpu_times()
        if total1 > total0 and (busy1 - busy0) / (total1 - total0) < SETTLE_BUSY_BELOW:
            break
    return time.monotonic() - started


class Runs:
    """The rows so far, and the JSON file rewritten after every run: a sweep that dies at minute 18
    keeps what it measured."""

    def __init__(self, path: Path | None, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta
        self.rows: list[Row] = []

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            document = {**self.meta, "runs": [row_to_json(r) for r in self.rows]}
            self.path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def cpu_line(row: Row) -> str:
    if row.cpu is None:
        return "  server CPU: not measured"
    r = row.result
    background = {
        name: usage.seconds for name, usage in row.cpu.groups.items() if name not in row.server_groups.values()
    }
    idle = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in background.items())
    exits = sum(u.unreaped_exits for u in row.cpu.groups.values())
    other = row.other_cores()
    return (
        f"  server CPU {server_cpu_text(row)} ms/msg ({split_text(row)}) over {row.cpu.wall_seconds:.1f} s"
        f"; load generator {r.client_cpu_cores:.2f} cores while sending"
        + (f"; idle others: {idle}" if idle else "")
        + (f"; {exits} unreaped exits" if exits else "")
        + ("" if other is None else f"; other processes ~{other:.2f} cores")
    )


def sweep(args: argparse.Namespace, targets: list[Target], groups: Mapping[str, list[int]], runs: Runs) -> list[Row]:
    run_index = 0
    for rate in args.rates:
        interval_ms = args.connections * 1000.0 / rate
        for target in targets:
            # A fresh block of users per run: a RELIABLE message lost in one run must not be
            # delivered into the next (it would be counted as stale, but it would still cost time).
            config = config_from_args(
                args,
                url=target.url,
                interval_ms=interval_ms,
                feature=target.feature,
                protocol="socketio" if target.name == "socketio" else "ws",
                user_base=args.user_base + run_index * args.connections,
            )
            probe = CpuProbe(groups)
            lag = LagProbe(None if target.is_relay else target.url, scrape_every=args.scrape_every)

            def window_start(probe=probe, lag=lag) -> None:
                probe.start()
                lag.start()

            def window_end(probe=probe, lag=lag) -> None:
                probe.stop()
                lag.stop()

            result = run_loadtest(config, WindowHooks(at_start=window_start, after_drain=window_end))
            row = Row(
                rate=rate,
                target=target.name,
                feature=target.shown_feature,
                result=result,
                cpu=probe.window,
                server_groups=target.server_groups,
                loop_lag=lag.window,
            )
            runs.add(row)
            run_index += 1
            print(summary_line(row), flush=True)
            print(cpu_line(row), flush=True)
            time.sleep(PAUSE_BETWEEN_RUNS)
            settle()
        best = best_rates(runs.rows, args.p99_budget_ms)
        print(
            "  highest rate so far with zero loss and p99 < "
            f"{args.p99_budget_ms:g} ms: " + "; ".join(f"{label} {_rate(rate)}" for label, rate in best.items()),
            flush=True,
        )
    return runs.rows


def _series(rows: list[Row], value: Any) -> list[Series]:
    labels = list(dict.fromkeys(row.label for row in rows))
    return [Series(label, [Point(r.rate, value(r), r.result.lost) for r in rows if r.label == label]) for label in labels]


def _load_shape(rows: list[Row]) -> str:
    first = rows[0].result if rows else None
    return "" if first is None else f" ({first.connections} connections, {first.payload}-char messages)"


def chart_svg(rows: list[Row], budget_ms: float) -> str:
    title = f"p99 round trip vs offered rate{_load_shape(rows)}"
    return render_chart(_series(rows, lambda r: r.result.p99_ms), title, budget_ms)


def cpu_chart_svg(rows: list[Row]) -> str:
    title = f"server CPU per delivered message vs offered rate{_load_shape(rows)}"
    return render_cpu_chart(_series(rows, lambda r: r.server_ms()[0]), title)


def load_params(args: argparse.Namespace) -> dict[str, str]:
    return {
        "connections": f"{args.connections} over {args.processes} load-generator processes",
        "payload": f"{args.payload} characters",
        "duration": f"{args.duration:g} s of sending per run, the first {args.warmup:g} s a warmup",
        "drain": f"up to {args.drain:g} s for stragglers",
        "users": f"{args.app_name}-<n> of app {args.app_id}, from n = {args.user_base}",
        "confirmation": "off" if args.no_confirmation else "on (protocol default)",
    }


def write_docs(
    rows: list[Row], *, command: str, machine: dict[str, str], params: dict[str, str], budget_ms: float,
    reference: float,
) -> None:
    """Rewrite the generated region of docs/benchmarks.md (between the markers) and the charts."""
    generated = benchmarks_markdown(
        rows=rows,
        budget_ms=budget_ms,
        command=command,
        params=params,
        reference=reference,
        machine=machine,
        cpu_chart=CPU_CHART.as_posix(),
    )
    path = DOCS / "benchmarks.md"
    existing = path.read_text() if path.exists() else None
    (DOCS / CPU_CHART).parent.mkdir(parents=True, exist_ok=True)
    path.write_text(splice_generated(existing, generated))
    (DOCS / "benchmark-chart.svg").write_text(chart_svg(rows, budget_ms))
    (DOCS / CPU_CHART).write_text(cpu_chart_svg(rows))
    print(f"wrote the region between {MARKER_START} and {MARKER_END} of {path}, "
          f"{DOCS / 'benchmark-chart.svg'} and {DOCS / CPU_CHART}")


def docs_from_json(path: Path) -> int:
    """--from-json: the docs of a saved sweep, without running anything (e.g. after a report change)."""
    rows, meta = load_rows(path)
    if not meta:
        raise SystemExit(f"{path} has no metadata (written before --json carried it); run the sweep again")
    write_docs(rows, command=meta["command"], machine=meta["machine"], params=meta["params"],
               budget_ms=meta["p99_budget_ms"], reference=meta["reference_rate"])
    return 0


def git_info() -> dict[str, str | bool | None]:
    """Which code ran. `platform_commit` is the last commit that changed anything but the harness
    and the docs: the code under test, even when the harness itself has moved on."""

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *argv], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    harness = [":(exclude)bench", ":(exclude)docs", ":(exclude)tests/bench", ":(exclude)Makefile"]
    return {
        "head": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "platform_commit": git("log", "-1", "--format=%H", "--", ".", *harness),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


# -- command line ---------------------------------------------------------------------------------


def parse_targets(text: str) -> list[str]:
    names = [TARGET_ALIASES.get(t.strip(), t.strip()) for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in TARGETS + SOCKETIO_TARGETS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown targets {unknown}; choose from "
                                         f"{', '.join(TARGETS + SOCKETIO_TARGETS)} (relay = relay-core)")
    return list(dict.fromkeys(names))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform-url", default="ws://127.0.0.1:8000/ws", help="the running Switchboard")
    parser.add_argument(
        "--platform-pids",
        type=parse_pids,
        default={},
        help="root pids of the running platform's process groups, e.g. web=123,worker=130 (repeat a group "
        "for several nodes; descendants are included). Default: web nodes and Celery workers whose working "
        "directory is this checkout, and this checkout's embedded Postgres and Redis",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL"),
        help="Redis for the relays' channel layers (default: $REDIS_URL)",
    )
    parser.add_argument(
        "--rates",
        type=parse_rates,
        default=parse_rates("400,800,1200"),
        help="offered messages/s, comma-separated; connections stay fixed, the interval varies",
    )
    parser.add_argument(
        "--targets",
        type=parse_targets,
        default=list(TARGETS),
        help=f"comma-separated subset of {','.join(TARGETS + SOCKETIO_TARGETS)} (relay = relay-core; "
             "the default: the first four), run in this order at each rate",
    )
    parser.add_argument("--relay-port", type=int, help="port for relay-core (default: a free one)")
    parser.add_argument("--relay-pubsub-port", type=int, help="port for relay-pubsub (default: a free one)")
    parser.add_argument("--start-platform", action="store_true",
                        help="start a web node and a worker here (DEBUG off) instead of using --platform-url")
    parser.add_argument("--p99-budget-ms", type=float, default=250.0)
    parser.add_argument("--reference-rate", type=float, default=300.0,
                        help="rate of the CPU summary table (default 300; the lowest rate if the sweep lacks it)")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite the generated region of docs/benchmarks.md and the SVG charts")
    parser.add_argument("--json", type=Path, help="also write every run's full result as JSON (after every run)")
    parser.add_argument("--scrape-every", type=float, default=5.0, metavar="SECONDS",
                        help="scrape the web node's /metrics this often during each measured window, as a "
                             "deployment's Prometheus would (default 5; 0: only at the window's ends)")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="run nothing: rewrite the docs region and charts from a saved --json file")
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    args.target_names = args.targets
    if args.from_json:
        return args
    # With --start-platform the relays use the started platform's own Redis unless told otherwise.
    if any(n in RELAY_LAYERS for n in args.target_names) and not (args.redis_url or args.start_platform):
        parser.error(
            "the relays need Redis: pass --redis-url or set REDIS_URL "
            "(`python -m devstack.embedded urls` prints the platform's embedded one, starting it if needed)"
        )
    return args


def build_targets(
    names: list[str], platform_url: str, relays: Mapping[str, RunningRelay], server: Mapping[str, dict[str, str]]
) -> list[Target]:
    targets = []
    for name in names:
        if name in RELAY_LAYERS:
            targets.append(Target(name, "FAST", relays[name].url, server.get(name, {})))
        else:
            kind, feature = name.split("-", 1)
            targets.append(Target(kind, feature, platform_url, server.get("platform", {})))
    return targets


def check_platform(url: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "wss" else 80)
    if not port_open(host, port):
        raise SystemExit(f"nothing listens at {url}; start the platform first (`make run` in the repo root)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return docs_from_json(args.from_json)
    command = "python -m bench.compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    machine = machine_info()
    wants_platform = any(n.startswith(PLATFORM_TARGETS) for n in args.target_names)
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp, ExitStack() as stack:
        platform: dict[str, list[int]] | None = None
        database_url = os.environ.get("DATABASE_URL")
        platform_redis_url = os.environ.get("REDIS_URL")
        if args.start_platform:
            from bench.platform_proc import platform_processes

            running = stack.enter_context(platform_processes(free_port(), Path(tmp)))
            args.platform_url = running.url
            args.redis_url = args.redis_url or running.redis_url
            platform = {"web": running.web_pids, "worker": running.worker_pids}
            database_url, platform_redis_url = running.database_url, running.redis_url
            print(f"platform listening at {args.platform_url} on a database and a Redis of its own, dropped after "
                  f"the run (logs in {tmp})", flush=True)
        elif wants_platform:
            check_platform(args.platform_url)
            platform = platform_roots(REPO_ROOT)
        relays: dict[str, RunningRelay] = {}
        for name, layer in RELAY_LAYERS.items():
            if name in args.target_names:
                port = args.relay_port if name == "relay-core" else args.relay_pubsub_port
                log_path = Path(tmp) / f"{name}.log"
                relays[name] = stack.enter_context(relay_server(args.redis_url, log_path, port, layer))
                print(f"{name} listening at {relays[name].url} (log {log_path})", flush=True)
        groups, server = measured_groups(args, platform if wants_platform else None, relays, platform_redis_url,
                                         database_url)
        print(describe_groups(groups), flush=True)
        meta = {
            "command": command,
            "machine": machine,
            "git": git_info(),
            "params": load_params(args),
            "p99_budget_ms": args.p99_budget_ms,
            "reference_rate": args.reference_rate,
            "cpu_groups": groups,
        }
        runs = Runs(args.json, meta)
        rows = sweep(args, build_targets(args.target_names, args.platform_url, relays, server), groups, runs)
    print()
    print(results_table(rows, args.p99_budget_ms))
    ref = reference_rate(rows, args.reference_rate)
    if ref is not None:
        print()
        print(cpu_table(rows, ref))
        print(ratio_sentence(rows, ref))
    print()
    print(best_table(rows, args.p99_budget_ms))
    if args.write_docs:
        write_docs(rows, command=command, machine=machine, params=load_params(args), budget_ms=args.p99_budget_ms,
                   reference=args.reference_rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
