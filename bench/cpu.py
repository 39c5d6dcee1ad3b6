"""Server CPU per process group, read from /proc: what one run cost each server role.

Latency on a shared two-core machine moves with whatever else runs; the CPU seconds a server
process spends per delivered message move much less. A group is a list of root pids (a web node,
a Celery worker's main process, the postmaster, redis-server, a relay's daphne) plus every
descendant, found again at each sample because Postgres backends and pool children come and go.

Counting rules, per process (one process = pid + start time, since pids are reused):

- CPU is utime + stime + cutime + cstime from /proc/<pid>/stat. The last two hold the CPU of
  children the process has reaped, so a backend that is born and dies between two samples is
  still counted, in full, through its parent (the postmaster waits for every backend).
- A process alive at both ends counts its difference; one born during the window counts all of
  its CPU; one that existed at the start and was reaped by a group member during the window has
  its start value subtracted, because its parent's cutime now carries its whole life.
- A process that vanished without a live group member to reap it (a root that died, an orphan)
  counts up to its last sample, a few hundred ms at most missing; `unreaped_exits` says how often.

What it cannot see: CPU of a process that exits while its parent ignores SIGCHLD (the kernel then
reaps it and credits nobody). Postgres, Redis and Celery all reap their children.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")
# Twice a second: short-lived processes mostly come back through their reaper (see above), so
# sampling only bounds what an unreaped exit loses. One scan of /proc costs a few ms of the harness's
# CPU (under 1% of a core at this rate), measured and reported as probe_cpu_seconds.
SAMPLE_INTERVAL = 0.5

Key = tuple[int, int]  # (pid, start time in ticks since boot): one process, even if its pid is reused


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    started: int  # ticks after boot
    own: int  # utime + stime, ticks
    reaped: int  # cutime + cstime: ticks of the children this process has waited for

    @property
    def key(self) -> Key:
        return (self.pid, self.started)

    @property
    def total(self) -> int:
        return self.own + self.reaped


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat. The command name may hold spaces and parentheses: split after the last ')'."""
    pid_part, _, rest = text.rpartition(")")
    pid = int(pid_part.split("(", 1)[0])
    fields = rest.split()
    # fields[0] is field 3 (state) of proc(5): ppid 4, utime 14, stime 15, cutime 16, cstime 17, starttime 22.
    return ProcStat(
        pid=pid,
        ppid=int(fields[1]),
        started=int(fields[19]),
        own=int(fields[11]) + int(fields[12]),
        reaped=int(fields[13]) + int(fields[14]),
    )


def read_table(proc: Path = PROC) -> dict[int, ProcStat]:
    """Every process on the machine, by pid (processes that exit while we read are skipped)."""
    table: dict[int, ProcStat] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as fh:
                stat = parse_stat(fh.read())
        except (OSError, ValueError, IndexError):
            continue
        table[stat.pid] = stat
    return table


