"""`make run`: the whole platform as one supervised foreground process group.

    make run [WEB_NODES=3] [WORKERS=2] [PORT=8000]

Starts (or reuses) the embedded services when no DATABASE_URL / REDIS_URL is set, migrates,
ensures the demo app and an admin login, then runs the web node(s), WORKERS Celery workers (routing
and the default queue), an outbound worker (the webhooks and forwarding queues: tenants' receivers
and neighbour domains never hold a thread that routing needs) and Celery beat with prefixed logs.

With one web node (the default) it serves on PORT itself. With WEB_NODES=N, HAProxy (installed from
Debian's package when missing, devstack.sysdeps) listens on PORT in front of web nodes web-1..web-N
on 127.0.0.1:PORT+1..PORT+N (each its own NODE_ID; TRUSTED_PROXIES names 127.0.0.1 so they believe
HAProxy's X-Forwarded-For), with its stats page on 127.0.0.1:PORT+N+1; devstack.balancer writes its
configuration under var/. `make restart-web` restarts the web nodes one at a time (devstack.rolling,
over var/supervise-PORT.sock).

A child that crashes is restarted with backoff. The embedded Postgres and Redis are watched the
same way: one that stops answering (killed, crashed) is started again, with backoff, and the web
nodes, workers and beat reconnect by themselves. Ctrl-C or SIGTERM stops the web nodes first, all at
once (each drains: 503 on /readyz, its WebSockets closed with 1012 over DRAIN_SECONDS; SIGKILL after
DRAIN_SECONDS + DRAIN_GRACE_SECONDS + 5 s), then the workers (which finish what they hold), then
beat, then HAProxy, and finally the embedded services if this run started them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from devstack import balancer, embedded, sysdeps
from devstack.children import ROOT, Child, name_width, say, stop_together, wait_ready
from devstack.rolling import ControlServer, socket_path, web_stop_timeout


def _manage(env: dict[str, str], *args: str) -> None:
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed with exit code {result.returncode}")


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


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Twisted listens
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def side_ports(port: int, count: int) -> list[int]:
    """PORT+1 .. PORT+count: the nodes' ports behind HAProxy, then its stats page's. One that is
    taken (another program, another make run) is replaced by a free one, and said, rather than left
    to stop a node at start."""
    ports = []
    for wanted in range(port + 1, port + count + 1):
        if _bindable(wanted) and wanted not in ports:
            ports.append(wanted)
        else:
            ports.append(embedded.free_port())
            say("run", f"port {wanted} is taken; using {ports[-1]} instead")
    return ports


def _web_nodes(env: dict[str, str], host: str, port: int, ports: list[int]) -> list[Child]:
    """One node on PORT as before, or one per port of `ports` behind HAProxy, each with its NODE_ID."""
    web = [sys.executable, "-m", "config.web"]
    if not ports:
        url = f"http://{_local(host)}:{port}/readyz"
        return [Child("web", [*web, "--bind", host, "--port", str(port)], ready_url=url)]
    trusted = ",".join(dict.fromkeys([*filter(None, env.get("TRUSTED_PROXIES", "").split(",")), "127.0.0.1"]))
    return [Child(f"web-{i}", [*web, "--bind", "127.0.0.1", "--port", str(node_port)],
                  env={"NODE_ID": f"web-{i}", "PORT": str(node_port), "TRUSTED_PROXIES": trusted},
                  ready_url=f"http://127.0.0.1:{node_port}/readyz")
            for i, node_port in enumerate(ports, 1)]


def _workers(port: int, count: int) -> list[Child]:
    celery = str(Path(sys.executable).parent / "celery")
    names = ["worker"] if count == 1 else [f"worker-{i}" for i in range(1, count + 1)]
    return [Child(name, [celery, "-A", "config", "worker", "-l", "INFO", "-n", f"{name}-{port}@%h",
                         "-Q", "celery,routing"]) for name in names]


def _balancer(host: str, port: int, nodes: list[Child], stats_port: int) -> Child:
    servers = [balancer.Server(n.name, int(n.env["PORT"])) for n in nodes]
    config = balancer.write_config(embedded.var_dir() / f"haproxy-{port}.cfg",
                                   balancer.haproxy_config(port=port, host=host, servers=servers, stats_port=stats_port))
    return Child("lb", balancer.haproxy_argv(config))


def _local(host: str) -> str:
    return "localhost" if host in ("127.0.0.1", "0.0.0.0") else host


def _count(env: dict[str, str], name: str) -> int:
    try:
        value = int(env.get(name, "1"))
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(f"{name} must be a whole number of at least 1, not {env.get(name)!r}")
    return value


def main() -> int:
    started = time.monotonic()
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "platform"), str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    port = int(env.setdefault("PORT", "8000"))
    host = env.get("HOST", "127.0.0.1")
    web_count, worker_count = _count(env, "WEB_NODES"), _count(env, "WORKERS")
    if web_count > 1 and sysdeps.ensure(["haproxy"]) != 0:
        return 1

    started_services = False
    watch = ServiceWatch(postgres=not env.get("DATABASE_URL"), redis=not env.get("REDIS_URL"))
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        before = embedded.status()
        embedded.urls_hand_over(env)
        started_services = not all(before.values())
        say("run", f"embedded Postgres and Redis under {embedded.var_dir()} ({'started' if started_services else 'reused'})")

    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "bootstrap")

    celery = str(Path(sys.executable).parent / "celery")
    ports = side_ports(port, web_count + 1) if web_count > 1 else []  # the nodes', then the stats page's
    nodes = _web_nodes(env, host, port, ports[:-1])
    workers = [*_workers(port, worker_count),
               # Calls that wait on others (tenants' webhook URLs, neighbour domains): never on the
               # routing worker's threads.
               Child("outbound", [celery, "-A", "config", "worker", "-l", "INFO", "-n", f"outbound-{port}@%h",
                                  "-Q", "webhooks,forwarding"])]
    beat = Child("beat", [celery, "-A", "config", "beat", "-l", "INFO",
                          "-s", str(embedded.var_dir() / "celerybeat-schedule")])
    stats_port = ports[-1] if ports else None
    lb = [_balancer(host, port, nodes, stats_port)] if stats_port else []
    children = [*nodes, *workers, beat, *lb]
    name_width([c.name for c in children] + ["run"])
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for child in [*nodes, *workers, beat]:
        child.start(env)
    control = ControlServer(socket_path(port), nodes, env, stats_port=stats_port, stopping=stopping)
    control.start()

    base = f"http://{_local(host)}:{port}"
    nodes_ready = all([wait_ready(n.ready_url or "", n.proc) for n in nodes])
    for child in lb:  # after the nodes: HAProxy's first checks find them up
        child.start(env)
    if nodes_ready and wait_ready(f"{base}/readyz", None, 30):
        say("run", f"ready in {time.monotonic() - started:.1f}s")
        say("run", f"admin:     {base}/admin/")
        say("run", f"demo:      {base}/demo/")
        say("run", f"websocket: {base.replace('http', 'ws', 1)}/ws")
        if stats_port:
            say("run", f"HAProxy in front of {', '.join(n.name for n in nodes)}; its stats: http://localhost:{stats_port}/")
            say("run", f"`make restart-web{'' if port == 8000 else f' PORT={port}'}` restarts the web nodes one at a time")
        say("run", "Ctrl-C stops everything")

    exit_code = 0
    while not stopping.wait(0.5):
        watch.check()
        for child in children:
            with child.lock:
                if child.held or child.running():
                    continue
                assert child.proc is not None
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

    control.close()
    say("run", f"stopping: the web node{'s' if len(nodes) > 1 else ''} (draining), the workers, beat"
               f"{', HAProxy' if lb else ''}")
    stop_together(nodes, web_stop_timeout(env))
    stop_together(workers, 30)
    beat.stop(10)
    for child in lb:
        child.stop(10)
    if started_services:
        say("run", f"stopped embedded {', '.join(embedded.stop()) or 'services'}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
