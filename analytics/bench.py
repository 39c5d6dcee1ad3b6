"""The analytics benchmark: a generated day of activity, then the export and both jobs timed.

    python manage.py analytics_bench [--messages 1000000] [--sessions 100000] [--write-docs]

It never touches the platform's data: `bench_elsewhere` creates a database of its own on the same
Postgres server and a lake of its own (analytics.bench_sandbox), runs the benchmark in a child
process pointed at both (`analytics_bench --here`), and drops both after, however the run ends.
`bench_run`, the child's part, refuses a database or lake that does not carry the benchmark's mark.

Data is generated inside Postgres (INSERT ... SELECT over generate_series: no row crosses the
wire) for two apps (BENCHA, BENCHB) on four nodes in two domains. Then: a full export into the
empty lake, an incremental export after 1% more activity, each job in-process on local[*] (JVM
start and loading the results included), and each job with spark-submit on local[*] and on
local-cluster[2,1,1024].
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from analytics.bench_sandbox import (
    SandboxRefused,
    bench_database,
    bench_database_is_marked,
    bench_lake,
    bench_lake_is_marked,
    database_of,
    url_with_database,
)
from analytics.jobs import datasets as ds
from analytics.models import JobKind
from analytics.services import lake_export, lake_reset, report_run
from analytics.services.lake import Lake
from apps_registry.models import ClientApp
from presence.events import presence_event_record
from presence.models import Node, PresenceEvent, PresenceEventKind, Session

ROOT = Path(settings.BASE_DIR)
APPS = ("BENCHA", "BENCHB")
NODES = (("bench-1", "domain-01"), ("bench-2", "domain-01"), ("bench-3", "domain-02"), ("bench-4", "domain-02"))
MASTERS = ("local[*]", "local-cluster[2,1,1024]")
NOTE = ("`local-cluster` runs the same jobs in two executor JVMs of one core each beside the driver, on the same "
        "two cores, with shuffles over the loopback network: it shows that the jobs need nothing local to the "
        "driver, and on one small machine it is slower than `local[*]`, not faster. Most of an incremental "
        "export's work is the live delivery snapshot (every delivery not final yet), which each run writes whole.")
CHILD_STOP_SECONDS = 20  # how long an interrupted run's child gets to stop before it is killed


class BenchFailed(Exception):
    """A step of the benchmark's child process failed (its output says why)."""


@dataclass
class BenchResult:
    messages: int
    sessions: int
    day: datetime
    generate_seconds: float = 0.0
    export: dict = field(default_factory=dict)
    incremental: dict = field(default_factory=dict)
    in_process: dict[str, float] = field(default_factory=dict)
    submit: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # wall, in the driver
    figures: dict[str, str] = field(default_factory=dict)


