"""Fixtures of the queue intake's tests: the intake's Redis as Switchboard sees it (the admin
user), an app's credential made through the service, and a writer logged in with it, as the app's
backend would be. ACL users are the Redis server's: each test removes the ones it made."""

from __future__ import annotations

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from foundation.transport.queue_names import acl_user, acl_user_prefix, queue_client, queue_redis_url
from messaging.intake.stream.credentials import queue_credential_create


def writer_for(app_name: str, password: str) -> redis.Redis:
    """A client logged in as the app's ACL user, on Switchboard's database (redis-py SELECTs it)."""
    parsed = redis.connection.parse_url(queue_redis_url())
    # No retries: a refused login (AuthenticationError, a ConnectionError) is what the tests look for.
    return redis.Redis(host=parsed["host"], port=parsed["port"], db=parsed.get("db", 0), username=acl_user(app_name),
                       password=password, socket_timeout=5, retry=Retry(NoBackoff(), 0))


@pytest.fixture
def queue_redis():
    client = queue_client()
    yield client
    for user in client.execute_command("ACL", "USERS"):
        if user.decode().startswith(acl_user_prefix()):
            client.execute_command("ACL", "DELUSER", user)
    for key in client.scan_iter(match="sbq:*"):
        client.delete(key)


@pytest.fixture
def credential(queue_redis, django_capture_on_commit_callbacks):
    """credential(app) -> the password of a new credential of `app`, applied to Redis."""

    def make(app) -> str:
        with django_capture_on_commit_callbacks(execute=True):
            return queue_credential_create(app=app)[1]

    return make
