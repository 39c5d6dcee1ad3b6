"""The test session's Postgres and Redis (`-p devstack.pytest_services`, in pyproject's addopts).

Django reads its settings while pytest loads the first conftests (pytest-django), and settings
never start a process; so before that, this starts (or reuses) the embedded services for every URL
the environment lacks and hands the URLs over in DATABASE_URL / REDIS_URL, where the settings and
every process a test starts (web nodes, workers) find them.

Under pytest-xdist (`-n N`), the workers share the Postgres server (pytest-django gives each its own
test database, `test_switchboard_gw0`, ...), and each worker gets a Redis server of its own
(embedded, under var/test-workers/<worker>/, stopped when the worker ends): the suite's fixed
database numbers (its own, the test ring's), its `flushdb`s and the Celery queues its processes
serve then never meet another worker's.
"""

from __future__ import annotations

import os

import pytest

from devstack.embedded import ensure_running, stop, urls_hand_over, var_dir


def worker_root() -> os.PathLike | None:
    """This xdist worker's folder for its own services (None outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return var_dir() / "test-workers" / worker if worker else None


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Which test process a connection is, in pg_stat_activity (a worker replaces what it inherited).
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker or "DB_APPLICATION_NAME" not in os.environ:
        os.environ["DB_APPLICATION_NAME"] = f"pytest-{worker or 'main'}"
    urls_hand_over(os.environ)
    root = worker_root()
    if root is not None:
        os.environ["REDIS_URL"] = ensure_running(postgres=False, redis=True, root=root).redis_url
    return (yield)


def pytest_unconfigure(config):
    root = worker_root()
    if root is not None:
        stop(root=root)
