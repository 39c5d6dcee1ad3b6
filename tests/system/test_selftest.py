"""`manage.py selftest` against a real platform (a web node, a routing worker, a webhook worker),
run as an operator would, from outside: it passes every check and leaves nothing behind, on a
throwaway app or on a named one; with a wrong key it exits non-zero naming the failing check (a
deployment without a routing worker: test_selftest_broken)."""

from __future__ import annotations

import re

import pytest

from apps_registry.models import ApiKey, ClientApp, SelftestRun
from messaging.models import Mailbox, Message
from tests.processes import free_port
from tests.system.selftest_support import CHECK_LABELS, SELFTEST_ENV, lines, operator_key_fixture, selftest  # noqa: F401

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def platform(module_processes, operator_key):
    web = module_processes.web("web", **SELFTEST_ENV)
    module_processes.worker("worker", **SELFTEST_ENV)
    module_processes.webhook_worker("hooks", **SELFTEST_ENV)
    return web


@pytest.mark.django_db
def test_a_healthy_platform_passes_every_check_and_the_run_leaves_nothing_behind(platform, module_processes,
                                                                                operator_key):
    result = selftest(module_processes.env, platform.url, "--webhook-listen", f"127.0.0.1:{free_port()}",
                      key=operator_key)

    assert result.returncode == 0, result.stdout + result.stderr
    printed = lines(result)
    assert list(printed) == CHECK_LABELS, result.stdout
    for label, line in printed.items():
        assert re.match(rf"ok    {re.escape(label)} +\d+ ms", line), line
    assert "signed" in printed["webhook signature"]
    assert result.stdout.splitlines()[-1] == f"passed: {len(CHECK_LABELS)} checks, {len(CHECK_LABELS)} ok, 0 failed, " \
                                             "0 skipped"
    assert not ClientApp.objects.filter(app_name__startswith="selftest_").exists()
    assert not SelftestRun.objects.exists()


@pytest.mark.django_db
def test_on_a_named_app_without_a_master_presence_is_skipped_and_the_app_is_left_as_it_was(platform, module_processes,
                                                                                         operator_key):
    keys_before = ApiKey.objects.filter(app__app_name="NOM").count()
    result = selftest(module_processes.env, platform.url, "--app", "NOM", key=operator_key)

    assert result.returncode == 0, result.stdout + result.stderr
    printed = lines(result)
    assert printed["presence to master"].startswith("skip ") and "app has no master" in printed["presence to master"]
    assert printed["webhook signature"].startswith("skip ")
    assert printed["channel over /ws"].startswith("ok    ")  # NOM keeps client subscriptions off: its server's
    assert printed["channel over /ws"].endswith("server subscription")  # durable subscription is read instead
    for label in ("reliable+confirmation", "fetch after offline", "ack redelivery", "rest send+status"):
        assert printed[label].startswith("ok    "), printed[label]
    assert ClientApp.objects.filter(app_name="NOM").exists()
    assert ApiKey.objects.filter(app__app_name="NOM").count() == keys_before
    assert not Message.objects.filter(app__app_name="NOM").exists()
    assert not Mailbox.objects.filter(app__app_name="NOM").exists()


@pytest.mark.django_db
def test_a_wrong_key_fails_the_first_check_and_exits_non_zero(platform, module_processes, operator_key):
    result = selftest(module_processes.env, platform.url, key=operator_key[:-3] + "xyz")

    assert result.returncode == 1
    assert lines(result)["start run"].startswith("FAIL  start run")
    assert "401 invalid_operator_key" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("FAILED: 1 checks, 0 ok, 1 failed")
