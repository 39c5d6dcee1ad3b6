"""The lock files: what the tests run is what requirements-dev.lock pins, and production's
requirements.lock agrees with it on every package they share."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The project itself is never in its own lock (it is installed from the tree with --no-deps). Nothing
# else is left out: with --allow-unsafe pip-tools pins pip and setuptools too, and `make lock` feeds
# it pip, setuptools, wheel and pip-tools (what installs and builds the project, and locks it).
NOT_LOCKED = {"switchboard", "switchboard-client"}  # this project and its client package (clients/python), installed editable
LOCK_AGAIN = "run `make lock` and commit both lock files"


def pins(lock: str) -> dict[str, str]:
    text = (ROOT / lock).read_text()
    return {canonicalize_name(name): version
            for name, version in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.MULTILINE)}


def unpinned(dependencies: list[str], lock: str) -> list[str]:
    """The dependencies (for this platform) that a lock does not pin at a version they allow."""
    locked = pins(lock)
    wanted = [dep for dep in map(Requirement, dependencies) if dep.marker is None or dep.marker.evaluate()]
    return [str(dep) for dep in wanted if canonicalize_name(dep.name) not in locked
            or not dep.specifier.contains(locked[canonicalize_name(dep.name)], prereleases=True)]


def test_every_distribution_installed_here_is_pinned_in_the_dev_lock_at_exactly_its_version():
    locked = pins("requirements-dev.lock")
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    drift = {name: (version, locked.get(name, "not pinned")) for name, version in installed.items()
             if name not in NOT_LOCKED and locked.get(name) != version}
    assert not drift, (f"installed, but not as requirements-dev.lock pins it ((installed, pinned)): {drift}; "
                       "`make install` installs the lock (a package no longer pinned stays installed: "
                       "pip uninstall it, or remove the venv and `make install` again)")


def test_every_package_production_runs_has_the_same_version_in_the_dev_lock():
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    differ = {name: (version, dev.get(name, "missing")) for name, version in runtime.items() if dev.get(name) != version}
    assert not differ, f"requirements.lock and requirements-dev.lock disagree ((runtime, dev)): {differ}; {LOCK_AGAIN}"


def test_every_dependency_in_pyproject_is_pinned_in_the_runtime_lock_at_a_version_it_allows():
    missing = unpinned(PYPROJECT["dependencies"], "requirements.lock")
    assert not missing, f"not pinned in requirements.lock as pyproject.toml asks: {missing}; {LOCK_AGAIN}"


def test_every_dev_dependency_in_pyproject_is_pinned_in_the_dev_lock_at_a_version_it_allows():
    missing = unpinned(PYPROJECT["optional-dependencies"]["dev"], "requirements-dev.lock")
    assert not missing, f"not pinned in requirements-dev.lock as pyproject.toml asks: {missing}; {LOCK_AGAIN}"