def members(roots: Iterable[int], table: Mapping[int, ProcStat]) -> dict[Key, ProcStat]:
    """The roots that are alive and all their descendants."""
    children: dict[int, list[int]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: dict[Key, ProcStat] = {}
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        stat = table[pid]
        if stat.key in found:
            continue
        found[stat.key] = stat
        stack.extend(children.get(pid, ()))
    return found


@dataclass(frozen=True)
class GroupUsage:
    seconds: float
    processes: int  # distinct processes seen in the group during the window
    unreaped_exits: int  # of those, how many vanished with no live group member to reap them


def account(first: Mapping[Key, ProcStat], seen: Mapping[Key, ProcStat], last: Mapping[Key, ProcStat]) -> GroupUsage:
    """CPU ticks a group spent between two snapshots.

    `first` and `last` are the group's members at the window's ends; `seen` holds the latest
    sample of every member seen at any time (first and last included).
    """
    alive_pids = {key[0] for key in last}
    by_pid = {key[0]: stat for key, stat in seen.items()}

    def reaped_in_group(stat: ProcStat, depth: int = 0) -> bool:
        # Its parent's cutime took its whole life if the parent (or, once the parent died, that
        # parent's reaper, and so on up) is a member still alive at the end.
        if stat.ppid in alive_pids:
            return True
        parent = by_pid.get(stat.ppid)
        return parent is not None and depth < 64 and reaped_in_group(parent, depth + 1)

    ticks = 0
    unreaped = 0
    for key, stat in seen.items():
        base = first[key].total if key in first else 0
        if key in last:
            ticks += last[key].total - base
        elif reaped_in_group(stat):
            ticks -= base
        else:
            ticks += stat.total - base
            unreaped += 1
    return GroupUsage(seconds=ticks / CLK_TCK, processes=len(seen), unreaped_exits=unreaped)


def machine_busy_ticks(proc: Path = PROC) -> int | None:
    """Busy ticks of all cores together since boot (/proc/stat, in the same USER_HZ as /proc/<pid>/stat)."""
    try:
        fields = [int(v) for v in (proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait


@dataclass
class CpuWindow:
    """CPU seconds per group between the start of the load and the end of the drain."""

    wall_seconds: float
    groups: dict[str, GroupUsage]
    samples: int
    probe_cpu_seconds: float  # what the sampling itself cost the harness process
    # Every process on the machine over the same window: what is left after the measured groups
    # and the load generator is someone else's work, the noise the latency figures suffered.
    machine_busy_seconds: float | None = None

    def seconds(self, group: str) -> float | None:
        usage = self.groups.get(group)
        return None if usage is None else usage.seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "samples": self.samples,
            "probe_cpu_seconds": round(self.probe_cpu_seconds, 3),
            "machine_busy_seconds": None if self.machine_busy_seconds is None else round(self.machine_busy_seconds, 3),
            "clock_ticks_per_second": CLK_TCK,
            "groups": {
                name: {"cpu_seconds": round(u.seconds, 3), "processes": u.processes, "unreaped_exits": u.unreaped_exits}
                for name, u in self.groups.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuWindow:
        return cls(
            wall_seconds=float(data["wall_seconds"]),
            groups={
                name: GroupUsage(float(g["cpu_seconds"]), int(g["processes"]), int(g["unreaped_exits"]))
                for name, g in data["groups"].items()
            },
            samples=int(data["samples"]),
            probe_cpu_seconds=float(data["probe_cpu_seconds"]),
            machine_busy_seconds=data.get("machine_busy_seconds"),
        )


@dataclass
class _GroupTrace:
    first: dict[Key, ProcStat] = field(default_factory=dict)
    seen: dict[Key, ProcStat] = field(default_factory=dict)


class CpuProbe:
    """Samples the groups from start() to stop(); stop() returns the window's CpuWindow (also kept as .window).

    `groups` maps a group name to its root pids. A group whose roots are all gone is still
    reported (with what it had), so a crashed server shows up as a short count, not a missing row.
    """

    def __init__(self, groups: Mapping[str, Iterable[int]], interval: float = SAMPLE_INTERVAL,
                 proc: Path = PROC) -> None:
        self.roots = {name: list(pids) for name, pids in groups.items()}
        self.interval = interval
        self.proc = proc
        self._traces = {name: _GroupTrace() for name in self.roots}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._samples = 0
        self._probe_cpu = 0.0
        self._started_at = 0.0
        self._machine_at_start: int | None = None
        self.window: CpuWindow | None = None  # set by stop()

    def _sample(self) -> dict[str, dict[Key, ProcStat]]:
        cpu0 = time.thread_time()
        table = read_table(self.proc)
        snapshot = {name: members(roots, table) for name, roots in self.roots.items()}
        with self._lock:
            for name, current in snapshot.items():
                self._traces[name].seen.update(current)
            self._samples += 1
            self._probe_cpu += time.thread_time() - cpu0
        return snapshot

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._started_at = time.monotonic()
        self._machine_at_start = machine_busy_ticks(self.proc)
        for name, current in self._sample().items():
            self._traces[name].first = current
        self._thread = threading.Thread(target=self._loop, name="cpu-probe", daemon=True)
        self._thread.start()

    def stop(self) -> CpuWindow:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        last = self._sample()
        machine_now = machine_busy_ticks(self.proc)
        machine = None
        if machine_now is not None and self._machine_at_start is not None:
            machine = (machine_now - self._machine_at_start) / CLK_TCK
        self.window = CpuWindow(
            wall_seconds=time.monotonic() - self._started_at,
            groups={name: account(t.first, t.seen, last[name]) for name, t in self._traces.items()},
            samples=self._samples,
            probe_cpu_seconds=self._probe_cpu,
            machine_busy_seconds=machine,
        )
        return self.window


# -- finding the processes ------------------------------------------------------------------------


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def cwd(pid: int, proc: Path = PROC) -> Path | None:
    try:
        return Path(os.readlink(proc / str(pid) / "cwd")).resolve()
    except OSError:
        return None


def postmaster_pid(data_dir: Path, proc: Path = PROC) -> int | None:
    """The postmaster of the cluster in `data_dir`: first line of postmaster.pid, checked against /proc.

    The check matters because a stale pid file (after a crash) may name a pid now reused by an
    unrelated process; the postmaster's working directory is its data directory.
    """
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    if cwd(pid, proc) == data_dir.resolve() or str(data_dir) in cmdline(pid, proc):
        return pid
    return None


def redis_server_pid(port: int | None, pidfile: Path | None = None, proc: Path = PROC) -> int | None:
    """The redis-server listening on `port`: from its pid file if that agrees, else by its title.

    redis-server retitles itself "redis-server <host>:<port>", so the title tells servers apart
    (this machine runs several: every checkout has its own embedded one). With no port, the pid
    file's process, if it is a redis-server.
    """

    def serves_port(pid: int) -> bool:
        args = cmdline(pid, proc)
        if not args or "redis-server" not in args[0]:
            return False
        return port is None or args[-1].strip().endswith(f":{port}")

    if pidfile is not None:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            pid = 0
        if pid and serves_port(pid):
            return pid
    if port is None:
        return None
    for entry in os.scandir(proc):
        if entry.name.isdigit() and serves_port(int(entry.name)):
            return int(entry.name)
    return None


def platform_roots(repo_root: Path, proc: Path = PROC) -> dict[str, list[int]]:
    """Web nodes and Celery workers started from `repo_root` (as `make run` does), by command line.

    Only processes whose working directory is this checkout count: other checkouts on the machine
    run their own platforms. For the worker, only the main process is a root; its pool children are
    its descendants. Celery beat is not a worker and is left out.
    """
    repo = repo_root.resolve()
    web: list[int] = []
    workers: dict[int, int] = {}  # pid -> ppid
    table = read_table(proc)
    for pid, stat in table.items():
        args = cmdline(pid, proc)
        if not args or cwd(pid, proc) != repo:
            continue
        if "config.web" in args or any(a.endswith("config.asgi:application") for a in args):
            web.append(pid)
        elif "worker" in args and any(os.path.basename(a) == "celery" or a == "celery" for a in args):
            workers[pid] = stat.ppid
    roots = [pid for pid, ppid in workers.items() if ppid not in workers]
    return {"web": sorted(web), "worker": sorted(roots)}
