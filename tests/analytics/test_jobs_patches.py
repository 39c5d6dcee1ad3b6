"""The jobs reach into PySpark's internals only on the PySpark they were tested with: importing them on
another stops, naming the version found and the one expected, unless ALLOW_UNTESTED_VERSIONS is on."""

from __future__ import annotations

import importlib
import logging
import re

import pytest
from packaging.utils import canonicalize_name

from analytics.jobs import patches
from tests.foundation.patches import UNTESTED, untested_distribution
from tests.processes import ROOT

REPORTED = f"untested versions: pyspark {UNTESTED} (expected {patches.TESTED_VERSIONS['pyspark']})."


@pytest.fixture
def untested_pyspark(tmp_path, monkeypatch):
    """importlib.metadata reports pyspark 0.0.1, while the pyspark imported is still the real one."""
    monkeypatch.syspath_prepend(str(untested_distribution(tmp_path, "pyspark")))
    yield
    monkeypatch.undo()
    importlib.reload(patches)  # as it was


def test_the_tested_versions_are_the_ones_the_lock_pins():
    lock = (ROOT / "requirements.lock").read_text()
    locked = {canonicalize_name(name): version for name, version in re.findall(r"^(\S+)==(\S+)", lock, re.MULTILINE)}
    assert {name: locked.get(name) for name in patches.TESTED_VERSIONS} == patches.TESTED_VERSIONS, (
        "requirements.lock pins another PySpark than analytics.jobs.patches was tested with: check its patches "
        "against the locked version, then update TESTED_VERSIONS")


def test_the_installed_versions_are_the_tested_ones():
    assert patches.untested_versions() == []


def test_an_untested_pyspark_stops_the_jobs_from_being_imported(untested_pyspark, monkeypatch):
    monkeypatch.delenv("ALLOW_UNTESTED_VERSIONS", raising=False)
    with pytest.raises(RuntimeError) as refused:
        importlib.reload(patches)  # what importing it does on a driver (nothing is reached into before the check)
    assert REPORTED in str(refused.value)
    assert "analytics.jobs.patches reaches into their internals" in str(refused.value)
    assert "ALLOW_UNTESTED_VERSIONS=true" in str(refused.value)


def test_an_operator_who_allows_an_untested_pyspark_gets_a_warning_naming_it(untested_pyspark, monkeypatch, caplog):
    monkeypatch.setenv("ALLOW_UNTESTED_VERSIONS", "true")
    with caplog.at_level(logging.WARNING, logger=patches.__name__):
        importlib.reload(patches)
    assert f"pyspark {UNTESTED} (expected {patches.TESTED_VERSIONS['pyspark']})" in caplog.text
