"""What the test suite needs from the operating system, installed when missing.

    python -m devstack.sysdeps [chromium] [java] [haproxy] [node]

`make test` runs this before pytest, so a bare machine needs nothing but Python and `make`:

- chromium: Debian's `chromium`, driven by the browser tests (Playwright's own browser download
  does not work on machines without general internet access);
- java: a Java 17+ runtime (Debian's `openjdk-17-jre-headless`) for PySpark;
- haproxy: Debian's `haproxy`, the load balancer in front of several web nodes (`make run
  WEB_NODES=3` installs it too; the load-balancing system tests run it);
- node: Node.js and npm, which run the real `socket.io-client` (its version pinned in
  tests/node/package-lock.json, installed by `make test` with `npm ci`) in the Socket.IO tests.

As root on a Debian-like system it installs them with apt-get. Otherwise it prints the one command
to run and exits 1, so the suite does not start only to fail half-way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class SystemDependency:
    name: str
    package: str
    why: str

    def present(self) -> bool:
        return PRESENT[self.name]()


def _chromium_present() -> bool:
    path = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    return os.path.exists(path) or shutil.which("chromium") is not None


def haproxy_path() -> str | None:
    """The HAProxy binary: HAPROXY_PATH, Debian's /usr/sbin/haproxy, or one on PATH."""
    path = os.environ.get("HAPROXY_PATH", "/usr/sbin/haproxy")
    return path if os.path.exists(path) else shutil.which("haproxy")


def java_major_version() -> int | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def _java_present() -> bool:
    version = java_major_version()
    return version is not None and version >= 17


PRESENT = {"chromium": _chromium_present, "java": _java_present, "haproxy": lambda: haproxy_path() is not None,
           "node": lambda: shutil.which("node") is not None and shutil.which("npm") is not None}
DEPENDENCIES = {
    "chromium": SystemDependency("chromium", "chromium", "the browser tests drive it headless"),
    "java": SystemDependency("java", "openjdk-17-jre-headless", "PySpark runs on a Java 17+ runtime"),
    "haproxy": SystemDependency("haproxy", "haproxy", "the load balancer in front of several web nodes"),
    "node": SystemDependency("node", "nodejs npm", "the Socket.IO tests drive the real socket.io-client from npm"),
}


def _can_apt() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def ensure(names: list[str]) -> int:
    missing = [DEPENDENCIES[n] for n in names if not DEPENDENCIES[n].present()]
    if not missing:
        return 0
    packages = " ".join(dep.package for dep in missing)
    if not _can_apt():
        for dep in missing:
            print(f"sysdeps: {dep.name} is missing ({dep.why})", file=sys.stderr)
        print(f"sysdeps: install it with: sudo apt-get install -y {packages}", file=sys.stderr)
        return 1
    print(f"sysdeps: installing {packages} with apt-get", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages.split()],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    still = [dep.name for dep in missing if not dep.present()]
    if still:
        print(f"sysdeps: {', '.join(still)} still missing after apt-get", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    names = argv or list(DEPENDENCIES)
    unknown = [n for n in names if n not in DEPENDENCIES]
    if unknown:
        print(f"sysdeps: unknown dependency {', '.join(unknown)}; known: {', '.join(DEPENDENCIES)}", file=sys.stderr)
        return 2
    return ensure(names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
