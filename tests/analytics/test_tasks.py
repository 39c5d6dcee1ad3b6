"""The on-demand export through a real Celery worker, as the admin's button runs it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from analytics.jobs import datasets as ds
from analytics.models import JobRun
from analytics.services import job_request
from analytics.services.lake import Lake
from tests.analytics.conftest import exported, messages_bulk

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_a_requested_export_is_run_by_a_worker_and_its_run_shows_succeeded(processes, demo_network, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    processes.worker("worker", ANALYTICS_LAKE=lake.uri)
    messages_bulk(demo_network["anz"], 500, datetime(2026, 11, 20, tzinfo=UTC))

    run = job_request(kind="export", requested_by="operator")

    deadline = time.monotonic() + 60
    while not run.is_finished and time.monotonic() < deadline:
        time.sleep(0.2)
        run.refresh_from_db()
    assert run.state == "succeeded", run.error
    assert run.rows["messages"] == 500
    assert len(exported(lake, ds.MESSAGES)) == 500
    assert JobRun.objects.filter(kind="export").count() == 1
