"""Every patch of a library's internals refuses to run on a version it was not tested with: a process that
imports it stops, naming the library, the version found and the one expected, unless an operator
allows untested versions. (daphne's, checked when it installs: test_daphne.)"""

from __future__ import annotations

import importlib
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from foundation import patches
from foundation.patches import versions
from foundation.patches.versions import UntestedVersions
from tests.foundation.patches import UNTESTED
from tests.processes import ROOT, ProcessFactory, free_port

CHECKED_ON_IMPORT = [f"foundation.patches.{name}" for name in patches.CHECKED_ON_IMPORT]
LIBRARY = {"foundation.patches.channels": "channels", "foundation.patches.channels_redis": "channels-redis",
           "foundation.patches.django": "Django"}


def locked() -> dict[str, str]:
    lock = (ROOT / "requirements.lock").read_text()
    return {canonicalize_name(name): version for name, version in re.findall(r"^(\S+)==(\S+)", lock, re.MULTILINE)}


def test_every_patch_module_but_daphnes_is_checked_as_it_is_imported():
    folder = Path(patches.__file__).parent
    assert sorted(path.stem for path in folder.glob("*.py")) == sorted(
        ["__init__", "versions", "daphne", *patches.CHECKED_ON_IMPORT])
    assert sorted(LIBRARY) == sorted(CHECKED_ON_IMPORT)


@pytest.mark.parametrize("module", CHECKED_ON_IMPORT)
def test_the_tested_versions_are_the_ones_the_lock_pins(module):
    tested = importlib.import_module(module).TESTED_VERSIONS
    assert {name: locked().get(canonicalize_name(name)) for name in tested} == tested, (
        f"requirements.lock pins other versions than {module} was tested with: check its patches against the "
        "locked versions, then update its TESTED_VERSIONS")


@pytest.mark.parametrize("module", CHECKED_ON_IMPORT)
def test_the_installed_versions_are_the_tested_ones(module):
    assert versions.untested_versions(importlib.import_module(module).TESTED_VERSIONS) == []


@pytest.mark.parametrize("module", CHECKED_ON_IMPORT)
def test_an_untested_library_stops_its_patch_from_being_imported_naming_the_version_found_and_the_one_expected(
        module, untested_metadata, monkeypatch, settings):
    patch = importlib.import_module(module)
    library = LIBRARY[module]
    monkeypatch.syspath_prepend(str(untested_metadata(library)))
    settings.ALLOW_UNTESTED_VERSIONS = False
    with pytest.raises(UntestedVersions) as refused:
        importlib.reload(patch)  # what importing it does in a fresh process (nothing is patched before the check)
    message = str(refused.value)
    assert f"untested versions: {library} {UNTESTED} (expected {patch.TESTED_VERSIONS[library]})." in message
    assert f"{module} reaches into their internals" in message
    assert "ALLOW_UNTESTED_VERSIONS=true" in message


def test_an_operator_who_allows_untested_versions_gets_a_warning_naming_them(untested_metadata, monkeypatch,
                                                                            settings, caplog):
    monkeypatch.syspath_prepend(str(untested_metadata("httpx")))
    settings.ALLOW_UNTESTED_VERSIONS = True
    with caplog.at_level(logging.WARNING, logger=versions.__name__):
        versions.require_tested({"httpx": "0.28.1"}, patcher="a patch", risk="anything")
    assert f"httpx {UNTESTED} (expected 0.28.1)" in caplog.text
    assert "as ALLOW_UNTESTED_VERSIONS allows" in caplog.text


def test_a_library_that_is_not_installed_is_named_as_such():
    with pytest.raises(UntestedVersions, match=r"no-such-library not installed \(expected 1\.0\)"):
        versions.require_tested({"no-such-library": "1.0"}, patcher="a patch", risk="anything")


@pytest.fixture
def web_nodes(request, django_db_setup):
    factory = ProcessFactory(request)
    yield factory
    factory.stop_all()


# Django's patches are imported as Django sets up; Channels' only with the consumers (config.asgi), so
# config.web imports every patch module before it starts daphne.
@pytest.mark.system
@pytest.mark.parametrize("library", ["Django", "channels"])
def test_a_web_node_refuses_to_start_on_an_untested_library(web_nodes, untested_metadata, library):
    port = free_port()
    path = f"{untested_metadata(library)}:{ROOT / 'platform'}:{ROOT}"
    result = subprocess.run([sys.executable, "-m", "config.web", "--port", str(port)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=web_nodes.env(PYTHONPATH=path, PORT=str(port)))
    assert result.returncode != 0
    assert f"web node not started: untested versions: {library} {UNTESTED} (expected " in result.stderr
    assert "ALLOW_UNTESTED_VERSIONS=true" in result.stderr
    assert "Traceback" not in result.stderr
