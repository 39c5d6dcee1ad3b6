"""The test session's Postgres and Redis (`-p devstack.pytest_services`, in pyproject's addopts).

Django reads its settings while pytest loads the first conftests (pytest-django), and settings
never start a process; so before that, this starts (or reuses) the embedded services for every URL
the environment lacks and hands the URLs over in DATABASE_URL / REDIS_URL, where the settings and
every process a test starts (web nodes, workers) find them.
"""

from __future__ import annotations

import os

import pytest

from devstack.embedded import urls_hand_over


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    urls_hand_over(os.environ)
    return (yield)
