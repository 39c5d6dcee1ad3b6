"""Fixtures of the system tests beyond tests/conftest.py's."""

from __future__ import annotations

from tests.ring import ring  # noqa: F401  (the four-domain ring of make network, module-scoped)
