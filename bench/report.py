"""Markdown for the comparison: the results table with server CPU, the summaries and the machine.

`docs/benchmarks.md` is shared: `--write-docs` rewrites only the region between MARKER_START and
MARKER_END and keeps everything else, which people and other tools maintain by hand.

    python -m bench.report docs/bench/before-issue10.json   # compact tables from a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import platform as stdlib_platform  # the repository's platform/ folder is not a package
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cpu import CpuWindow
from bench.loop_lag import LoopLag
from bench.model import LoadResult

MARKER_START = "<!-- bench:compare:start -->"
MARKER_END = "<!-- bench:compare:end -->"
# Server roles in the order the tables show them (front process first, as a message flows); a
# target maps some of them to measured groups: the platform web/worker/postgres/redis, a relay
# relay/redis.
ROLES = ("web", "relay", "worker", "postgres", "redis")
ROLE_HEADERS = {"web": "web", "worker": "worker", "postgres": "pg", "redis": "redis", "relay": "relay"}
REFERENCE_LABEL = "platform RELIABLE"


@dataclass(frozen=True)
class Row:
    rate: float
    target: str  # "platform", "socketio", "relay-core" or "relay-pubsub"
    feature: str  # "RELIABLE", "FAST", or "-" for a relay, which ignores it
    result: LoadResult
    cpu: CpuWindow | None = None  # None: the run never started sending, or an old JSON file
    server_groups: Mapping[str, str] = field(default_factory=dict)  # role -> measured group name
    loop_lag: LoopLag | None = None  # the web node's event-loop lag over the window (platform targets)

    @property
    def label(self) -> str:
        return self.target if self.feature == "-" else f"{self.target} {self.feature}"

    def split_ms(self) -> dict[str, float | None]:
        """Server CPU ms per delivered message, per role this target has; None if the group was not found."""
        received = self.result.received
        split: dict[str, float | None] = {}
        for role, group in self.server_groups.items():
            seconds = None if self.cpu is None else self.cpu.seconds(group)
            split[role] = None if seconds is None or received == 0 else seconds * 1000.0 / received
        return split

    def other_cores(self) -> float | None:
        """Cores that neither a measured server nor the harness used during the window: other work."""
        cpu = self.cpu
        if cpu is None or cpu.machine_busy_seconds is None or cpu.wall_seconds <= 0:
            return None
        ours = sum(u.seconds for u in cpu.groups.values()) + cpu.probe_cpu_seconds
        client = self.result.client_cpu_cores * self.result.duration  # the load generator, while sending
        return max(0.0, (cpu.machine_busy_seconds - ours - client) / cpu.wall_seconds)

    def server_ms(self) -> tuple[float | None, bool]:
        """(total ms per delivered message, whether every server group was found and counted)."""
        parts = self.split_ms()
        found = [v for v in parts.values() if v is not None]
        if not found:
            return None, False
        return sum(found), len(found) == len(parts)


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


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def server_cpu_text(row: Row) -> str:
    total, complete = row.server_ms()
    # A missing group (e.g. Postgres on another host) would understate the total: say so.
    return _cpu(total) if complete or total is None else f"≥{_cpu(total)}"


def split_cells(row: Row) -> list[str]:
    split = row.split_ms()
    return [_cpu(split[role]) if role in split else "-" for role in ROLES]


def split_text(row: Row) -> str:
    """`web 2.40 / worker 1.50 / pg 1.50 / redis 0.20`, only the roles the target has."""
    return " / ".join(f"{ROLE_HEADERS[role]} {_cpu(v)}" for role, v in sorted(
        row.split_ms().items(), key=lambda item: ROLES.index(item[0])))


def results_table(rows: list[Row], budget_ms: float) -> str:
    roles = " | ".join(ROLE_HEADERS[r] for r in ROLES)
    lines = [
        "| rate/s | target | sent | received | lost | p50 ms | p95 ms | p99 ms | max ms | loop lag p99 / max ms "
        "| achieved/s | errors "
        f"| server CPU ms/msg | {roles} | load gen cores | machine CPU | other cores | ok |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(ROLES) + "---:|---:|---:|:-:|",
    ]
    for row in rows:
        r = row.result
        lines.append(
            f"| {row.rate:g} | {row.label} | {r.sent} | {r.received} | {r.lost} | {_ms(r.p50_ms)} "
            f"| {_ms(r.p95_ms)} | {_ms(r.p99_ms)} | {_ms(r.max_ms)} "
            f"| {row.loop_lag.text() if row.loop_lag else '-'} | {r.achieved_rate:.0f} | {r.error_count} "
            f"| {server_cpu_text(row)} | {' | '.join(split_cells(row))} | {r.client_cpu_cores:.2f} "
            f"| {_percent(r.machine_cpu_busy)} | {_cpu(row.other_cores())} | {'yes' if passes(row, budget_ms) else 'no'} |"
        )
    return "\n".join(lines)


def compact_table(rows: list[Row]) -> str:
    """One line per run: the figures a before/after comparison needs, and nothing else."""
    lines = [
        "| rate/s | target | server CPU ms/msg | split ms/msg | p50 ms | p99 ms | lost |",
        "|---:|---|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        r = row.result
        lines.append(
            f"| {row.rate:g} | {row.label} | {server_cpu_text(row)} | {split_text(row)} | {_ms(r.p50_ms)} "
            f"| {_ms(r.p99_ms)} | {r.lost} |"
        )
    return "\n".join(lines)


def best_table(rows: list[Row], budget_ms: float) -> str:
    lines = [f"| target | highest rate/s with zero loss and p99 < {budget_ms:g} ms |", "|---|---:|"]
    for label, rate in best_rates(rows, budget_ms).items():
        lines.append(f"| {label} | {'none' if rate is None else f'{rate:g}'} |")
    return "\n".join(lines)


def reference_rate(rows: list[Row], wanted: float) -> float | None:
    """`wanted` if the sweep ran it, else its lowest rate (where every target should still keep up)."""
    rates = sorted({row.rate for row in rows})
    if not rates:
        return None
    return wanted if wanted in rates else rates[0]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def cpu_table(rows: list[Row], rate: float) -> str:
    """Every target at one rate, with how many times its CPU per message platform RELIABLE spends."""
    at_rate = [row for row in rows if row.rate == rate]
    reference = next((row for row in at_rate if row.label == REFERENCE_LABEL), None)
    ref_ms = None if reference is None else reference.server_ms()[0]
    roles = " | ".join(ROLE_HEADERS[r] for r in ROLES)
    lines = [
        f"| at {rate:g} msg/s | server CPU ms/msg | {roles} | p50 ms | p99 ms | lost | {REFERENCE_LABEL} ÷ this |",
        "|---|---:|" + "---:|" * len(ROLES) + "---:|---:|---:|---:|",
    ]
    for row in at_rate:
        ratio = _ratio(ref_ms, row.server_ms()[0])
        shown = "-" if ratio is None else f"{ratio:.1f}x"
        if ratio is not None and row.result.lost:
            shown = f"({shown})"  # its CPU went partly into messages it dropped: not comparable
        lines.append(
            f"| {row.label} | {server_cpu_text(row)} | {' | '.join(split_cells(row))} | {_ms(row.result.p50_ms)} "
            f"| {_ms(row.result.p99_ms)} | {row.result.lost} | {shown} |"
        )
    return "\n".join(lines)


def ratio_sentence(rows: list[Row], rate: float) -> str:
    at_rate = [row for row in rows if row.rate == rate]
    reference = next((row for row in at_rate if row.label == REFERENCE_LABEL), None)
    if reference is None:
        return ""
    ref_ms = reference.server_ms()[0]
    parts, lossy = [], []
    for row in at_rate:
        ratio = _ratio(ref_ms, row.server_ms()[0])
        if row is reference or ratio is None:
            continue
        if row.result.lost:
            lossy.append(row.label)
        else:
            parts.append(f"{ratio:.1f}x the CPU of {row.label}")
    sentence = f"At {rate:g} msg/s, {REFERENCE_LABEL} spends {', '.join(parts)} per delivered message." if parts else ""
    if reference.result.lost:
        sentence = f"At {rate:g} msg/s, {REFERENCE_LABEL} lost messages: its CPU per message is not comparable."
    if lossy:
        sentence += f" Not compared, for lost messages: {', '.join(lossy)}."
    return sentence.strip()


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


def results_write(path: Path, *, command: str, summary: Any, runs: Any) -> None:
    """A benchmark's results as JSON at `path` (its folder made): the command, this machine, the
    summary and every run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": command, "machine": machine_info(), "summary": summary, "runs": runs},
                               indent=2) + "\n")


