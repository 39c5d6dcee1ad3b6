"""Test runs: the same real services as local (embedded unless the URLs are set)."""

from __future__ import annotations

from .local import *  # noqa: F403

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; never outside tests
# Live-server and system-test threads must not keep connections that block dropping the test DB.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
