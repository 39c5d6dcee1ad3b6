"""`make run`: the whole platform as one supervised foreground process group.

Starts (or reuses) the embedded services when no DATABASE_URL / REDIS_URL is set, migrates,
ensures the demo app and an admin login, then runs a daphne web node, a Celery worker (routing and
the default queue), a webhook worker (the webhooks queue only: tenants' receivers never hold a thread
that routing needs) and Celery beat with prefixed logs. A child that crashes is restarted with backoff. The embedded Postgres and
Redis are watched the same way: one that stops answering (killed, crashed) is started again, with
backoff, and the web node, worker and beat reconnect by themselves. Ctrl-C or SIGTERM stops the
web node first (so no new work arrives; it drains its clients, see foundation.drain_server), then the worker (which finishes what it holds), then
beat, and finally the embedded services if this run started them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devstack import embedded

ROOT = Path(__file__).resolve().parents[2]
COLOURS = {"web": "\033[36m", "worker": "\033[33m", "hooks": "\033[34m", "beat": "\033[35m", "run": "\033[32m"}
RESET = "\033[0m"
_print_lock = threading.Lock()


def say(name: str, line: str) -> None:
    colour = COLOURS.get(name, "") if sys.stdout.isatty() else ""
    end = RESET if colour else ""
    with _print_lock:
        sys.stdout.write(f"{colour}{name:<6} |{end} {line}\n")
        sys.stdout.flush()


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)

    def start(self, env: dict[str, str]) -> None:
        # Own session: a terminal's Ctrl-C reaches only the supervisor, which then stops the
        # children in order instead of all at once.
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, start_new_session=True,
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        say("run", f"started {self.name} (pid {self.proc.pid}): {' '.join(self.argv[1:4])} …")

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            say(self.name, line.rstrip())

    def stop(self, timeout: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            say("run", f"{self.name} did not stop in {timeout:.0f}s; killing it")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def web_stop_seconds(env: dict[str, str]) -> float:
    """How long a web node may take to stop: its drain (DRAIN_SECONDS, cut at DRAIN_GRACE_SECONDS
    more; foundation.drain_server), and a margin to exit, before it is killed."""
    return float(env.get("DRAIN_SECONDS", 10)) + float(env.get("DRAIN_GRACE_SECONDS", 5)) + 5


def _manage(env: dict[str, str], *args: str) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed with exit code {result.returncode}")


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60) -> bool:
    """True once `url` answers 200; False if `proc` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


class ServiceWatch:
    """Restarts the embedded services this run uses when they stop answering."""

    CHECK_EVERY = 2.0

    def __init__(self, postgres: bool, redis: bool):
        self.postgres, self.redis = postgres, redis
        self.failures = 0
        self.next_check = 0.0
        self.down_since: float | None = None

    def check(self) -> None:
        if not (self.postgres or self.redis) or time.monotonic() < self.next_check:
            return
        status = embedded.status()
        down = [name for name, wanted in (("postgres", self.postgres), ("redis", self.redis))
                if wanted and not status[name]]
        if not down:
            if self.down_since is not None:
                say("run", f"embedded services answer again after {time.monotonic() - self.down_since:.1f}s")
            self.failures, self.down_since = 0, None
            self.next_check = time.monotonic() + self.CHECK_EVERY
            return
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.failures += 1
        say("run", f"embedded {' and '.join(down)} not answering; starting it again (attempt {self.failures})")
        try:
            embedded.ensure_running(postgres="postgres" in down, redis="redis" in down)
        except Exception as exc:  # the next check tries again, later
            say("run", f"restart failed: {exc}")
        self.next_check = time.monotonic() + min(2 ** (self.failures - 1), 30)


def main() -> int:
    started = time.monotonic()
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "platform"), str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    port = env.setdefault("PORT", "8000")
    host = env.get("HOST", "127.0.0.1")

    started_services = False
    watch = ServiceWatch(postgres=not env.get("DATABASE_URL"), redis=not env.get("REDIS_URL"))
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        before = embedded.status()
        embedded.urls_hand_over(env)
        started_services = not all(before.values())
        say("run", f"embedded Postgres and Redis under {embedded.var_dir()} ({'started' if started_services else 'reused'})")

    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "bootstrap")

    bin_dir = Path(sys.executable).parent
    children = [
        Child("web", [sys.executable, "-m", "config.web", "--bind", host, "--port", port]),
        Child("worker", [str(bin_dir / "celery"), "-A", "config", "worker", "-l", "INFO",
                         "-n", f"worker-{port}@%h", "-Q", "celery,routing"]),
        Child("hooks", [str(bin_dir / "celery"), "-A", "config", "worker", "-l", "INFO",
                        "-n", f"webhooks-{port}@%h", "-Q", "webhooks"]),
        Child("beat", [str(bin_dir / "celery"), "-A", "config", "beat", "-l", "INFO",
                       "-s", str(embedded.var_dir() / "celerybeat-schedule")]),
    ]
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for child in children:
        child.start(env)

    base = f"http://{'localhost' if host in ('127.0.0.1', '0.0.0.0') else host}:{port}"
    if wait_ready(f"{base}/readyz", children[0].proc):
        say("run", f"ready in {time.monotonic() - started:.1f}s")
        say("run", f"admin:     {base}/admin/")
        say("run", f"demo:      {base}/demo/")
        say("run", f"websocket: {base.replace('http', 'ws', 1)}/ws")
        say("run", "Ctrl-C stops everything")

    exit_code = 0
    while not stopping.wait(0.5):
        watch.check()
        for child in children:
            if child.proc and child.proc.poll() is not None:
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > 5:
                    say("run", f"{child.name} keeps crashing (exit {child.proc.returncode}); stopping")
                    exit_code = 1
                    stopping.set()
                    break
                say("run", f"{child.name} exited with {child.proc.returncode}; restarting")
                time.sleep(min(2 ** (len(child.restarts) - 1), 10))
                child.start(env)

    say("run", "stopping: web, then the workers, then beat")
    for child, timeout in zip(children, (web_stop_seconds(env), 30, 30, 10), strict=True):
        child.stop(timeout)
    if started_services:
        say("run", f"stopped embedded {', '.join(embedded.stop()) or 'services'}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