def _coverage_note(rows: list[Row]) -> str:
    measured = list(dict.fromkeys(row.label for row in rows))
    if any(row.target in ("platform", "socketio") for row in rows):
        return f"\nMeasured: {', '.join(measured)}."
    return (
        f"\n**This run measured only: {', '.join(measured)}.** Run the command below without `--targets` "
        "(and with `--start-platform`, or a running `make run`) to add Switchboard RELIABLE and FAST."
    )


def benchmarks_markdown(
    *,
    rows: list[Row],
    budget_ms: float,
    command: str,
    params: dict[str, str],
    reference: float,
    machine: dict[str, str] | None = None,
    cpu_chart: str | None = None,
) -> str:
    """The generated region of docs/benchmarks.md (without the markers)."""
    m = machine or machine_info()
    param_lines = "\n".join(f"- {k}: {v}" for k, v in params.items())
    ref_rate = reference_rate(rows, reference)
    cpu_summary = ""
    if ref_rate is not None:
        cpu_summary = f"{cpu_table(rows, ref_rate)}\n\n{ratio_sentence(rows, ref_rate)}\n"
    chart = f"\n![server CPU per delivered message against offered rate]({cpu_chart})\n" if cpu_chart else ""
    return f"""# Benchmarks

Switchboard against two hand-built Channels relays with no persistence (`bench/relay/`, the same
consumer on two channel layers): `relay-core` on `channels_redis.core.RedisChannelLayer` at its
defaults, which drops messages silently once it falls behind, and `relay-pubsub` on
`channels_redis.pubsub.RedisPubSubChannelLayer`, the stronger baseline. The load is the linker
seed's benchmark: every connection authenticates as its own user and sends a `MESSAGE` to itself
on a fixed clock; latency is the time from just before the send to the receipt of the same message.
Next to latency stands the figure noise moves least: the CPU the servers spent per delivered
message. How to reproduce: `bench/README.md`.
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
`other cores` = what is left of the machine's busy time over the run's window once every measured
server (the idle ones included) and the load generator are taken out: other people's work, in
cores. Where it is high, the latency figures describe a shared machine.

`server CPU ms/msg` = CPU time (user + system, from `/proc/<pid>/stat`) the target's server
processes spent from the moment sending started to the end of the drain, divided by the messages
received; the next columns split it by process group, in ms per delivered message. The platform's
groups are its web node (`web`), its Celery worker with its pool (`worker`), every process of its
Postgres (`pg`) and its Redis; a relay's are its daphne process (`relay`) and Redis. Redis is shared,
so its column also holds the idle platform's background traffic during relay runs (a few ms of CPU
per second). `≥` marks a total with a group that could not be found. `load gen cores` is the load
generator's own CPU while sending: not server CPU. Past saturation (lost messages, a backlog still
being worked off after the drain) the figure is not comparable: work done for undelivered messages
is charged to the delivered ones, and work after the drain is not counted.

{cpu_summary}
{best_table(rows, budget_ms)}

![p99 latency against offered rate](benchmark-chart.svg)
{chart}
## Command

```sh
{command}
```
"""


