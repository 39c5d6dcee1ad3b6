"""Both jobs under spark-submit on Spark's local-cluster master: a driver and two executor
processes, as on a real cluster, so nothing may depend on state local to the driver (the two run
in one application, tests/analytics/both_jobs.py, so the JVMs start once)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from analytics.jobs import datasets as ds
from analytics.services import lake_export, report_load
from tests.analytics.conftest import TEST_JVM_OPTIONS
from tests.analytics.test_backlog_report import deliveries_with_known_answers
from tests.analytics.test_presence_report import DAY, a_day_of_sessions
from tests.processes import ROOT

pytestmark = pytest.mark.django_db  # reads the module's committed scenario

MASTER = "local-cluster[2,1,1024]"


def spark_submit(lake: str, outs: dict[str, str]) -> None:
    """Both jobs, each with its own arguments, in one application on the local cluster
    (tests/analytics/both_jobs.py): one driver and two executors started once."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    window = ["--since", DAY.isoformat(), "--until", (DAY + timedelta(days=1)).isoformat()]
    argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER,
            "--properties-file", str(ROOT / "platform" / "spark-defaults.conf"),
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.executor.memory=512m",
            "--conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}",
            "--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}",
            str(ROOT / "tests" / "analytics" / "both_jobs.py"),
            "--lake", lake, *window, "--out", outs["presence"], "--", "--lake", lake, *window, "--out", outs["backlog"]]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert '"job": "presence"' in done.stdout and '"job": "backlog"' in done.stdout


@pytest.fixture(scope="module")
def reports(module_scenario):
    def build(activity, lake):
        a_day_of_sessions(activity)
        deliveries_with_known_answers(activity)
        lake_export()
        outs = {kind: lake.url(f"{ds.REPORTS}/{kind}/cluster") for kind in ("presence", "backlog")}
        spark_submit(lake.url(), outs)
        return {kind: report_load(kind=kind, since=DAY, until=DAY + timedelta(days=1), results=out)
                for kind, out in outs.items()}

    return module_scenario(build)


def test_both_jobs_give_the_same_answers_on_a_cluster_of_separate_executors(reports):
    presence, backlog = reports["presence"], reports["backlog"]

    peaks = {(r.app, r.subgroup): r.value for r in presence.rows.filter(metric=ds.PEAK_CONCURRENT)}
    assert peaks == {("ANZ", "domain-01"): 4, ("BNZ", "domain-02"): 1, ("CNZ", "domain-03"): 100, ("", ""): 101}
    lengths = {r.bucket: r.value for r in presence.rows.filter(metric=ds.SESSION_LENGTH, app="CNZ")}
    assert lengths == {"p50": 3000, "p90": 5400, "p99": 5940}
    assert presence.rows.filter(metric=ds.CONCURRENT).count() == 4 * 24 * 60

    latency = {r.bucket: r.value for r in backlog.rows.filter(metric=ds.LATENCY, app="ANZ", subgroup="direct")}
    assert latency == {"p50": 500, "p90": 900, "p99": 1000}
    dead = {r.bucket: r.value for r in backlog.rows.filter(metric=ds.DEAD_LETTERS, app="")}
    assert dead == {"timeout": 3, "node gone": 1}
    assert backlog.as_of is not None and presence.as_of is not None
