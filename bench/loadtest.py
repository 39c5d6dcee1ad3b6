"""Load test in the shape of the linker seed's benchmark.

N connections spread over several processes; each authenticates as its own user and sends a
MESSAGE to itself every T ms with a fixed-size payload; latency is the time from just before the
send to the receipt of the same message.

    python -m bench.loadtest --url ws://127.0.0.1:8000/ws --connections 200 --interval-ms 500 \
        --duration 30 --warmup 5 --feature RELIABLE --processes 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from bench.model import FEATURES, LoadConfig, LoadResult, WorkerPlan, WorkerResult, merge_results
from bench.worker import DrainSync, worker_main

# Give every process time to open its connections, and the parent a moment to broadcast the start.
START_DELAY = 1.0
SLACK = 30.0


def plan_workers(config: LoadConfig) -> list[WorkerPlan]:
    """Split connections into contiguous blocks, as evenly as possible."""
    processes = min(config.processes, config.connections)
    base, extra = divmod(config.connections, processes)
    plans, first = [], 0
    for index in range(processes):
        count = base + (1 if index < extra else 0)
        plans.append(WorkerPlan(index=index, first_connection=first, connections=count))
        first += count
    return plans


def _cpu_busy_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies from /proc/stat; None where there is no /proc."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _busy_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class WindowHooks:
    """Called in the parent at the measured window's ends: when sending starts (every connection is
    up and authenticated) and when every process has drained (its sockets are still open)."""

    at_start: Callable[[], object] = _nothing
    after_drain: Callable[[], object] = _nothing


class _Run:
    """The parent's side of one load test: spawn, synchronise the start, collect."""

    def __init__(self, config: LoadConfig, hooks: WindowHooks) -> None:
        self.config = config
        self.hooks = hooks
        # spawn, not fork: workers start with a clean interpreter and no inherited event loop.
        self.ctx = mp.get_context("spawn")
        self.ready: Any = self.ctx.Queue()
        self.results: Any = self.ctx.Queue()
        self.start_event = self.ctx.Event()
        self.start_at = self.ctx.Value("d", 0.0)
        self.sync = DrainSync(drained=self.ctx.Queue(), release=self.ctx.Event())
        self.plans = plan_workers(config)
        self.procs: list[BaseProcess] = []

    def execute(self) -> LoadResult:
        run_id = secrets.token_hex(3)
        for plan in self.plans:
            proc = self.ctx.Process(
                target=worker_main,
                args=(self.config, plan, run_id, self.ready, self.results, self.start_event, self.start_at, self.sync),
                name=f"loadtest-{plan.index}",
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        try:
            go = self._await_ready()
            start_wall = time.time() + START_DELAY if go else -1.0
            self.start_at.value = start_wall
            self.start_event.set()
            busy = None
            if go:
                busy = self._measure_cpu(start_wall)
                self._await_drained()
                self.hooks.after_drain()
            self.sync.release.set()  # the workers may close their sockets and report
            workers = self._collect()
        finally:
            self.sync.release.set()  # after an error too, so no worker waits out its timeout
            self._reap()
        return merge_results(self.config, workers, busy)

    def _await_ready(self) -> bool:
        """True once every worker has opened its connections; False if one crashed or hung."""
        largest = max(p.connections for p in self.plans)
        deadline = time.monotonic() + largest / self.config.ramp_rate + self.config.connect_timeout + SLACK
        waiting = {p.index for p in self.plans}
        while waiting and time.monotonic() < deadline:
            try:
                index, opened = self.ready.get(timeout=0.5)
            except queue.Empty:
                if not all(p.is_alive() for p in self.procs):
                    return False
                continue
            if opened < 0:
                return False
            waiting.discard(index)
        return not waiting

    def _measure_cpu(self, start_wall: float) -> float | None:
        time.sleep(max(0.0, start_wall - time.time()))
        self.hooks.at_start()
        before = _cpu_busy_ticks()
        time.sleep(self.config.duration)
        return _busy_fraction(before, _cpu_busy_ticks())

    def _await_drained(self) -> None:
        """Until every worker has drained, or died, or the drain is long overdue."""
        deadline = time.monotonic() + self.config.drain + SLACK
        waiting = {p.index for p in self.plans}
        while waiting and time.monotonic() < deadline:
            try:
                waiting.discard(self.sync.drained.get(timeout=0.2))
            except queue.Empty:
                waiting = {i for i in waiting if self.procs[i].is_alive()}

    def _collect(self) -> list[WorkerResult]:
        deadline = time.monotonic() + self.config.drain + SLACK + 10
        collected: dict[int, WorkerResult] = {}
        while len(collected) < len(self.plans) and time.monotonic() < deadline:
            try:
                result: WorkerResult = self.results.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in self.procs):
                    break
                continue
            collected[result.index] = result
        for plan in self.plans:
            if plan.index not in collected:
                collected[plan.index] = WorkerResult(
                    index=plan.index,
                    connections_planned=plan.connections,
                    failure=f"worker {plan.index} sent no result (crashed or timed out)",
                )
        return [collected[i] for i in sorted(collected)]

    def _reap(self) -> None:
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():  # only our own children, by handle
                proc.terminate()
                proc.join(timeout=5)


