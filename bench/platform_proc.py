"""Start a Switchboard web node and Celery worker for a benchmark run, and stop them after.

They run as in production (DEBUG off) on a database of their own, created on the Postgres server
`make run` uses (the embedded one, or DATABASE_URL's) and dropped after the run
(analytics.bench_sandbox), and on a Redis server of their own started here: the load test's
messages, sessions and queued tasks never mix with an operator's, and a platform running from the
same checkout keeps its data, its queues and its channel layer to itself.

BENCH_WEB_WRAPPER, when set, is a Python script (and its arguments) that runs the web nodes
instead of `-m config.web`, with the same arguments after it: a profiler that wraps config.web.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from analytics.bench_sandbox import bench_database
from devstack.embedded import _redis_bin, free_port, urls_hand_over
from devstack.supervise import wait_ready

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTBOUND_CONCURRENCY = 4  # the outbound worker's threads (make run's default)


def platform_env(root: Path = REPO_ROOT) -> dict[str, str]:
    """The environment of a platform run from the checkout at `root` (another commit's worktree, for a
    before/after comparison, or this one)."""
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    env["DEBUG"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "platform"), str(root), env.get("PYTHONPATH")]))
    urls_hand_over(env)
    return env


@dataclass(frozen=True)
class RunningPlatform:
    url: str  # the (first) web node's WebSocket URL
    web_pids: list[int]  # the daphne processes (config.web runs daphne in-process)
    worker_pids: list[int]  # Celery main processes; their prefork children are found under them
    database_url: str  # the run's own database, dropped after it
    redis_url: str  # the run's own Redis server, stopped after it
    urls: tuple[str, ...] = ()  # every web node's WebSocket URL, in the order of their ports
    outbound_pids: tuple[int, ...] = ()  # the outbound worker (webhook calls), when one was asked for


@contextmanager
def private_redis(directory: Path) -> Iterator[str]:
    """A Redis server of the run's own (no persistence) on a free port, for the block."""
    port = free_port()
    pidfile = directory / "redis.pid"
    subprocess.run([str(_redis_bin("redis-server")), "--port", str(port), "--bind", "127.0.0.1", "--dir",
                    str(directory), "--save", "", "--appendonly", "no", "--maxclients", "10000", "--daemonize", "yes",
                    "--pidfile", str(pidfile), "--logfile", str(directory / "redis.log")],
                   check=True, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while not _redis_answers(url):
            if time.monotonic() > deadline:
                raise SystemExit(f"the run's Redis did not start (log in {directory})")
            time.sleep(0.05)
        yield url
    finally:
        try:
            redis.Redis.from_url(url, socket_timeout=5).shutdown(nosave=True)
        except redis.RedisError:
            pass  # SHUTDOWN closes the connection under us: that is the success case


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@contextmanager
def platform_processes(port: int, log_dir: Path, worker_concurrency: int = 4, *, more_ports: tuple[int, ...] = (),
                       root: Path = REPO_ROOT, extra_env: dict[str, str] | None = None,
                       outbound_worker: bool = False) -> Iterator[RunningPlatform]:
    """A fresh web node on `port` (and one more on each of `more_ports`) plus one worker, run from the
    checkout at `root`, on a database and a Redis of their own, for the duration of the block.
    `extra_env` is added to every process's environment; `outbound_worker` starts a worker for the
    webhooks queue too, as `make run` does (its pids are `outbound_pids`)."""
    env = {**platform_env(root), **(extra_env or {})}
    ports = (port, *more_ports)
    with bench_database(env["DATABASE_URL"]) as database_url, private_redis(log_dir) as redis_url:
        env.update(DATABASE_URL=database_url, REDIS_URL=redis_url)
        with _processes(env, ports, log_dir, worker_concurrency, root, outbound_worker) as (web_pids, worker_pids):
            urls = tuple(f"ws://127.0.0.1:{p}/ws" for p in ports)
            yield RunningPlatform(urls[0], web_pids=web_pids, worker_pids=worker_pids[:1], database_url=database_url,
                                  redis_url=redis_url, urls=urls, outbound_pids=tuple(worker_pids[1:]))


@contextmanager
def _processes(env: dict[str, str], ports: tuple[int, ...], log_dir: Path, worker_concurrency: int,
               root: Path, outbound_worker: bool = False) -> Iterator[tuple[list[int], list[int]]]:
    for args in (["migrate", "--noinput", "-v", "0"], ["bootstrap"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=root, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    procs = []
    try:
        web = os.environ["BENCH_WEB_WRAPPER"].split() if os.environ.get("BENCH_WEB_WRAPPER") else ["-m", "config.web"]
        commands = [(f"web-{p}" if len(ports) > 1 else "web", f"bench-{p}", [sys.executable, *web, "--port", str(p)])
                    for p in ports]
        commands.append(("worker", f"bench-{ports[0]}",
                         [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "WARNING", "-Q",
                          "celery,routing", "-c", str(worker_concurrency), "-n", f"bench-{ports[0]}@%h"]))
        if outbound_worker:
            commands.append(("outbound", f"bench-{ports[0]}",
                             [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "WARNING", "-Q",
                              "webhooks", "-c", str(OUTBOUND_CONCURRENCY), "-n", f"bench-outbound-{ports[0]}@%h"]))
        for name, node_id, argv in commands:
            log = open(log_dir / f"platform-{name}.log", "w")
            procs.append(subprocess.Popen(argv, cwd=root, env={**env, "NODE_ID": node_id},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        for p, proc in zip(ports, procs, strict=False):
            if not wait_ready(f"http://127.0.0.1:{p}/readyz", proc):
                raise SystemExit(f"the web node on port {p} did not become ready (log in {log_dir})")
        time.sleep(3)  # the worker connects to the broker
        yield [proc.pid for proc in procs[:len(ports)]], [proc.pid for proc in procs[len(ports):]]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
