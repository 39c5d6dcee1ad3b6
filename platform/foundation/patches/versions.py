"""The guard every patch module runs before it reaches into its library: the installed versions must
be the ones the module was tested with (what requirements.lock pins), or it refuses to start.

A patch of a library's internals (a replaced method, a private attribute read or reset, a subclass
overriding a private hook) fails silently on another version: the name moves, the behaviour changes,
and nothing raises. So a patch module names its TESTED_VERSIONS and calls `require_tested` before it
patches anything (at import, or, for daphne, when it installs): on any other version the process
stops with UntestedVersions, naming each distribution, the version found and the one expected. An
operator who has checked the module against the installed versions sets its allow setting
(ALLOW_UNTESTED_VERSIONS; DAPHNE_ALLOW_UNTESTED_VERSIONS for daphne, Twisted and autobahn): the
process then starts, with a warning naming them. Exact versions, as for daphne from the start: a
patch release may move an internal too. tests/foundation/patches/test_versions.py holds every
module's TESTED_VERSIONS to the lock's pins.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Mapping

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)

ALLOW_UNTESTED_SETTING = "ALLOW_UNTESTED_VERSIONS"
INSTALL_LOCKED = "make install, or pip install --require-hashes -r requirements.lock"


class UntestedVersions(ImproperlyConfigured):
    """A library a patch module reaches into is not at the version the module was tested with."""


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def untested_versions(tested: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(distribution, version found, version expected) for each one not at its tested version."""
    found = []
    for name, expected in tested.items():
        version = installed_version(name)
        if version != expected:
            found.append((name, version, expected))
    return found


def _allowed(setting: str) -> bool:
    try:
        return bool(getattr(settings, setting, False))
    except ImproperlyConfigured:  # no settings in this process (yet): nobody has allowed anything
        return False


def require_tested(tested: Mapping[str, str], *, patcher: str, risk: str,
                   allow_setting: str = ALLOW_UNTESTED_SETTING) -> None:
    """Refuse (UntestedVersions) to let `patcher` patch versions other than `tested`, unless the
    operator allows it with `allow_setting`; then only warn. `risk`: what goes wrong on another version."""
    mismatches = untested_versions(tested)
    if not mismatches:
        return
    found = "; ".join(f"{name} {version} (expected {expected})" for name, version, expected in mismatches)
    if _allowed(allow_setting):
        log.warning("starting on untested versions, as %s allows: %s; %s's patches may not work on them",
                    allow_setting, found, patcher)
        return
    raise UntestedVersions(
        f"untested versions: {found}. {patcher} reaches into their internals; {risk}. Install the locked "
        f"versions ({INSTALL_LOCKED}), or, once {patcher} is checked against these versions, set "
        f"{allow_setting}=true to start anyway.")