def bench_data_generate(*, messages: int, sessions: int, day: datetime, offset: int = 0) -> None:
    """`messages` messages with one delivery each and `sessions` sessions with their presence
    events, spread over `day` (offset: ids of a later batch of the same day)."""
    apps = [ClientApp.objects.get_or_create(app_name=name, defaults={"app_id": f"bench-{name.lower()}",
                                                                       "master_user_id": f"{name}-0"})[0].pk
            for name in APPS]
    for node_id, domain in NODES:
        Node.objects.update_or_create(node_id=node_id, defaults={"domain": domain, "started_at": day,
                                                                 "heartbeat_at": timezone.now()})
    params = {"apps": apps, "day": day, "n": messages, "s": sessions, "off": offset,
              "nodes": [n for n, _ in NODES]}
    with connection.cursor() as cur:
        # u = a fixed pseudo-random number in [0, 1) per row, so every run generates the same data.
        cur.execute("""
            INSERT INTO messaging_message (app_id, sender, kind, content, reference, confirmation_requested,
                                           origin_domain, created_at)
            SELECT (%(apps)s::bigint[])[1 + i %% 2], 'BENCH-' || (i %% 10000),
                   CASE WHEN i %% 50 = 0 THEN 'confirmation' WHEN i %% 10 = 0 THEN 'group' ELSE 'direct' END,
                   repeat('x', 200), '', false, '', %(day)s + make_interval(secs => (i - %(off)s) * 86400.0 / %(n)s)
              FROM generate_series(%(off)s + 1, %(off)s + %(n)s) AS i
        """, params)
        cur.execute("""
            INSERT INTO messaging_delivery (message_id, app_id, recipient, seq, state, attempts, next_attempt_at,
                                            last_error, created_at, sent_at, delivered_at, dead_at, expired_at)
            SELECT m.id, m.app_id, 'BENCH-' || (m.id * 7 %% 20000), m.id, st.state,
                   CASE st.state WHEN 'pending' THEN 0 WHEN 'dead' THEN 10 WHEN 'expired' THEN 3
                                 ELSE 1 + (m.id %% 20 = 0)::int END,
                   NULL,
                   CASE st.state WHEN 'dead' THEN (ARRAY['not confirmed within the ack timeout',
                        'the node holding the connection died before confirming', 'push failed'])[1 + m.id %% 3]
                        ELSE '' END,
                   m.created_at, CASE WHEN st.state <> 'pending' THEN m.created_at END,
                   CASE WHEN st.state = 'delivered'
                        THEN m.created_at + make_interval(secs => 0.02 + 5 * power(u.u, 4)) END,
                   CASE WHEN st.state = 'dead' THEN m.created_at + interval '10 minutes' END,
                   CASE WHEN st.state = 'expired' THEN m.created_at + interval '1 day' END
              FROM messaging_message m
             CROSS JOIN LATERAL (SELECT ((m.id * 7919) %% 10007) / 10007.0 AS u) u
             CROSS JOIN LATERAL (SELECT CASE WHEN m.id %% 100 < 93 THEN 'delivered' WHEN m.id %% 100 < 96 THEN 'pending'
                                             WHEN m.id %% 100 = 96 THEN 'retrying' WHEN m.id %% 100 = 97 THEN 'dead'
                                             WHEN m.id %% 100 = 98 THEN 'expired' ELSE 'sent' END AS state) st
             WHERE m.app_id = ANY(%(apps)s) AND NOT EXISTS (SELECT 1 FROM messaging_delivery d WHERE d.message_id = m.id)
        """, params)
        cur.execute("""
            INSERT INTO presence_session (connection_id, app_id, user_id, node_id, channel_name, acks, connected_at,
                                          last_seen_at, disconnected_at, remote_addr, user_agent)
            SELECT gen_random_uuid(), (%(apps)s::bigint[])[1 + j %% 2], 'BENCH-' || (j %% 20000),
                   (%(nodes)s::text[])[1 + j %% 4], 'bench-' || j, false, t.start, t.start,
                   CASE WHEN j %% 50 = 0 THEN NULL
                        ELSE t.start + make_interval(secs => 5 + 7200 * power(((j::bigint * 104729) %% 10007) / 10007.0, 2)) END,
                   '', ''
              FROM generate_series(%(off)s + 1, %(off)s + %(s)s) AS j
             CROSS JOIN LATERAL (SELECT %(day)s + make_interval(secs => (j - %(off)s) * 86400.0 / %(s)s) AS start) t
        """, params)
    # Their presence events, recorded by the platform's own service (one statement each).
    sessions = Session.objects.filter(app_id__in=apps)
    presence_event_record(kind=PresenceEventKind.CONNECT, connection_ids=list(sessions.values_list("pk", flat=True)))
    presence_event_record(kind=PresenceEventKind.DISCONNECT, close_reason="client closed",
                          connection_ids=list(sessions.filter(disconnected_at__isnull=False)
                                              .values_list("pk", flat=True)))
    with connection.cursor() as cur:
        cur.execute("ANALYZE messaging_message; ANALYZE messaging_delivery; ANALYZE presence_session; "
                    "ANALYZE presence_presenceevent")


def bench_data_clear() -> None:
    apps = list(ClientApp.objects.filter(app_name__in=APPS).values_list("pk", flat=True))
    PresenceEvent.objects.filter(app_id__in=apps).delete()
    ClientApp.objects.filter(pk__in=apps).delete()  # cascades to messages, deliveries and sessions
    Node.objects.filter(node_id__in=[n for n, _ in NODES]).delete()


