"""`manage.py selftest` against a broken deployment: a web node with no routing worker anywhere,
so RELIABLE messages are stored and never routed. The run exits non-zero, naming the checks that
failed, and still cleans up after itself, as it does when interrupted with Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from apps_registry.models import ClientApp, SelftestRun
from tests.processes import ROOT
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


def _as_from_a_terminal() -> None:
    """Ctrl-C as a shell's child gets it: SIGINT neither ignored nor blocked, whatever the test process
    that starts it inherited or was left with by an earlier test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


@pytest.mark.django_db
def test_ctrl_c_in_the_middle_of_a_check_still_cleans_up(processes, operator_key):
    web = processes.web("lonely", **SELFTEST_ENV)  # a RELIABLE message waits out the long timeout
    env = processes.env(SWITCHBOARD_OPERATOR_KEY=operator_key)
    proc = subprocess.Popen([sys.executable, "manage.py", "selftest", web.url, "--timeout", "60"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("ok    authenticate"):
            break
    time.sleep(0.5)  # inside reliable+confirmation's wait
    proc.send_signal(signal.SIGINT)
    try:
        rest, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR2)  # its threads' stacks, to its stderr (manage.py)
        time.sleep(0.5)
        proc.kill()
        pytest.fail(f"selftest still running 30 s after Ctrl-C; its threads:\n{proc.communicate()[1][-8000:]}")

    assert proc.returncode == 130, "".join(seen) + rest + err
    assert re.search(r"^ok    cleanup +\d+ ms  selftest_\w+ removed$", rest, re.MULTILINE), rest
    assert "interrupted" in err
    assert not ClientApp.objects.filter(app_name__startswith="selftest_").exists()
