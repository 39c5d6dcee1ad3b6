"""Real processes for system and browser tests: daphne web nodes, Celery workers and beat."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from devstack.embedded import _redis_bin
from foundation.handoff import FORWARDING_QUEUE, ROUTING_QUEUE, WEBHOOK_QUEUE

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOG_DIR = ROOT / "var" / "test-logs"
ROUTING_WORKER_QUEUES = f"celery,{ROUTING_QUEUE}"  # what make run's routing worker serves (devstack.supervise)
OUTBOUND_WORKER_QUEUES = f"{WEBHOOK_QUEUE},{FORWARDING_QUEUE}"  # and its outbound worker: calls that wait on others


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url_for_tests() -> str:
    db = connection.settings_dict
    return f"postgresql://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)
            self.popen.wait(30)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class ProcessFactory:
    """Starts real platform processes with the test database's URL; stops them at teardown."""

    def __init__(self, request):
        self.procs: list[Proc] = []
        self.test_name = request.node.name
        LOG_DIR.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DATABASE_URL": database_url_for_tests(),
            "REDIS_URL": settings.REDIS_URL,
            "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
            "DEBUG": "false",
            "PYTHONUNBUFFERED": "1",
            # The tests' webhook receivers and auth services listen on 127.0.0.1: allowed explicitly.
            "OUTGOING_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
            # Teardown's SIGTERM drains a web node: a short window keeps tests that leave sockets open quick.
            "DRAIN_SECONDS": "1",
            "DRAIN_GRACE_SECONDS": "3",
        })
        env.update(extra)
        return env

    def spawn(self, name: str, argv: list[str], port: int | None = None, **env: str) -> Proc:
        log = LOG_DIR / f"{self.test_name}-{name}.log"
        fh = open(log, "w")
        env.setdefault("DB_APPLICATION_NAME", f"{self.test_name[:40]}-{name}")  # which test's process, in pg_stat_activity
        popen = subprocess.Popen(argv, cwd=ROOT, env=self.env(**env), stdout=fh, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        proc = Proc(name, popen, log, port)
        self.procs.append(proc)
        return proc

    def web(self, name: str = "web", port: int | None = None, **env: str) -> Proc:
        """A web node, on a free port or on `port`: a node restarted where its clients reconnect
        (given the old node's NODE_ID, it also cleans up the old node's sessions at once)."""
        port = port or free_port()
        env.setdefault("NODE_ID", f"{name}-{port}")
        proc = self.spawn(name, [sys.executable, "-m", "config.web", "--port", str(port)],
                          port=port, PORT=str(port), **env)
        wait_http(f"{proc.url}/readyz", proc)
        return proc

    def worker(self, name: str = "worker", concurrency: int = 2, queues: str = ROUTING_WORKER_QUEUES,
               **env: str) -> Proc:
        """A Celery worker as `make run` starts it: by default the routing worker (which never serves
        webhook calls or calls to neighbours); `webhook_worker` for those."""
        proc = self.spawn(name, [str(BIN / "celery"), "-A", "config", "worker", "-l", "INFO", "-c", str(concurrency),
                                 "-n", f"{name}-{os.getpid()}-{time.monotonic_ns()}@%h", "-Q", queues,
                                 "--without-mingle", "--without-gossip"], **env)
        wait_log(proc, "ready.")
        return proc

    def webhook_worker(self, name: str = "hooks", concurrency: int = 4, **env: str) -> Proc:
        return self.worker(name, concurrency, queues=OUTBOUND_WORKER_QUEUES, **env)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.alive():
                os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(20)
            except subprocess.TimeoutExpired:
                stacks_dump(proc)
                proc.kill()


def stacks_dump(proc: Proc) -> None:
    """A process that did not stop when told writes its threads' stacks to its log before it is
    killed (manage.py commands answer SIGUSR2 so; other processes are not asked)."""
    if proc.alive() and "manage.py" in " ".join(map(str, proc.popen.args)):
        os.kill(proc.popen.pid, signal.SIGUSR2)
        time.sleep(0.5)


def wait_http(url: str, proc: Proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.output()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready:\n{proc.output()[-3000:]}")


def wait_log(proc: Proc, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in proc.output():
            return
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.output()[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"{proc.name} never logged {text!r}:\n{proc.output()[-3000:]}")


@pytest.fixture
def processes(request, demo_network):
    """Processes of one test (stopped at its end), on the module's committed demo network."""
    factory = ProcessFactory(request)
    yield factory
    factory.stop_all()


class ModuleRequest:
    def __init__(self, name: str):
        self.node = type("N", (), {"name": name})()


@pytest.fixture(scope="module")
def demo_network(django_db_setup, django_db_blocker):
    """The demo tenant, committed for the whole module (processes outlive single tests).

    ANZ (app-id-343, master ANZ-123223) homed here for users 0-8999999; users 9000000+ are homed
    in domain-09 (another domain, linked to nothing: a message for them counts "no route to
    domain-09" attempts and ends a dead letter); BNZ is a second app (users 0-999999 only); LIM (app-id-lim) has
    tight limits: 3 connections per user, 20 deliveries per second, origin https://good.example.
    """
    from apps_registry.models import ClientApp, Domain, UserDistribution
    from apps_registry.pusher_credentials import PusherCredentials
    from apps_registry.selectors import app_snapshots_clear

    # pytest-django creates the test database only when some selected test is marked django_db (or
    # uses `db`); without one, this fixture would run against the development database and replace
    # its apps. Refuse instead.
    if not connection.settings_dict["NAME"].startswith("test_"):
        pytest.fail("no test database was set up (no selected test is marked django_db): the demo network would "
                    f"replace the apps of database {connection.settings_dict['NAME']!r}; select a django_db test too")
    with django_db_blocker.unblock():
        UserDistribution.objects.all().delete()
        ClientApp.objects.all().delete()
        here, _ = Domain.objects.get_or_create(name="domain-01")
        there, _ = Domain.objects.get_or_create(name="domain-09")
        # Open apps (auth mode none, as in the linker seed): the clients log in with any token.
        anz = ClientApp.objects.create(app_name="ANZ", app_id="app-id-343", master_user_id="ANZ-123223", auth_mode="none",
                                       rate_limit_per_second=50, rate_limit_burst=60, max_group_recipients=5,
                                       max_delivery_attempts=3)
        UserDistribution.objects.create(app=anz, domain=here, range_from=0, range_to=8999999)
        UserDistribution.objects.create(app=anz, domain=there, range_from=9000000, range_to=None)
        bnz = ClientApp.objects.create(app_name="BNZ", app_id="app-id-bnz", master_user_id="BNZ-1", auth_mode="none")
        UserDistribution.objects.create(app=bnz, domain=here, range_from=0, range_to=999999)
        lim = ClientApp.objects.create(app_name="LIM", app_id="app-id-lim", master_user_id="LIM-1", auth_mode="none",
                                       max_connections_per_user=3, deliveries_per_second=20, deliveries_burst=20,
                                       max_group_recipients=20, allowed_origins=["https://good.example"])
        UserDistribution.objects.create(app=lim, domain=here, range_from=0, range_to=999999)
        # A slow frame rate (2 a second, burst 10): a flood outruns it however slowly a busy node
        # handles each frame (at ANZ's 50 a second a slow node refills the bucket as fast as it reads).
        rtl = ClientApp.objects.create(app_name="RTL", app_id="app-id-rtl", master_user_id="RTL-1", auth_mode="none",
                                       rate_limit_per_second=2, rate_limit_burst=10)
        UserDistribution.objects.create(app=rtl, domain=here, range_from=0, range_to=999999)
        # Known Pusher credentials (tests/pusher.py): ANZ allows client events, BNZ does not.
        PusherCredentials.objects.filter(app=anz).update(pusher_app_id="343", key="anz-pusher-key",
                                                         secret="anz-pusher-secret", client_events=True)
        PusherCredentials.objects.filter(app=bnz).update(pusher_app_id="344", key="bnz-pusher-key",
                                                         secret="bnz-pusher-secret")
        app_snapshots_clear()
    yield {"anz": anz, "bnz": bnz, "lim": lim, "rtl": rtl}
    # Committed rows outlive the module unless removed: later tests expect an empty database.
    from presence.models import Node, PresenceEvent

    with django_db_blocker.unblock():
        ClientApp.objects.all().delete()  # cascades to messages, deliveries, mailboxes, sessions
        Node.objects.all().delete()
        PresenceEvent.objects.all().delete()  # the presence history has no foreign key to cascade from
        Domain.objects.all().delete()
        app_snapshots_clear()


@pytest.fixture(scope="module")
def module_processes(request, demo_network):
    factory = ProcessFactory(ModuleRequest(request.module.__name__.rsplit(".", 1)[-1]))
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def node(module_processes):
    """One web node and one worker shared by a test module."""
    web = module_processes.web("web")
    module_processes.worker("worker")
    return web


FAST_FAILURE_ENV = {
    # Shrunk timers so failure handling is observable within a test.
    "PRESENCE_HEARTBEAT_SECONDS": "1",
    "PRESENCE_NODE_TIMEOUT": "3",
    "RETRY_SWEEP_SECONDS": "1",
    "DELIVERY_ACK_TIMEOUT": "3",
    "ROUTING_DEADLINE_SECONDS": "2",
    "RETRY_BASE_SECONDS": "1",
}


def start_beat(factory: ProcessFactory, tmp_path: Path, **env: str) -> Proc:
    proc = factory.spawn("beat", [str(BIN / "celery"), "-A", "config", "beat", "-l", "INFO",
                                  "-s", str(tmp_path / "beat-schedule")], **{**FAST_FAILURE_ENV, **env})
    wait_log(proc, "beat: Starting")
    return proc


class PrivateRedis:
    """A Redis of this test's own (append-only, like the embedded one), so it can be killed."""

    def __init__(self, directory):
        self.port = free_port()
        self.dir = directory
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run([str(_redis_bin("redis-server")), "--port", str(self.port), "--bind", "127.0.0.1",
                        "--dir", str(self.dir), "--appendonly", "yes", "--save", "", "--daemonize", "yes",
                        "--pidfile", str(self.dir / "redis.pid")], check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError("private Redis did not start")

    def kill(self) -> None:
        pid = int((self.dir / "redis.pid").read_text())
        subprocess.run(["kill", "-9", str(pid)], check=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # gone once its port refuses connections
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                return
            time.sleep(0.02)
        raise TimeoutError("private Redis still answers after kill -9")


@pytest.fixture
def private_redis(tmp_path):
    """A test asks for it before `processes`: its processes are then stopped (drained) while their
    Redis still answers, and it is killed after them."""
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    try:
        server.kill()
    except Exception:
        pass