def run_loadtest(config: LoadConfig, hooks: WindowHooks | None = None) -> LoadResult:
    config.validate()
    return _Run(config, hooks or WindowHooks()).execute()


# -- reporting ------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_report(result: LoadResult) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(result.errors.items())) or "none"
    other = ", ".join(f"{k} {v}" for k, v in sorted(result.other_frames.items())) or "none"
    busy = "-" if result.machine_cpu_busy is None else f"{result.machine_cpu_busy:.0%}"
    lines = [
        f"target      {result.url}  feature {result.feature}",
        f"connections {result.connections_ok}/{result.connections} authenticated over {result.processes} processes",
        f"offered     {result.offered_rate:.1f} msg/s ({result.connections} x every {result.interval_ms:g} ms, "
        f"{result.payload} chars, {result.duration:g} s incl. {result.warmup:g} s warmup)",
        f"sent        {result.sent} ({result.achieved_rate:.1f} msg/s achieved), {result.sent_measured} after warmup",
        f"received    {result.received} unique; lost {result.lost} ({result.lost_measured} after warmup); "
        f"duplicates {result.duplicates}; stale {result.stale}; unexpected {result.unexpected}; corrupt {result.corrupt}",
        f"errors      {errors}",
        f"other       {other}",
        f"latency ms  p50 {_ms(result.p50_ms)}  p95 {_ms(result.p95_ms)}  p99 {_ms(result.p99_ms)}  "
        f"max {_ms(result.max_ms)}  mean {_ms(result.mean_ms)}  ({result.samples} samples after warmup)",
        f"send lag    p99 {_ms(result.send_lag_p99_ms)} ms behind schedule (high = the load generator is saturated)",
        f"cpu         machine {busy} busy while sending; load generator {result.client_cpu_cores:.2f} cores",
    ]
    lines += [f"WORKER FAILURE:\n{f}" for f in result.worker_failures]
    return "\n".join(lines)


def result_to_json(result: LoadResult) -> dict[str, Any]:
    return asdict(result)


# -- command line ---------------------------------------------------------------------------------


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared with bench.compare (everything but the target and the rate)."""
    d = LoadConfig()
    parser.add_argument("--connections", type=int, default=d.connections)
    parser.add_argument("--duration", type=float, default=d.duration, help="seconds of sending, warmup included")
    parser.add_argument("--warmup", type=float, default=d.warmup, help="first seconds left out of latency figures")
    parser.add_argument("--processes", type=int, default=d.processes)
    parser.add_argument("--app-id", default=d.app_id)
    parser.add_argument("--app-name", default=d.app_name)
    parser.add_argument("--user-base", type=int, default=d.user_base, help="users are <app-name>-<user-base + i>")
    parser.add_argument("--payload", type=int, default=d.payload, help="characters of message content")
    parser.add_argument("--drain", type=float, default=d.drain, help="seconds to wait for stragglers")
    parser.add_argument("--ramp-rate", type=float, default=d.ramp_rate, help="new connections per second per process")
    parser.add_argument("--token", default=d.token)
    parser.add_argument("--no-confirmation", action="store_true", help="send confirmationEnabled: false")


def config_from_args(args: argparse.Namespace, **overrides: Any) -> LoadConfig:
    values: dict[str, Any] = {
        "connections": args.connections,
        "duration": args.duration,
        "warmup": args.warmup,
        "processes": args.processes,
        "app_id": args.app_id,
        "app_name": args.app_name,
        "user_base": args.user_base,
        "payload": args.payload,
        "drain": args.drain,
        "ramp_rate": args.ramp_rate,
        "token": args.token,
        "confirmation": not args.no_confirmation,
    }
    values.update(overrides)
    return LoadConfig(**values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadtest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=LoadConfig.url, help="target WebSocket URL")
    parser.add_argument("--interval-ms", type=float, default=LoadConfig.interval_ms)
    parser.add_argument("--feature", choices=FEATURES, default=LoadConfig.feature)
    parser.add_argument("--json", type=Path, help="also write the result as JSON to this file")
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    config = config_from_args(args, url=args.url, interval_ms=args.interval_ms, feature=args.feature)
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    result = run_loadtest(config)
    print(format_report(result))
    if args.json:
        args.json.write_text(json.dumps(result_to_json(result), indent=2) + "\n")
    return 1 if result.worker_failures or result.connections_ok == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
