"""What the selftest's system tests share: running `manage.py selftest` as an operator would (a
separate process, the key in its environment), reading its lines, and an operator key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from apps_registry.models import ClientApp, OperatorKey, UserDistribution
from apps_registry.selectors import app_snapshots_clear
from apps_registry.services import operator_key_create
from tests.processes import ROOT

SELFTEST_ENV = {"WEBHOOKS_ALLOW_HTTP": "true", "WEBHOOK_SWEEP_SECONDS": "1"}
CHECK_LABELS = ["start run", "authenticate", "reliable+confirmation", "fast", "group", "fetch after offline",
                "ack redelivery", "rest send+status", "channel over /ws", "channel over sse", "presence to master",
                "webhook signature", "cleanup"]


@pytest.fixture(scope="module", name="operator_key")
def operator_key_fixture(demo_network, django_db_blocker):
    """An operator key, and NOM: an app with no master user (committed; removed at the end)."""
    with django_db_blocker.unblock():
        key, raw = operator_key_create(name="ci")
        nom = ClientApp.objects.create(app_name="NOM", app_id="app-id-nom", master_user_id="", auth_mode="none")
        UserDistribution.objects.create(app=nom, domain_id=demo_network["anz"].distributions.first().domain_id,
                                        range_from=0, range_to=None)
        app_snapshots_clear()
    yield raw
    with django_db_blocker.unblock():
        OperatorKey.objects.filter(pk=key.pk).delete()


def selftest(processes_env, url: str, *args: str, key: str | None = None) -> subprocess.CompletedProcess:
    env = processes_env()
    if key is not None:
        env["SWITCHBOARD_OPERATOR_KEY"] = key
    return subprocess.run([sys.executable, "manage.py", "selftest", url, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    """Each check's line, by its label."""
    found = {}
    for line in result.stdout.splitlines():
        for label in CHECK_LABELS:
            if line[6:].startswith(label + " "):
                found[label] = line
    return found


