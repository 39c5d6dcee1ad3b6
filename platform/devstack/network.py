"""`make network`: the four-domain ring of the linker seed's meta example, on this machine.

    make network                    # python -m devstack.network
    make network-stop DOMAIN=02     # python -m devstack.network stop domain-02 (or 02, or 2)
    make network-start DOMAIN=02    # python -m devstack.network start domain-02
    make network-status             # python -m devstack.network status
    make network-reset              # python -m devstack.network reset: its databases, Redis databases
                                    # and var/network/ deleted (not while it runs)

domain-01 .. domain-04, linked 01-02, 02-03, 03-04 and 01-04; domain-0N serves
ws://127.0.0.1:800N/ws and its admin on http://127.0.0.1:800N/admin/ (NETWORK_BASE_PORT=8000 moves
them). Each domain has its own database (switchboard_domain_0N) on the embedded Postgres and its own
Redis database (N) on the embedded Redis, or on the servers of DATABASE_URL / REDIS_URL when set, and
its own web node, worker and beat (devstack.ring). domain-01 is the meta: the others pull their
configuration from it (META_URL, META_SECRET). var/network/ keeps the ring file (ring.yaml, the
links' secrets) and secrets.json (META_SECRET and the admin password every domain shares).

Ctrl-C stops everything (the web nodes drain first, as in `make run`). While it runs, one domain
can be stopped and started again alone, the others running on: the commands above speak to it over
var/network/control.sock. A process that crashes is started again with backoff; a domain whose
processes keep crashing is stopped, and said so.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from devstack import embedded
from devstack.children import name_width, say
from devstack.ring import Ring, RingError
from devstack.ring_plan import ANZ_DISTRIBUTIONS, META_DOMAIN, domain_number
from devstack.rolling import ControlSocket, Report, control_ask
from devstack.supervise import ServiceWatch

DONE = "done"
FAILED = "failed"
COMMANDS = ("status", "stop", "start")


def network_dir() -> Path:
    return embedded.var_dir() / "network"


def control_path() -> Path:
    return network_dir() / "control.sock"


def network_ring(env: dict[str, str], root: Path | None = None) -> Ring:
    """The ring `make network` runs, on env's DATABASE_URL / REDIS_URL servers (not started)."""
    return Ring(root or network_dir(), env["DATABASE_URL"], env["REDIS_URL"],
                base_port=int(env.get("NETWORK_BASE_PORT", "8000")), base_env=env)


def _users(n: int) -> str:
    for domain, low, high in ANZ_DISTRIBUTIONS:
        if domain == n:
            return f"ANZ-{low} .. ANZ-{high}" if high is not None else f"ANZ-{low} and up"
    return ""


def where_to_click(ring: Ring) -> list[str]:
    lines = []
    for n in ring.domains():
        meta = " (meta)" if n == META_DOMAIN else "       "
        lines.append(f"{ring.plan(n).name}{meta}  {ring.ws_url(n):<24} admin {ring.admin_url(n):<30} users {_users(n)}")
    lines.append(f"admin login on every domain: {ring.admin_username} / {ring.admin_password}")
    lines.append("demo: open /demo/ on a user's home domain (ANZ-3123456 lives on domain-03)")
    lines.append("one domain: make network-stop DOMAIN=02, make network-start DOMAIN=02, make network-status")
    return lines


def control_handle(ring: Ring, command: str, report: Report) -> None:
    """`status`, `stop domain-0N`, `start domain-0N` (make network's control socket)."""
    verb, _, target = command.partition(" ")
    if verb == "status":
        for line in ring.status():
            report(line)
        report(DONE)
        return
    if verb not in COMMANDS:
        report(f"{FAILED}: unknown command {command!r} (known: status, stop DOMAIN, start DOMAIN)")
        return
    try:
        n = domain_number(target)
    except ValueError as exc:
        report(f"{FAILED}: {exc}")
        return
    name = ring.plan(n).name
    if verb == "stop":
        if not ring.running(n):
            report(f"{name} is not running")
        else:
            report(f"stopping {name} (its web node drains first)")
            ring.stop_domain(n)
            report(f"{name} stopped; the other domains run on")
        report(DONE)
        return
    if ring.running(n):
        report(f"{name} is running")
        report(DONE)
        return
    report(f"starting {name}")
    began = time.monotonic()
    try:
        ring.start_domain(n)
    except RingError as exc:
        report(f"{FAILED}: {exc}")
        return
    report(f"{name} serves again on {ring.ws_url(n)} after {time.monotonic() - began:.1f}s")
    report(DONE)


def run() -> int:
    began = time.monotonic()
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    watch = ServiceWatch(postgres=not env.get("DATABASE_URL"), redis=not env.get("REDIS_URL"))
    started_services = False
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        before = embedded.status()
        embedded.urls_hand_over(env)
        started_services = not all(before.values())
        say("run", f"embedded Postgres and Redis under {embedded.var_dir()} ({'started' if started_services else 'reused'})")
    ring = network_ring(env)
    name_width([*ring.names(), *(f"{p.tag}/setup" for p in ring.plans), "run"])
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    control = ControlSocket(control_path(), lambda command, report: control_handle(ring, command, report),
                            label="network")
    exit_code = 0
    try:
        ring.start()
    except RingError as exc:
        say("run", str(exc))
        stopping.set()
        exit_code = 1
    if not stopping.is_set():
        control.start()
        say("run", f"the ring is ready in {time.monotonic() - began:.1f}s")
        for line in where_to_click(ring):
            say("run", line)
        say("run", "Ctrl-C stops everything")
    while not stopping.wait(0.5):
        watch.check()
        ring.restart_crashed()
    control.close()
    say("run", "stopping: the web nodes (draining), the workers, beat")
    ring.stop()
    if started_services:
        say("run", f"stopped embedded {', '.join(embedded.stop()) or 'services'}")
    return exit_code


def reset() -> int:
    """Forget the ring: drop its four databases, empty its Redis databases, delete var/network/."""
    try:
        control_ask(control_path(), "status", lambda line: None)
    except OSError:
        pass
    else:
        print("make network is running: stop it (Ctrl-C) first", file=sys.stderr)
        return 1
    env = dict(os.environ)
    embedded.urls_hand_over(env)
    ring = network_ring(env)
    ring.reset()
    shutil.rmtree(network_dir())
    print(f"dropped {', '.join(plan.database for plan in ring.plans)}; emptied Redis databases "
          f"{', '.join(plan.redis_url.rsplit('/', 1)[1] for plan in ring.plans)}; deleted {network_dir()}")
    return 0


def command(argv: list[str]) -> int:
    """`status`, `stop DOMAIN` or `start DOMAIN`, said to the running `make network`."""
    if argv[0] not in COMMANDS or (argv[0] != "status") != (len(argv) == 2) or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = control_path()
    try:
        last = control_ask(path, " ".join(argv), lambda line: print(line, flush=True))
    except OSError as exc:
        print(f"no make network answers on {path} ({exc.strerror or exc}); is it running?", file=sys.stderr)
        return 1
    return 0 if last == DONE else 1


def main(argv: list[str]) -> int:
    if argv == ["reset"]:
        return reset()
    return command(argv) if argv else run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
