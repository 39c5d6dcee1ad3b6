"""The browser client's logic (clients/js/switchboard.js, the npm package switchboard-client), tested in Node.js
against a fake WebSocket: tests/messaging/gateway/js/switchboard.test.mjs. Here so `make test` runs it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

JS_TESTS = Path(__file__).parent / "js" / "switchboard.test.mjs"


def test_the_browser_client_logic_passes_its_node_tests():
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js (20 or later) is needed to test switchboard.js: apt-get install nodejs")
    result = subprocess.run([node, "--test", str(JS_TESTS)], capture_output=True, text=True, timeout=120,
                            cwd=JS_TESTS.parent)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-6000:]
    assert "# fail 0" in report and "# pass " in report
