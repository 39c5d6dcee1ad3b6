"""The Python client of the server API: importable anywhere, errors as exceptions, retries that are safe."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from switchboard_client import ApiError

from apps_registry.selectors import app_snapshots_clear
from messaging.models import Message

ROOT = Path(__file__).resolve().parents[3]


def test_the_client_imports_nothing_of_the_server():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    server = "('django', 'foundation', 'messaging', 'apps_registry', 'presence', 'config')"
    result = subprocess.run(
        [sys.executable, "-c", "import sys, switchboard_client as c; "
                               f"assert not any(m.split('.')[0] in {server} for m in sys.modules), 'server imported'; "
                               "print(c.SwitchboardClient.__name__)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SwitchboardClient"


@pytest.mark.django_db
def test_an_error_is_raised_with_the_apis_code_and_detail(api):
    with pytest.raises(ApiError) as refused:
        api.send("ANZ-1", "x", sender="nobody")
    assert (refused.value.status, refused.value.code) == (404, "unknown_user")
    assert refused.value.detail == "sender 'nobody' is not a user of app ANZ"


@pytest.mark.django_db
def test_a_rate_limited_send_is_retried_after_retry_after_and_stored_once(api, anz):
    anz.api_rate_limit_per_second = 1
    anz.api_rate_limit_burst = 1
    anz.save()
    app_snapshots_clear()
    api.retries = 2
    started = time.monotonic()
    api.send("ANZ-1", "first")
    api.send("ANZ-1", "second")  # 429 first, then sent after Retry-After
    assert time.monotonic() - started >= 0.9
    assert Message.objects.count() == 2
