"""The four-domain ring as processes: what `make network` supervises and what tests and benchmarks drive.

    ring = Ring(root_dir, postgres_url, redis_url, base_port=8000, env_overrides={...})
    ring.start()                 # databases, migrations, the ring file imported everywhere, then 12 processes
    ring.stop_domain(2); ring.start_domain(2)
    ring.ws_url(3), ring.http_url(3), ring.database_url(3)
    ring.stop()

Each domain gets its own database on `postgres_url`'s server (created when missing; a test ring's
`database_prefix` keeps them apart from the operator's) and its own Redis database on
`redis_url`'s (redis_db_base + N), and runs a web node, one Celery worker serving every queue
(ring_plan.WORKER_QUEUES) and beat (or beat inside the worker: `beat_in_worker`, fewer processes).

Start-up is sequential where it is CPU-bound and parallel where it waits: the domains are prepared
one after the other (one process each: migrate, import_config of the ring file, bootstrap; on a
fresh start domain-01's migrated database is copied as the template of the three others instead
of migrating each), then all processes start at once and their readiness is awaited together.

root_dir keeps what must survive a restart: the ring file (ring.yaml, the links' secrets),
secrets.json (META_SECRET, the admin password) and beat's schedules.

    python -m devstack.ring setup RING_FILE   # one domain's preparation, in that domain's environment
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import django
import psycopg
import redis
from django.core.management import call_command
from psycopg import sql

from devstack.children import ROOT, Child, say, stop_together, wait_ready
from devstack.ring_plan import (
    CONFIG_FILE,
    DEFAULT_DATABASE_PREFIX,
    DOMAIN_COUNT,
    WORKER_QUEUES,
    DomainPlan,
    domain_plans,
    ring_config_write,
    ring_ports,
    url_with_path,
)
from devstack.rolling import web_stop_timeout

Sink = Callable[[str, str], None]
READY_TIMEOUT = 180.0
WORKER_STOP_SECONDS = 30.0
CRASHES_PER_MINUTE = 5  # more, and the domain is stopped rather than restarted again and again


class RingError(RuntimeError):
    """A domain could not be prepared or did not become ready; the message says which and where its log is."""


class FileSink:
    """Output lines into one file per process under `log_dir` ("02/web" -> 02-web.log; the ring's own
    lines -> ring.log), for a ring whose output must not flood a terminal (tests)."""

    def __init__(self, log_dir: Path):
        self.dir = log_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, TextIO] = {}
        self.lock = threading.Lock()

    def path(self, name: str) -> Path:
        return self.dir / f"{'ring' if name == 'run' else name.replace('/', '-')}.log"

    def close(self) -> None:
        with self.lock:
            for fh in self.files.values():
                fh.close()
            self.files.clear()

    def __call__(self, name: str, line: str) -> None:
        with self.lock:
            fh = self.files.get(name)
            if fh is None:
                fh = self.files[name] = open(self.path(name), "a", buffering=1)  # kept open until close()
            fh.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def _secrets(root: Path) -> dict[str, str]:
    """root/secrets.json, made at the first start: the network's META_SECRET and the admin password."""
    path = root / "secrets.json"
    values = json.loads(path.read_text()) if path.exists() else {}
    wanted = {"meta_secret": lambda: secrets.token_urlsafe(32), "admin_password": lambda: secrets.token_urlsafe(12)}
    if any(key not in values for key in wanted):
        values = {key: values.get(key) or make() for key, make in wanted.items()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(values, indent=2))
        tmp.chmod(0o600)
        tmp.replace(path)
    return values


