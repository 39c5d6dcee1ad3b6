"""An embedded Postgres whose postmaster was killed (kill -9, the OOM killer) leaves its backends
running with the old shared memory attached, and a new postmaster refuses to start beside them:
`pg_clear_remains` ends them, so devstack.embedded can start the cluster again."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _processes_in(directory: Path) -> list[int]:
    """Pids of the processes whose working directory is `directory` (every Postgres process of a
    cluster runs in its data directory)."""
    pids = []
    target = str(directory.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd") == target:
                pids.append(int(entry.name))
        except OSError:
            continue  # gone meanwhile, or not ours to look at
    return pids


def pg_clear_remains(data: Path) -> None:
    """After the postmaster was killed (kill -9, OOM killer), its backends live on and keep the old
    shared memory attached, and a new postmaster refuses to start beside them. Nothing of that
    cluster answers any more (the caller checked), so they are ended first. A pid file naming a
    process that is no Postgres at all (the pid was reused) is stale too."""
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return
    if _pg_postmaster_alive(pid_file):
        # Alive but not answering (overloaded, still starting): never kill a live cluster.
        raise RuntimeError(f"the embedded Postgres runs but does not answer; see {data.parent / 'server.log'}")
    remains = [pid for pid in _processes_in(data) if pid != os.getpid()]
    for pid in remains:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while remains and time.monotonic() < deadline:
        remains = [pid for pid in remains if Path(f"/proc/{pid}").exists()]
        time.sleep(0.05)
    pid_file.unlink(missing_ok=True)


def _pg_postmaster_alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
        return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
