"""Test runs: the same real services as local (embedded unless the URLs are set).

Tests use their own Redis database (index 15 by default) so a test run never mixes its channel
layer, presence cache or Celery queue with a platform running from the same checkout, and can
wipe it freely.
"""

from __future__ import annotations

from urllib.parse import urlparse, urlunparse

from .local import *  # noqa: F403
from .local import REDIS_URL, env_int, env_str, service_settings

TEST_REDIS_DB = env_int("TEST_REDIS_DB", 15)
# Two runs side by side (say, two checkouts on one machine) each name a database and a Redis
# database of their own: TEST_DATABASE_NAME, TEST_REDIS_DB.
TEST_DATABASE_NAME = env_str("TEST_DATABASE_NAME", "")


def _with_db(url: str, db: int) -> str:
    parsed = urlparse(url)
    return urlunparse(parsed._replace(path=f"/{db}"))


globals().update(service_settings(DATABASE_URL, _with_db(REDIS_URL, TEST_REDIS_DB)))  # noqa: F405

DEBUG = False
# Work handed to the workers is recorded and run in the test process when a test pumps it (the
# `handoff` fixture); a test that starts real workers hands over to them instead (tests/processes.py).
HANDOFF_DISPATCHER = "foundation.handoff.InlineDispatcher"
# The test process runs consumers in-process (their runtime starts with the first): it keeps its heap
# collectable, as a test suite that creates and drops thousands of objects must. The web nodes the
# tests start (config.settings.local) freeze theirs as in production.
WEB_HEAP_FREEZE = False
WEBHOOKS_ALLOW_HTTP = True  # the tests' webhook receivers are plain-HTTP servers on 127.0.0.1
OUTGOING_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]  # ... and auth services: loopback only, explicitly
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; never outside tests
# Live-server and system-test threads must not keep connections that block dropping the test DB.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
if TEST_DATABASE_NAME:
    DATABASES["default"]["TEST"] = {"NAME": TEST_DATABASE_NAME}  # noqa: F405