def splice_generated(existing: str | None, generated: str) -> str:
    """Put `generated` between the markers in `existing`, keeping everything outside them.

    Without markers, the file is still in the shape the harness wrote before it had them: its
    generated part runs from the top through the fenced block under "## Command". That part is
    replaced and wrapped in markers once; anything after it is kept. A file of another shape keeps
    all of its text, below a new generated region.
    """
    region = f"{MARKER_START}\n{generated.strip()}\n{MARKER_END}\n"
    if not existing:
        return region
    start, end = existing.find(MARKER_START), existing.find(MARKER_END)
    if start != -1 and end > start:
        return existing[:start] + region + _after(existing, end + len(MARKER_END))
    if start != -1 or end != -1:
        raise ValueError(f"only one of {MARKER_START} / {MARKER_END} is present; fix the file by hand")
    old_end = _legacy_generated_end(existing)
    if old_end is None:
        return region + "\n" + existing
    return region + _after(existing, old_end)


def _after(text: str, index: int) -> str:
    rest = text[index:].lstrip("\n")
    return "\n" + rest if rest else ""


def _legacy_generated_end(text: str) -> int | None:
    if not text.startswith("# Benchmarks"):
        return None
    command = text.find("\n## Command\n")
    if command == -1:
        return None
    fence = text.find("```sh\n", command)
    close = text.find("\n```", fence + len("```sh\n")) if fence != -1 else -1
    return None if close == -1 else close + len("\n```")


# -- saved runs -----------------------------------------------------------------------------------


def row_to_json(row: Row) -> dict[str, Any]:
    total, complete = row.server_ms()

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    return {
        "rate": row.rate,
        "target": row.target,
        "feature": row.feature,
        "label": row.label,
        "result": asdict(row.result),
        "server_cpu": {
            "groups": dict(row.server_groups),
            "ms_per_message": rounded(total),
            "complete": complete,
            "split_ms_per_message": {role: rounded(v) for role, v in row.split_ms().items()},
        },
        "cpu": None if row.cpu is None else row.cpu.to_json(),
        "loop_lag": None if row.loop_lag is None else row.loop_lag.to_json(),
    }


def row_from_json(data: Mapping[str, Any]) -> Row:
    cpu = data.get("cpu")
    server = data.get("server_cpu") or {}
    return Row(
        rate=float(data["rate"]),
        target=str(data["target"]),
        feature=str(data["feature"]),
        result=LoadResult(**data["result"]),
        cpu=None if cpu is None else CpuWindow.from_json(cpu),
        server_groups=dict(server.get("groups", {})),
        loop_lag=LoopLag.from_json(data.get("loop_lag")),
    )


def load_rows(path: Path) -> tuple[list[Row], dict[str, Any]]:
    """Rows and metadata of a `--json` file (older files were a bare list of runs, without CPU)."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return [row_from_json(d) for d in data], {}
    return [row_from_json(d) for d in data["runs"]], {k: v for k, v in data.items() if k != "runs"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description="Compact tables from a --json file.")
    parser.add_argument("json", type=Path)
    parser.add_argument("--reference-rate", type=float, default=300.0)
    parser.add_argument("--p99-budget-ms", type=float, default=250.0)
    args = parser.parse_args(argv)
    rows, meta = load_rows(args.json)
    print(compact_table(rows))
    rate = reference_rate(rows, args.reference_rate)
    if rate is not None:
        print()
        print(cpu_table(rows, rate))
        print()
        print(ratio_sentence(rows, rate))
    print()
    print(best_table(rows, meta.get("p99_budget_ms", args.p99_budget_ms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
