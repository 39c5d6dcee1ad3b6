"""The servers a benchmark starts or measures: free ports, the baseline relay (a daphne subprocess
on Channels' Redis layers, bench/relay/) and the Postgres and Redis processes behind a URL, whose
CPU the benchmarks count (bench/cpu.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.cpu import postmaster_pid, redis_server_pid

REPO_ROOT = Path(__file__).resolve().parents[1]


# -- the relay subprocesses -----------------------------------------------------------------------


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


@dataclass(frozen=True)
class RunningRelay:
    url: str
    pid: int  # the daphne process: the relay's whole server side, Redis aside


@contextmanager
def relay_server(redis_url: str, log_path: Path, port: int | None = None, layer: str = "core") -> Iterator[RunningRelay]:
    """Run `daphne bench.relay.asgi:application` on `layer` ("core" or "pubsub") for the block."""
    port = port or free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.relay.settings",
        "REDIS_URL": redis_url,
        "RELAY_CHANNEL_LAYER": layer,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
    }
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "bench.relay.asgi:application"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        _wait_for_relay(proc, port, log_path)
        yield RunningRelay(f"ws://127.0.0.1:{port}/ws", proc.pid)
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


# -- the database and Redis servers behind a URL -------------------------------------------------


def _url_port(url: str | None) -> int | None:
    try:
        return urlsplit(url).port if url else None
    except ValueError:
        return None


def embedded_var_dir() -> Path:
    from devstack.embedded import var_dir

    return var_dir()


def find_postgres(database_url: str | None) -> list[int]:
    """The embedded Postgres of this checkout (its postmaster; backends are found under it).

    Only if the platform's database is that one: with DATABASE_URL pointing elsewhere, this
    machine may not even run the server, and the group stays empty (the report marks the total).
    """
    data_dir = embedded_var_dir() / "postgres" / "data"
    pid = postmaster_pid(data_dir)
    if pid is None:
        return []
    try:
        port = int((data_dir / "postmaster.pid").read_text().splitlines()[3])
    except (OSError, ValueError, IndexError):
        port = None
    wanted = _url_port(database_url)
    return [pid] if wanted is None or wanted == port else []


def find_redis(redis_url: str | None) -> list[int]:
    """The redis-server behind `redis_url`; with no URL, this checkout's embedded one."""
    pid = redis_server_pid(_url_port(redis_url), embedded_var_dir() / "redis" / "redis.pid")
    return [] if pid is None else [pid]
