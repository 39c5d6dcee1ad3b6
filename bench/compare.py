"""Switchboard (RELIABLE and FAST) against the baseline relay, under the same load, in one run.

The relay is always started here (a daphne subprocess on a free port). The platform is either the
caller's (`--platform-url`, e.g. a running `make run`) or, with `--start-platform`, a web node and a
worker started here on the embedded services, with DEBUG off (what `make bench` does).

    python -m bench.compare --platform-url ws://127.0.0.1:8000/ws --redis-url redis://127.0.0.1:6380/0 \
        --connections 200 --rates 400,800,1200 --duration 20 --write-docs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.chart import Point, Series, render_chart
from bench.loadtest import add_load_arguments, config_from_args, result_to_json, run_loadtest
from bench.report import Row, benchmarks_markdown, best_rates, best_table, results_table

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs"
TARGETS = ("platform-RELIABLE", "platform-FAST", "relay")
# Lets the servers finish closing the previous run's sockets before the next run connects.
PAUSE_BETWEEN_RUNS = 2.0
# An overloaded target goes on working through its backlog after its run ends (the relay's
# channel layer, a platform's queued routing tasks). The next run, of another target, waits until
# the machine is quiet again, so it does not pay for its predecessor.
SETTLE_BUSY_BELOW = 0.25
SETTLE_MAX_SECONDS = 60.0


@dataclass(frozen=True)
class Target:
    name: str  # "platform" or "relay"
    feature: str  # what is sent; the relay ignores it
    url: str

    @property
    def shown_feature(self) -> str:
        return "-" if self.name == "relay" else self.feature


# -- the relay subprocess -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def relay_server(redis_url: str, log_path: Path, port: int | None = None) -> Iterator[str]:
    """Run `daphne bench.relay.asgi:application` for the duration of the block; yield its URL."""
    port = port or free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.relay.settings",
        "REDIS_URL": redis_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "bench.relay.asgi:application"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        _wait_for_relay(proc, port, log_path)
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_relay(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the relay exited with code {proc.returncode}:\n{log_path.read_text()}")
        if port_open("127.0.0.1", port):
            return
        time.sleep(0.2)
    raise SystemExit(f"the relay did not listen on port {port} within 20 s; log: {log_path}")


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


def sweep(args: argparse.Namespace, targets: list[Target]) -> list[Row]:
    rows: list[Row] = []
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
                user_base=args.user_base + run_index * args.connections,
            )
            row = Row(rate=rate, target=target.name, feature=target.shown_feature, result=run_loadtest(config))
            rows.append(row)
            run_index += 1
            print(summary_line(row), flush=True)
            time.sleep(PAUSE_BETWEEN_RUNS)
            settle()
        best = best_rates(rows, args.p99_budget_ms)
        print(
            "  highest rate so far with zero loss and p99 < "
            f"{args.p99_budget_ms:g} ms: " + "; ".join(f"{label} {_rate(rate)}" for label, rate in best.items()),
            flush=True,
        )
    return rows


def chart_svg(rows: list[Row], args: argparse.Namespace) -> str:
    labels = list(dict.fromkeys(row.label for row in rows))
    series = [
        Series(label, [Point(r.rate, r.result.p99_ms, r.result.lost) for r in rows if r.label == label])
        for label in labels
    ]
    title = f"p99 round trip vs offered rate ({args.connections} connections, {args.payload}-char messages)"
    return render_chart(series, title, args.p99_budget_ms)


def write_docs(rows: list[Row], args: argparse.Namespace, command: str) -> None:
    params = {
        "connections": f"{args.connections} over {args.processes} load-generator processes",
        "payload": f"{args.payload} characters",
        "duration": f"{args.duration:g} s of sending per run, the first {args.warmup:g} s a warmup",
        "drain": f"up to {args.drain:g} s for stragglers",
        "users": f"{args.app_name}-<n> of app {args.app_id}, from n = {args.user_base}",
        "confirmation": "off" if args.no_confirmation else "on (protocol default)",
    }
    markdown = benchmarks_markdown(rows=rows, budget_ms=args.p99_budget_ms, command=command, params=params)
    DOCS.mkdir(exist_ok=True)
    (DOCS / "benchmarks.md").write_text(markdown)
    (DOCS / "benchmark-chart.svg").write_text(chart_svg(rows, args))
    print(f"wrote {DOCS / 'benchmarks.md'} and {DOCS / 'benchmark-chart.svg'}")


# -- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform-url", default="ws://127.0.0.1:8000/ws", help="the running Switchboard")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL"),
        help="Redis for the relay's channel layer (default: $REDIS_URL)",
    )
    parser.add_argument(
        "--rates",
        type=parse_rates,
        default=parse_rates("400,800,1200"),
        help="offered messages/s, comma-separated; connections stay fixed, the interval varies",
    )
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"comma-separated subset of {','.join(TARGETS)}, run in this order at each rate",
    )
    parser.add_argument("--relay-port", type=int, help="port for the relay (default: a free one)")
    parser.add_argument("--start-platform", action="store_true",
                        help="start a web node and a worker here (DEBUG off) instead of using --platform-url")
    parser.add_argument("--p99-budget-ms", type=float, default=250.0)
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md and the SVG chart")
    parser.add_argument("--json", type=Path, help="also write every run's full result as JSON")
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    args.target_names = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(args.target_names) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {TARGETS}")
    if args.start_platform and not args.redis_url:
        from bench.platform_proc import platform_env

        args.redis_url = platform_env()["REDIS_URL"]
    if "relay" in args.target_names and not args.redis_url:
        parser.error(
            "the relay needs Redis: pass --redis-url or set REDIS_URL "
            "(`python -m config.embedded urls` prints the platform's embedded one, starting it if needed)"
        )
    return args


def build_targets(names: list[str], platform_url: str, relay_url: str | None) -> list[Target]:
    targets = []
    for name in names:
        if name == "relay":
            assert relay_url is not None
            targets.append(Target("relay", "FAST", relay_url))
        else:
            targets.append(Target("platform", name.split("-", 1)[1], platform_url))
    return targets


def check_platform(url: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "wss" else 80)
    if not port_open(host, port):
        raise SystemExit(f"nothing listens at {url}; start the platform first (`make run` in the repo root)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench.compare " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp, ExitStack() as stack:
        if args.start_platform:
            from bench.platform_proc import platform_processes

            args.platform_url = stack.enter_context(platform_processes(free_port(), Path(tmp)))
            print(f"platform listening at {args.platform_url} (logs in {tmp})", flush=True)
        if any(n.startswith("platform") for n in args.target_names):
            check_platform(args.platform_url)
        log_path = Path(tmp) / "relay.log"
        if "relay" in args.target_names:
            with relay_server(args.redis_url, log_path, args.relay_port) as relay_url:
                print(f"relay listening at {relay_url} (log {log_path})", flush=True)
                rows = sweep(args, build_targets(args.target_names, args.platform_url, relay_url))
        else:
            rows = sweep(args, build_targets(args.target_names, args.platform_url, None))
    print()
    print(results_table(rows, args.p99_budget_ms))
    print()
    print(best_table(rows, args.p99_budget_ms))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"rate": r.rate, "target": r.target, "feature": r.feature, "result": result_to_json(r.result)}
                    for r in rows
                ],
                indent=2,
            )
            + "\n"
        )
    if args.write_docs:
        write_docs(rows, args, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
