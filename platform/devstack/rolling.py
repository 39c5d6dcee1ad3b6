"""`make restart-web`: restart the web nodes of a running `make run`, one at a time, without downtime.

    python -m devstack.rolling          # the make run on PORT (default 8000)

The supervisor listens on a Unix socket, var/supervise-PORT.sock (one per `make run`, several may
share var/). This command connects, says `restart-web`, and prints the supervisor's progress lines
as they come; the last line is `done` (exit 0) or `failed: why` (exit 1). For each web node in
turn, the supervisor:

1. holds it (its crash watch will not restart it behind our back) and sends SIGTERM: the node
   answers 503 on /readyz at once, so HAProxy takes it out of rotation within a second, and closes
   its WebSockets with 1012 over DRAIN_SECONDS; the clients reconnect through HAProxy to the others;
2. waits for it to exit (DRAIN_SECONDS + DRAIN_GRACE_SECONDS + a margin, then SIGKILL);
3. starts it again, same NODE_ID and port (the new process cleans up the old one's sessions);
4. waits until its /readyz answers 200 and HAProxy reports it UP, then goes on to the next.

A node that does not come back stops the restart there (released to the crash watch, which keeps
trying): the others are left serving. One rolling restart runs at a time.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devstack import balancer, embedded
from devstack.children import Child, say, wait_ready

COMMAND = "restart-web"
DONE = "done"
FAILED = "failed"
READY_TIMEOUT = 90.0
UP_TIMEOUT = 15.0
UNIX_PATH_MAX = 107  # sun_path less its terminating NUL

Report = Callable[[str], None]


def socket_path(port: str | int, var_dir: Path | None = None) -> Path:
    return (var_dir or embedded.var_dir()) / f"supervise-{port}.sock"


def web_stop_timeout(env: dict[str, str]) -> float:
    """How long a web node may take to drain and exit before SIGKILL (the drain contract plus 5 s)."""
    return float(env.get("DRAIN_SECONDS", "10")) + float(env.get("DRAIN_GRACE_SECONDS", "5")) + 5


def _wait_up(stats_port: int, name: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if balancer.server_states(stats_port).get(name) == "UP":
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def restart_one(child: Child, env: dict[str, str], *, stats_port: int | None, stopping: threading.Event,
                report: Report) -> bool:
    """Drain, stop and start one web node; True once it serves again (and HAProxy says UP)."""
    with child.lock:
        child.held = True
    try:
        began = time.monotonic()
        report(f"{child.name}: draining (SIGTERM)")
        child.stop(web_stop_timeout(env))
        code = child.proc.returncode if child.proc else None
        # Under the lock the supervisor's shutdown takes to stop the nodes: either it finds the
        # new process and stops it too, or we see it stopping and start none.
        with child.lock:
            if stopping.is_set():
                report(f"{child.name}: exited with {code}; not started again, the supervisor is stopping")
                return False
            report(f"{child.name}: exited with {code} after {time.monotonic() - began:.1f}s; starting it again")
            child.start(env)
        assert child.ready_url is not None
        if not wait_ready(child.ready_url, child.proc, READY_TIMEOUT):
            report(f"{child.name}: not ready after {READY_TIMEOUT:.0f}s")
            return False
        if stats_port is not None and not _wait_up(stats_port, child.name, UP_TIMEOUT):
            report(f"{child.name}: ready, but HAProxy does not report it UP after {UP_TIMEOUT:.0f}s")
            return False
        report(f"{child.name}: serving again{' (UP in HAProxy)' if stats_port else ''}, "
               f"{time.monotonic() - began:.1f}s in all")
        return True
    finally:
        with child.lock:
            child.held = False


def restart_all(nodes: Sequence[Child], env: dict[str, str], *, stats_port: int | None,
                stopping: threading.Event, report: Report) -> bool:
    for i, child in enumerate(nodes, 1):
        if stopping.is_set():
            report("the supervisor is stopping")
            return False
        report(f"[{i}/{len(nodes)}] {child.name}")
        if not restart_one(child, env, stats_port=stats_port, stopping=stopping, report=report):
            return False
    return True


class ControlSocket:
    """A supervisor's Unix socket: one connection at a time, each saying one command line; `handle`
    runs it and reports progress lines back (and to the log, after `label`)."""

    def __init__(self, path: Path, handle: Callable[[str, Report], None], *, label: str):
        self.path, self.handle, self.label = path, handle, label
        self.sock: socket.socket | None = None

    def start(self) -> bool:
        """Listen; False (and a note why) when another supervisor holds the path or it is too long."""
        if len(os.fsencode(self.path)) > UNIX_PATH_MAX:
            say("run", f"no {self.label}: the control socket path is too long ({self.path})")
            return False
        if self.path.exists():
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(str(self.path))
                say("run", f"no {self.label}: another supervisor answers on {self.path}")
                return False
            except OSError:
                self.path.unlink(missing_ok=True)  # left by a supervisor that was killed
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(self.path))
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.path.unlink(missing_ok=True)

    def _serve(self) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed: the supervisor is stopping
            with conn:
                self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            command = conn.makefile("r").readline().strip()
        except OSError:
            return

        def report(line: str) -> None:
            say("run", f"{self.label}: {line}")
            try:
                conn.sendall(f"{line}\n".encode())
            except OSError:
                pass  # the command went away; what it started goes on

        self.handle(command, report)


class ControlServer(ControlSocket):
    """`make run`'s end of the socket: one rolling restart at a time."""

    def __init__(self, path: Path, nodes: Sequence[Child], env: dict[str, str], *, stats_port: int | None,
                 stopping: threading.Event):
        super().__init__(path, self._restart, label="rolling restart")
        self.nodes, self.env = nodes, env
        self.stats_port, self.stopping = stats_port, stopping

    def _restart(self, command: str, report: Report) -> None:
        if command != COMMAND:
            report(f"{FAILED}: unknown command {command!r} (known: {COMMAND})")
            return
        ok = restart_all(self.nodes, self.env, stats_port=self.stats_port, stopping=self.stopping, report=report)
        report(DONE if ok else f"{FAILED}: see the log above")


def control_ask(path: Path, command: str, out: Callable[[str], None]) -> str:
    """Say `command` on a supervisor's socket and pass each line it answers to `out`; the last line
    (OSError when nobody answers)."""
    last = ""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(f"{command}\n".encode())
        for line in sock.makefile("r"):
            last = line.rstrip("\n")
            out(last)
    return last


def main(argv: list[str]) -> int:
    port = argv[0] if argv else os.environ.get("PORT", "8000")
    path = socket_path(port)
    try:
        last = control_ask(path, COMMAND, lambda line: print(line, flush=True))
    except OSError as exc:
        print(f"no make run answers on {path} ({exc.strerror or exc}); is it running, with this PORT?",
              file=sys.stderr)
        return 1
    return 0 if last == DONE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
