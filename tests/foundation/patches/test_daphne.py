"""daphne's patches run only on the daphne, Twisted and autobahn they were tested with, unless an
operator explicitly allows others."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from foundation.patches import daphne as daphne_patches
from foundation.patches import versions
from foundation.patches.daphne import TESTED_VERSIONS
from foundation.patches.versions import UntestedVersions
from tests.processes import ROOT, ProcessFactory, free_port, wait_http

UNTESTED = "4.0.0"
REPORTED = f"daphne {UNTESTED} (expected {TESTED_VERSIONS['daphne']})"


@pytest.fixture
def untested_daphne(tmp_path) -> Path:
    """A folder that, first on the path, makes importlib.metadata report daphne 4.0.0, while the
    daphne package imported is still the real one."""
    metadata = tmp_path / "metadata"
    dist_info = metadata / f"daphne-{UNTESTED}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: daphne\nVersion: {UNTESTED}\n")
    return metadata


@pytest.fixture
def web_nodes(request, django_db_setup):
    """Web nodes of this test, on the test database; stopped at its end."""
    factory = ProcessFactory(request)
    yield factory
    factory.stop_all()


def web_node(port: int) -> list[str]:
    return [sys.executable, "-m", "config.web", "--port", str(port)]


def path_with(metadata: Path) -> str:
    return os.pathsep.join([str(metadata), str(ROOT / "platform"), str(ROOT)])


def test_the_tested_versions_are_the_ones_the_lock_pins():
    lock = (ROOT / "requirements.lock").read_text()
    locked = {canonicalize_name(name): version for name, version in re.findall(r"^(\S+)==(\S+)", lock, re.MULTILINE)}
    assert {name: locked.get(canonicalize_name(name)) for name in TESTED_VERSIONS} == TESTED_VERSIONS, (
        "requirements.lock pins other versions than foundation.patches.daphne was tested with: check its patches "
        "against the locked versions, then update TESTED_VERSIONS")


def test_the_installed_versions_are_the_tested_ones():
    assert versions.untested_versions(TESTED_VERSIONS) == []


def test_an_untested_daphne_is_refused_naming_the_version_found_and_the_one_expected(untested_daphne, monkeypatch,
                                                                                   settings):
    monkeypatch.syspath_prepend(str(untested_daphne))
    settings.DAPHNE_ALLOW_UNTESTED_VERSIONS = False
    with pytest.raises(UntestedVersions) as refused:
        daphne_patches.check_versions.__wrapped__()  # uncached: this process already passed the check
    assert REPORTED in str(refused.value)
    assert "DAPHNE_ALLOW_UNTESTED_VERSIONS=true" in str(refused.value)
    assert "Twisted 26" not in str(refused.value)  # only the package that differs is named


def test_an_operator_who_allows_untested_versions_gets_a_warning_naming_them(untested_daphne, monkeypatch, settings,
                                                                            caplog):
    monkeypatch.syspath_prepend(str(untested_daphne))
    settings.DAPHNE_ALLOW_UNTESTED_VERSIONS = True
    with caplog.at_level(logging.WARNING, logger=versions.__name__):
        daphne_patches.check_versions.__wrapped__()
    assert REPORTED in caplog.text


@pytest.mark.system
def test_a_web_node_refuses_to_start_on_an_untested_daphne(web_nodes, untested_daphne):
    port = free_port()
    result = subprocess.run(web_node(port), cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env=web_nodes.env(PYTHONPATH=path_with(untested_daphne), PORT=str(port)))
    assert result.returncode != 0
    assert REPORTED in result.stderr
    assert "DAPHNE_ALLOW_UNTESTED_VERSIONS=true" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.system
def test_a_web_node_on_an_untested_daphne_serves_when_the_operator_allows_it(web_nodes, untested_daphne):
    port = free_port()
    node = web_nodes.spawn("web", web_node(port), port=port, PORT=str(port), NODE_ID=f"untested-{port}",
                           PYTHONPATH=path_with(untested_daphne), DAPHNE_ALLOW_UNTESTED_VERSIONS="true")
    wait_http(f"{node.url}/healthz", node)
    assert REPORTED in node.output()
    node.kill(signal.SIGTERM)
    assert not node.alive()


def test_a_frame_sent_as_its_client_goes_away_is_dropped_instead_of_crashing_the_consumer():
    from daphne.ws_protocol import WebSocketProtocol

    daphne_patches.install()
    protocol = WebSocketProtocol()
    protocol.client_addr = ["127.0.0.1", 50000]
    protocol.state = WebSocketProtocol.STATE_CLOSED  # the client closed while the frame was being made
    assert protocol.serverSend("a frame nobody will read", False) is None
