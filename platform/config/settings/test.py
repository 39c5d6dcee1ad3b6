"""Test runs: the same real services as local (embedded unless the URLs are set)."""

from __future__ import annotations

from .local import *  # noqa: F403

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; never outside tests
