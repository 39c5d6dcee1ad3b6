"""Fixtures of the messaging tests beyond tests/conftest.py's."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def node(inprocess):
    """A web node and a worker for tests of /ws behaviour: in this process (tests/inprocess.py), over
    the consumer loop daphne runs too. (tests/system/ has real processes for what needs daphne.)"""
    return inprocess
