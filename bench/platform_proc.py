"""Start a Switchboard web node and Celery worker for a benchmark run, and stop them after.

They run as in production (DEBUG off) on the embedded Postgres and Redis, or on DATABASE_URL /
REDIS_URL when those are set: the same services `make run` uses.
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

from devstack.embedded import urls_hand_over
from devstack.supervise import wait_ready

REPO_ROOT = Path(__file__).resolve().parents[1]


def platform_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    env["DEBUG"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "platform"), str(REPO_ROOT),
                                                      env.get("PYTHONPATH")]))
    urls_hand_over(env)
    return env


@dataclass(frozen=True)
class RunningPlatform:
    url: str  # the web node's WebSocket URL
    web_pids: list[int]  # the daphne processes (config.web runs daphne in-process)
    worker_pids: list[int]  # Celery main processes; their prefork children are found under them


@contextmanager
def platform_processes(port: int, log_dir: Path, worker_concurrency: int = 4) -> Iterator[RunningPlatform]:
    """A fresh web node on `port` plus one worker, for the duration of the block."""
    env = platform_env()
    for args in (["migrate", "--noinput", "-v", "0"], ["bootstrap"]):
        subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    procs = []
    try:
        for name, argv in (
            ("web", [sys.executable, "-m", "config.web", "--port", str(port)]),
            ("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "WARNING", "-Q",
                        "celery,routing", "-c", str(worker_concurrency),
                        "-n", f"bench-{port}@%h"]),
        ):
            log = open(log_dir / f"platform-{name}.log", "w")
            procs.append(subprocess.Popen(argv, cwd=REPO_ROOT, env={**env, "NODE_ID": f"bench-{port}"},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        if not wait_ready(f"http://127.0.0.1:{port}/readyz", procs[0]):
            raise SystemExit(f"the web node on port {port} did not become ready (log in {log_dir})")
        time.sleep(3)  # the worker connects to the broker
        yield RunningPlatform(f"ws://127.0.0.1:{port}/ws", web_pids=[procs[0].pid], worker_pids=[procs[1].pid])
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
