"""The processes `make run` supervises: start with prefixed output, stop with SIGTERM then SIGKILL.

A child runs in a session of its own, so a terminal's Ctrl-C reaches only the supervisor, which then
stops the children in order instead of all at once. A child that is `held` is being restarted on
purpose (devstack.rolling): the supervisor's crash watch leaves it alone until it is released; its
`lock` makes "not held, and exited" one observation, so the watch never restarts a node the rolling
restart has just stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLOURS = {"web": "\033[36m", "worker": "\033[33m", "outbound": "\033[34m", "beat": "\033[35m", "lb": "\033[31m",
           "run": "\033[32m"}
RESET = "\033[0m"
_print_lock = threading.Lock()
_name_width = [6]


def name_width(names: Sequence[str]) -> None:
    """Line the prefixes up for these names (at least six columns, as with one web node)."""
    _name_width[0] = max(6, *(len(n) for n in names))


def say(name: str, line: str) -> None:
    # "web-2", and "02/web" (make network: domain, then role) take the role's colour.
    colour = COLOURS.get(name.split("/")[-1].split("-")[0], "") if sys.stdout.isatty() else ""
    end = RESET if colour else ""
    with _print_lock:
        sys.stdout.write(f"{colour}{name:<{_name_width[0]}} |{end} {line}\n")
        sys.stdout.flush()


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's environment
    ready_url: str | None = None  # a web node's /readyz
    sink: Callable[[str, str], None] | None = None  # where its output lines go (name, line); say() by default
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)
    held: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env={**env, **self.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, start_new_session=True,
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        (self.sink or say)("run", f"started {self.name} (pid {self.proc.pid}): {' '.join(self.argv[1:4])} …")

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        sink = self.sink or say
        for line in proc.stdout:
            sink(self.name, line.rstrip())

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL its whole process group at once (a crash, not a stop: nothing drains, nothing is told)."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the exit until `deadline` (time.monotonic()); then SIGKILL its whole group."""
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say("run", f"{self.name} did not stop in time; killing it")
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float) -> None:
        self.terminate()
        self.wait_or_kill(time.monotonic() + timeout)


def stop_together(children: Sequence[Child], timeout: float) -> None:
    """SIGTERM to all at once (web nodes drain side by side), then wait up to `timeout` for all.
    Each under its lock: a rolling restart starting a node again is either done (and that process
    stopped) or sees the supervisor stopping."""
    for child in children:
        with child.lock:
            child.terminate()
    deadline = time.monotonic() + timeout
    for child in children:
        child.wait_or_kill(deadline)


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 60) -> bool:
    """True once `url` answers 200; False if `proc` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False