class Ring:
    def __init__(self, root_dir: Path | str, postgres_url: str, redis_url: str, base_port: int = 8000,
                 env_overrides: dict[str, str] | None = None, *, ports: list[int] | None = None,
                 database_prefix: str = DEFAULT_DATABASE_PREFIX, redis_db_base: int = 0,
                 beat_in_worker: bool = False, log_dir: Path | None = None, base_env: dict[str, str] | None = None):
        self.root = Path(root_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.postgres_url = postgres_url
        overrides = dict(env_overrides or {})
        stored = _secrets(self.root)
        env = dict(os.environ if base_env is None else base_env)
        self.admin_username = overrides.get("ADMIN_USERNAME") or env.get("ADMIN_USERNAME") or "admin"
        self.admin_password = overrides.get("ADMIN_PASSWORD") or env.get("ADMIN_PASSWORD") or stored["admin_password"]
        self.meta_secret = overrides.pop("META_SECRET", "") or stored["meta_secret"]
        self.ports = list(ports) if ports else ring_ports(base_port)
        self.plans = domain_plans(postgres_url=postgres_url, redis_url=redis_url, ports=self.ports,
                                  meta_secret=self.meta_secret, admin_password=self.admin_password,
                                  database_prefix=database_prefix, redis_db_base=redis_db_base,
                                  env_overrides=overrides, lake_root=self.root / "lake")
        env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "platform"), str(ROOT), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        self.config_path = self.root / CONFIG_FILE
        self.beat_in_worker = beat_in_worker
        self.sink: Sink = FileSink(log_dir) if log_dir is not None else say
        self.children = {plan.number: self._children(plan) for plan in self.plans}
        self.stopped: set[int] = set(self.children)  # domains not running (stopped, or not started yet)
        self.lock = threading.RLock()  # one domain start or stop at a time, and none during the crash watch
        self._due: dict[str, float] = {}  # a crashed child's restart time

    # --- addresses -------------------------------------------------------------------------------

    def plan(self, n: int) -> DomainPlan:
        return self.plans[n - 1]

    def ws_url(self, n: int) -> str:
        return self.plan(n).ws_url

    def http_url(self, n: int) -> str:
        return self.plan(n).http_url

    def admin_url(self, n: int) -> str:
        return f"{self.plan(n).http_url}/admin/"

    def database_url(self, n: int) -> str:
        return self.plan(n).database_url

    def redis_url(self, n: int) -> str:
        return self.plan(n).redis_url

    def domains(self) -> list[int]:
        return [plan.number for plan in self.plans]

    # --- processes -------------------------------------------------------------------------------

    def _children(self, plan: DomainPlan) -> list[Child]:
        celery = str(Path(sys.executable).parent / "celery")
        schedule = str(self.root / f"beat-{plan.tag}-schedule")
        web = Child(f"{plan.tag}/web", [sys.executable, "-m", "config.web", "--bind", "127.0.0.1", "--port", str(plan.port)],
                    env=plan.env, ready_url=f"{plan.http_url}/readyz", sink=self.sink)
        worker_argv = [celery, "-A", "config", "worker", "-l", "INFO", "-n", f"{plan.name}@%h", "-Q", WORKER_QUEUES,
                       "--without-mingle", "--without-gossip"]  # each domain's worker is alone on its broker
        if self.beat_in_worker:
            worker_argv += ["-B", "-s", schedule]
        children = [web, Child(f"{plan.tag}/worker", worker_argv, env=plan.env, sink=self.sink)]
        if not self.beat_in_worker:
            children.append(Child(f"{plan.tag}/beat", [celery, "-A", "config", "beat", "-l", "INFO", "-s", schedule],
                                  env=plan.env, sink=self.sink))
        return children

    def names(self) -> list[str]:
        return [child.name for children in self.children.values() for child in children]

    def _web(self, n: int) -> Child:
        return self.children[n][0]

    # --- preparation -----------------------------------------------------------------------------

    def _server(self) -> psycopg.Connection:
        return psycopg.connect(url_with_path(self.postgres_url, "postgres"), autocommit=True, connect_timeout=10)

    def _existing_databases(self) -> set[str]:
        with self._server() as conn:
            return {row[0] for row in conn.execute("select datname from pg_database")}

    def _create_database(self, name: str, template: str | None = None) -> None:
        statement = sql.SQL("create database {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" template {}").format(sql.Identifier(template))
        with self._server() as conn:
            conn.execute(statement)

    def _setup(self, plan: DomainPlan) -> None:
        child = Child(f"{plan.tag}/setup", [sys.executable, "-m", "devstack.ring", "setup", str(self.config_path)],
                      env=plan.env, sink=self.sink)
        child.start(self.env)
        assert child.proc is not None
        if child.proc.wait() != 0:
            raise RingError(f"preparing {plan.name} failed (exit {child.proc.returncode}); see its setup output")

    def prepare(self) -> None:
        """The ring file, then each domain's database: created when missing, migrated, the ring file
        imported and the admin login ensured. A fresh ring migrates one database and copies it."""
        ring_config_write(self.config_path, self.ports)
        existing = self._existing_databases()
        template = None
        for plan in self.plans:
            began = time.monotonic()
            if plan.database not in existing:
                self._create_database(plan.database, template)
                template = template or plan.database
            self._setup(plan)
            self.sink("run", f"{plan.name} prepared ({plan.database}) in {time.monotonic() - began:.1f}s")

    def reset(self) -> None:
        """Drop the ring's databases and empty its Redis databases (a test ring's teardown)."""
        with self._server() as conn:
            for plan in self.plans:
                conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(plan.database)))
        for plan in self.plans:
            client = redis.Redis.from_url(plan.redis_url, socket_timeout=5)
            try:
                client.flushdb()
            finally:
                client.close()

    # --- running ---------------------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT) -> float:
        """Prepare and start every domain; the seconds it took, once every web node is ready."""
        began = time.monotonic()
        self.prepare()
        with self.lock:
            for n in self.domains():
                self._start_children(n)
        self._wait_ready(self.domains(), timeout)
        return time.monotonic() - began

    def _start_children(self, n: int) -> None:
        for child in self.children[n]:
            with child.lock:
                child.restarts.clear()
                child.start(self.env)
        self.stopped.discard(n)

    def _wait_ready(self, numbers: list[int], timeout: float) -> None:
        """Each web node answers /readyz, and each domain has heard from the network since it started
        (until then it is cut off and serves no user with a standby: messaging.federation.takeover.fence)."""
        began = datetime.now(UTC)
        deadline = time.monotonic() + timeout
        for n in numbers:  # started together: waiting one after the other costs nothing
            web = self._web(n)
            where = f" (logs: {self.sink.dir})" if isinstance(self.sink, FileSink) else ""
            if not wait_ready(web.ready_url or "", web.proc, max(1.0, deadline - time.monotonic())):
                raise RingError(f"{self.plan(n).name}'s web node is not ready at {web.ready_url}{where}")
            while not self._heard_since(n, began):
                if time.monotonic() > deadline:
                    raise RingError(f"{self.plan(n).name} has heard from no other domain{where}")
                time.sleep(0.2)

    def _heard_since(self, n: int, began: datetime) -> bool:
        with psycopg.connect(self.database_url(n), autocommit=True, connect_timeout=10) as conn:
            return conn.execute("SELECT count(*) FROM messaging_domainheard WHERE heard_at > %s",
                                [began]).fetchone()[0] > 0

    def start_domain(self, n: int, timeout: float = READY_TIMEOUT, *, env: dict[str, str] | None = None) -> None:
        """Start one stopped domain again (its database and configuration are as it left them);
        `env`: settings its processes take from now on, over the ring's."""
        with self.lock:
            if n not in self.stopped:
                return
            for child in self.children[n]:
                child.env = {**child.env, **(env or {})}
            self._start_children(n)
        self._wait_ready([n], timeout)

    def kill_domain(self, n: int) -> None:
        """Kill one domain's processes with SIGKILL, all at once: a crash (nothing drains)."""
        with self.lock:
            self.stopped.add(n)
            for child in self.children[n]:
                self._due.pop(child.name, None)
                child.kill()

    def stop_domain(self, n: int) -> None:
        """Stop one domain, the others running on: its web node drains, then its worker and beat stop."""
        with self.lock:
            self.stopped.add(n)
            web, *rest = self.children[n]
            for child in self.children[n]:
                self._due.pop(child.name, None)
            stop_together([web], web_stop_timeout({**self.env, **self.plan(n).env}))
            stop_together(rest, WORKER_STOP_SECONDS)

    def stop(self) -> None:
        """Stop everything: the web nodes together (each drains), then the workers, then beat."""
        with self.lock:
            self.stopped.update(self.children)
            webs = [children[0] for children in self.children.values()]
            drain = max(web_stop_timeout({**self.env, **plan.env}) for plan in self.plans)
            stop_together(webs, drain)
            roles = [c for children in self.children.values() for c in children[1:]]
            stop_together([c for c in roles if c.name.endswith("/worker")], WORKER_STOP_SECONDS)
            stop_together([c for c in roles if c.name.endswith("/beat")], 10)

    def running(self, n: int) -> bool:
        return n not in self.stopped

    def restart_crashed(self) -> None:
        """The crash watch (make network calls it every half second): a process of a running domain
        that exited is started again, after 1, 2, 4 .. 10 s; a domain whose processes crash more than
        CRASHES_PER_MINUTE times a minute is stopped instead, and said so."""
        with self.lock:
            now = time.monotonic()
            for n, children in self.children.items():
                if n in self.stopped:
                    continue
                for child in children:
                    if child.running() or child.proc is None:
                        continue
                    due = self._due.get(child.name)
                    if due is None:
                        child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                        if len(child.restarts) > CRASHES_PER_MINUTE:
                            self.sink("run", f"{child.name} keeps crashing (exit {child.proc.returncode}); stopping "
                                             f"{self.plan(n).name}: `python -m devstack.network start {self.plan(n).name}`")
                            threading.Thread(target=self.stop_domain, args=(n,), daemon=True).start()
                            self.stopped.add(n)
                            break
                        delay = min(2 ** (len(child.restarts) - 1), 10)
                        self._due[child.name] = now + delay
                        self.sink("run", f"{child.name} exited with {child.proc.returncode}; restarting in {delay}s")
                    elif now >= due:
                        del self._due[child.name]
                        child.start(self.env)

    def status(self) -> list[str]:
        lines = []
        for plan in self.plans:
            state = "stopped" if plan.number in self.stopped else "running"
            procs = ", ".join(f"{c.name.split('/')[1]} {'pid ' + str(c.proc.pid) if c.running() and c.proc else 'down'}"
                              for c in self.children[plan.number])
            lines.append(f"{plan.name} {state}: {plan.ws_url} ({procs})")
        return lines


def _setup_domain(config_path: str) -> int:
    """One domain's preparation, in one process (a Django start-up costs seconds on two cores)."""
    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    call_command("import_config", config_path)
    call_command("bootstrap")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "setup":
        return _setup_domain(argv[1])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["DOMAIN_COUNT", "FileSink", "Ring", "RingError"]
