"""`manage.py selftest` against a broken deployment: a web node with no routing worker anywhere,
so RELIABLE messages are stored and never routed. The run exits non-zero, naming the checks that
failed, and still cleans up after itself."""

from __future__ import annotations

import pytest

from apps_registry.models import ClientApp, SelftestRun
from tests.system.selftest_support import SELFTEST_ENV, lines, operator_key_fixture, selftest  # noqa: F401

pytestmark = pytest.mark.system


@pytest.mark.django_db
def test_without_a_routing_worker_reliable_messages_never_arrive_and_the_run_fails_naming_them(processes,
                                                                                              operator_key):
    web = processes.web("lonely", **SELFTEST_ENV)  # no worker: nothing routes a stored message
    result = selftest(processes.env, web.url, "--timeout", "2", key=operator_key)

    assert result.returncode == 1, result.stdout
    printed = lines(result)
    assert printed["reliable+confirmation"].startswith("FAIL  reliable+confirmation")
    assert "timed out after 2 s" in printed["reliable+confirmation"]
    assert printed["fast"].startswith("ok    ")  # FAST goes straight to the live connections
    assert printed["cleanup"].startswith("ok    ")
    assert "FAILED:" in result.stdout.splitlines()[-1]
    assert not ClientApp.objects.filter(app_name__startswith="selftest_").exists()
    assert not SelftestRun.objects.exists()