def _spark_submit(job: str, master: str, lake: Lake, since: datetime, until: datetime) -> tuple[float, float]:
    out = lake.url(f"{ds.REPORTS}/{job}/bench-{master.replace('[', '-').replace(']', '').replace(',', '-')}")
    argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
            "--properties-file", str(settings.SPARK_DEFAULTS_FILE), "--conf", "spark.ui.enabled=false",
            str(ROOT / "analytics" / "jobs" / f"{job}.py"), "--lake", lake.url(), "--since", since.isoformat(),
            "--until", until.isoformat(), "--out", out]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"spark-submit {job} on {master} failed:\n{done.stderr[-4000:]}")
    inside = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))["seconds"]
    lake.delete_dir(out.removeprefix(lake.uri + "/"))
    return wall, inside


def bench_elsewhere(*, argv: list[str], lake: Path | None = None, database: str | None = None,
                    say=print) -> str:
    """Run `manage.py analytics_bench --here *argv` on a database and a lake of the benchmark's own,
    created here (`database` and `lake` name them, else new ones) and dropped when it ends; returns
    what the run printed. The platform's database and lake are never written."""
    server_url = url_with_database(settings.DATABASE_URL, settings.DATABASES["default"]["NAME"])
    with _terminate_raises(), bench_lake(lake, settings.ANALYTICS_LAKE) as lake_dir, \
            bench_database(server_url, database) as url:
        say(f"on a database of its own ({database_of(url)}) and a lake of its own ({lake_dir}), both dropped after")
        env = {**os.environ, "DATABASE_URL": url, "ANALYTICS_LAKE": str(lake_dir)}  # the same settings module
        _child([sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"], env)
        return _child([sys.executable, str(ROOT / "manage.py"), "analytics_bench", "--here", *argv], env)


@contextmanager
def _terminate_raises() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C does, so the database and lake are still dropped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _child(argv: list[str], env: dict[str, str]) -> str:
    """Run `argv` in a session of its own (so its Spark JVMs stop with it); its output is returned,
    its progress goes to our stderr. Interrupted, it is stopped before the sandbox is dropped."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(CHILD_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    if proc.returncode != 0:
        raise BenchFailed(f"`{' '.join(argv[1:3])}` failed with exit code {proc.returncode} (its output is above)")
    return out


def sandbox_check(lake_dir: Path) -> None:
    """Refuses (SandboxRefused) unless this process's database and `lake_dir` are a benchmark's own."""
    with connection.cursor() as cur:
        if not bench_database_is_marked(cur):
            raise SandboxRefused(f"database {connection.settings_dict['NAME']!r} was not created by a benchmark; "
                                 "run `manage.py analytics_bench` (without --here), which makes one of its own")
    if not bench_lake_is_marked(lake_dir):
        raise SandboxRefused(f"{lake_dir} is not a benchmark's lake; run `manage.py analytics_bench` (without --here)")


def bench_run(*, messages: int, sessions: int, lake_dir: Path, jobs: bool = True, say=print) -> BenchResult:
    """The benchmark itself, on this process's database: only one a benchmark created (sandbox_check)."""
    sandbox_check(lake_dir)
    day = (timezone.now() - timedelta(days=1)).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    result = BenchResult(messages=messages, sessions=sessions, day=day)
    with override_settings(ANALYTICS_LAKE=str(lake_dir)):
        lake = Lake(str(lake_dir))
        say("clearing an earlier run's data and lake")
        bench_data_clear()
        lake_reset()
        say(f"generating {messages:,} messages and {sessions:,} sessions on {day:%Y-%m-%d}")
        started = time.monotonic()
        bench_data_generate(messages=messages, sessions=sessions, day=day)
        result.generate_seconds = time.monotonic() - started

        say("full export")
        started = time.monotonic()
        export = lake_export(requested_by="analytics_bench")
        result.export = {"seconds": time.monotonic() - started, "rows": export.rows, "files": export.files}
        bench_data_generate(messages=messages // 100, sessions=sessions // 100, day=day, offset=messages)
        say("incremental export after 1% more activity")
        started = time.monotonic()
        export = lake_export(requested_by="analytics_bench")
        result.incremental = {"seconds": time.monotonic() - started, "rows": export.rows, "files": export.files}
        if not jobs:
            return result

        since, until = day, day + timedelta(days=1)
        for kind in (JobKind.PRESENCE, JobKind.BACKLOG):
            say(f"{kind} in-process on {settings.SPARK_MASTER}")
            started = time.monotonic()
            report = report_run(kind=kind, since=since, until=until, requested_by="analytics_bench")
            result.in_process[kind.value] = time.monotonic() - started
            result.figures.update(_headline(report))
        for master in MASTERS:
            for kind in (JobKind.PRESENCE, JobKind.BACKLOG):
                say(f"{kind} with spark-submit on {master}")
                result.submit[(kind.value, master)] = _spark_submit(kind.value, master, lake, since, until)
    return result


def _headline(report) -> dict[str, str]:
    rows = report.rows.filter(app="", subgroup="")
    pick = {(r.metric, r.bucket): r.value for r in rows if r.grain in (ds.RANGE, ds.SNAPSHOT)}
    if report.kind == JobKind.PRESENCE:
        return {"peak concurrent connections": f"{pick.get((ds.PEAK_CONCURRENT, ''), 0):,.0f}",
                "unique users": f"{pick.get((ds.UNIQUE_USERS, ''), 0):,.0f}",
                "session length p50 / p99": f"{pick.get((ds.SESSION_LENGTH, 'p50'), 0):,.0f} s / "
                                            f"{pick.get((ds.SESSION_LENGTH, 'p99'), 0):,.0f} s"}
    return {"delivered": f"{pick.get((ds.DELIVERED, ''), 0):,.0f}",
            "latency p50 / p90 / p99": " / ".join(f"{pick.get((ds.LATENCY, p), 0):,.0f} ms" for p in ("p50", "p90",
                                                                                                     "p99"))}


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    with connection.cursor() as cur:
        cur.execute("SHOW server_version")
        pg = cur.fetchone()[0]
    import pyarrow  # only for its version: pyarrow and pyspark are heavy to import, and nothing else here needs them
    import pyspark  # (the same)

    return {"nproc": str(os.cpu_count()), "memory": f"{mem / 1024 / 1024:.1f} GiB", "CPU": cpu,
            "Python": platform.python_version(), "Java": java, "PySpark": pyspark.__version__,
            "pyarrow": pyarrow.__version__, "Postgres": pg, "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"}


def markdown(result: BenchResult, command: str) -> str:
    m = machine()
    lines = [
        "## Analytics on Spark",
        "",
        f"A generated day ({result.day:%Y-%m-%d}) of {result.messages:,} messages (one delivery each: 93% "
        f"delivered, 3% pending, 1% each retrying, sent, dead and expired) and {result.sessions:,} sessions (2% "
        "still open) with their presence events, in a database of the benchmark's own on the platform's Postgres "
        "(created for the run and dropped after it), exported to a lake of its own on the local disk; then each "
        "job over that day. Everything shares the machine's cores.",
        "",
        "| " + " | ".join(m) + " |",
        "|" + "---|" * len(m),
        "| " + " | ".join(m.values()) + " |",
        "",
        "| step | seconds | notes |",
        "|---|---:|---|",
        f"| generate the day in Postgres | {result.generate_seconds:.1f} | INSERT ... SELECT generate_series |",
        f"| full export | {result.export['seconds']:.1f} | {_rows(result.export)} |",
        f"| incremental export after 1% more activity | {result.incremental['seconds']:.1f} | "
        f"{_rows(result.incremental)} |",
    ]
    for kind, seconds in result.in_process.items():
        lines.append(f"| {kind} report in-process on local[*] | {seconds:.1f} | "
                     "`manage.py analytics_report`: JVM start, job, results loaded into Postgres |")
    for (kind, master), (wall, inside) in result.submit.items():
        lines.append(f"| {kind} with spark-submit on `{master}` | {wall:.1f} | {inside:.1f} s in the driver after "
                     "launch (session start included) |")
    if result.submit:
        lines += ["", NOTE]
    if result.figures:
        lines += ["", "What the reports found (all apps): " + "; ".join(f"{k} {v}" for k, v in result.figures.items())
                  + "."]
    lines += ["", "Command:", "", "```sh", command, "```", ""]
    return "\n".join(lines)


def _rows(export: dict) -> str:
    rows = ", ".join(f"{name} {count:,}" for name, count in export["rows"].items() if count)
    return f"{rows}; {export['files']} files"


def docs_write(text: str, path: Path | None = None) -> None:
    """Put the section at the end of docs/benchmarks.md, replacing an earlier one."""
    path = path or ROOT / "docs" / "benchmarks.md"
    current = path.read_text()
    head = current.split("\n## Analytics on Spark", 1)[0].rstrip("\n")
    path.write_text(head + "\n\n" + text)
