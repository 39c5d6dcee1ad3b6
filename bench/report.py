"""Markdown for the comparison: the results table, the sustainable-rate summary and the machine."""

from __future__ import annotations

import os
import platform as stdlib_platform  # the repository's platform/ folder is not a package
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.model import LoadResult


@dataclass(frozen=True)
class Row:
    rate: float
    target: str  # "platform" or "relay"
    feature: str  # "RELIABLE", "FAST", or "-" for the relay, which ignores it
    result: LoadResult

    @property
    def label(self) -> str:
        return self.target if self.feature == "-" else f"{self.target} {self.feature}"


def passes(row: Row, budget_ms: float) -> bool:
    """Sustained: nothing lost, no errors, every connection up, load actually offered, p99 in budget."""
    r = row.result
    return (
        r.lost == 0
        and r.error_count == 0
        and r.connections_ok == r.connections
        and r.achieved_rate >= 0.95 * r.offered_rate
        and r.p99_ms is not None
        and r.p99_ms < budget_ms
    )


def best_rates(rows: list[Row], budget_ms: float) -> dict[str, float | None]:
    """Highest passing rate per target/feature (a lower rate may still have failed: see the table)."""
    best: dict[str, float | None] = {}
    for row in rows:
        best.setdefault(row.label, None)
        current = best[row.label]
        if passes(row, budget_ms) and (current is None or row.rate > current):
            best[row.label] = row.rate
    return best


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def results_table(rows: list[Row], budget_ms: float) -> str:
    lines = [
        "| rate/s | target | feature | sent | received | lost | p50 ms | p95 ms | p99 ms | max ms | achieved/s | errors "
        "| machine CPU | ok |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for row in rows:
        r = row.result
        lines.append(
            f"| {row.rate:g} | {row.target} | {row.feature} | {r.sent} | {r.received} | {r.lost} | {_ms(r.p50_ms)} "
            f"| {_ms(r.p95_ms)} | {_ms(r.p99_ms)} | {_ms(r.max_ms)} | {r.achieved_rate:.0f} | {r.error_count} "
            f"| {_percent(r.machine_cpu_busy)} | {'yes' if passes(row, budget_ms) else 'no'} |"
        )
    return "\n".join(lines)


def best_table(rows: list[Row], budget_ms: float) -> str:
    lines = [f"| target | highest rate/s with zero loss and p99 < {budget_ms:g} ms |", "|---|---:|"]
    for label, rate in best_rates(rows, budget_ms).items():
        lines.append(f"| {label} | {'none' if rate is None else f'{rate:g}'} |")
    return "\n".join(lines)


def machine_info() -> dict[str, str]:
    info = {
        "nproc": str(os.cpu_count() or "?"),
        "memory": "?",
        "cpu": stdlib_platform.processor() or "?",
        "python": sys.version.split()[0],
        "os": f"{stdlib_platform.system()} {stdlib_platform.release()}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def _coverage_note(rows: list[Row]) -> str:
    measured = list(dict.fromkeys(row.label for row in rows))
    if any(row.target == "platform" for row in rows):
        return f"\nMeasured: {', '.join(measured)}."
    return (
        f"\n**This run measured only: {', '.join(measured)}.** Start the platform (`make run`) and run "
        "the command below without `--targets` to add Switchboard RELIABLE and FAST."
    )


def benchmarks_markdown(*, rows: list[Row], budget_ms: float, command: str, params: dict[str, str]) -> str:
    m = machine_info()
    param_lines = "\n".join(f"- {k}: {v}" for k, v in params.items())
    return f"""# Benchmarks

Switchboard against a hand-built Channels relay with no persistence (`bench/relay/`), under the
load of the linker seed's benchmark: every connection authenticates as its own user and sends a
`MESSAGE` to itself on a fixed clock; latency is the time from just before the send to the receipt
of the same message. How to reproduce: `bench/README.md`.
{_coverage_note(rows)}

## Machine

| nproc | memory | CPU | Python | OS | date |
|---|---|---|---|---|---|
| {m["nproc"]} | {m["memory"]} | {m["cpu"]} | {m["python"]} | {m["os"]} | {m["date"]} |

The load generator, the servers, Redis and Postgres all share this machine, so every target
competes with the load generator for the same cores.

## Load

{param_lines}

Offered rate = connections x 1000 / interval-ms; a sweep keeps the connections fixed and shortens
the interval. Targets are interleaved at every rate so that noise on the machine hits them alike.
Each run uses its own block of user ids, so no run inherits another's undelivered mailbox.
Latency figures cover messages sent after the warmup; sent, received and lost cover the whole
run. A message not back by the end of the drain counts as lost; redeliveries are de-duplicated by
the id in the content.

## Results

{results_table(rows, budget_ms)}

`ok` = zero loss, zero errors, every connection authenticated, at least 95% of the offered rate
actually sent, and p99 under {budget_ms:g} ms. `machine CPU` = share of all cores busy while
sending, whoever used them: a high value at a low rate means something else was running.

{best_table(rows, budget_ms)}

![p99 latency against offered rate](benchmark-chart.svg)

## Command

```sh
{command}
```
"""
