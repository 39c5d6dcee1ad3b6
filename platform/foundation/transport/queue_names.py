"""Names of the app queues' keys (the intake stream, and the request stream the app's server reads
requests from: messaging.requests) and ACL users, and their Redis client.

Every name derives from the app's name in one place here. ACL users are the server's, not a
database's: where Switchboard's Redis database is not 0 (`make network`'s domains, the test run's
database 15), the user's name carries the database number, so domains sharing one server never
share an app's user.
"""

from __future__ import annotations

import os
import re

import redis
from django.conf import settings

GROUP = "switchboard"  # the consumer group every worker reads with
REQUESTS_GROUP = "app"  # the consumer group an app's server reads its request stream with
CONSUMERS_KEY = "sbq:consumers"  # sorted set: consumer name -> when it last said it is alive (unix time)
_client: tuple[int, str, redis.Redis] | None = None


def intake_key(app_name: str) -> str:
    return f"sbq:{app_name}:in"


def requests_key(app_name: str) -> str:
    """The stream an app's server reads its clients' requests from (consumer group REQUESTS_GROUP)."""
    return f"sbq:{app_name}:requests"


def dead_key(app_name: str) -> str:
    return f"sbq:{app_name}:dead"


def stats_key(app_name: str) -> str:
    return f"sbq:{app_name}:stats"


def queue_redis_url() -> str:
    return settings.QUEUE_REDIS_URL or settings.REDIS_URL


def queue_db() -> int:
    return int(redis.connection.parse_url(queue_redis_url()).get("db") or 0)


def acl_user_prefix() -> str:
    db = queue_db()
    return f"sbq-{db}-" if db else "sbq-"


def acl_user(app_name: str) -> str:
    return f"{acl_user_prefix()}{app_name}"


# The app's second ACL user, with the same password: it may read the app's request stream (XREADGROUP,
# XACK) and nothing else. A second user because Redis 6 grants commands for every key a user may touch:
# one user that may XADD to the intake and XACK the request stream could also XACK its own intake.
# (':' is in no app name, so `sbq-ANZ:requests` is never another app's intake user.)
REQUESTS_USER_SUFFIX = ":requests"


def requests_acl_user(app_name: str) -> str:
    return f"{acl_user(app_name)}{REQUESTS_USER_SUFFIX}"


def app_name_of_acl_user(user: str) -> str | None:
    """The app an ACL user of this database's queues belongs to (its intake user or its request
    stream's), or None (another database's, or nobody's). App names start with a letter, so
    `sbq-15-ANZ` is never database 0's user of an app."""
    prefix = acl_user_prefix()
    if not user.startswith(prefix):
        return None
    rest = user[len(prefix):].removesuffix(REQUESTS_USER_SUFFIX)
    return rest if re.match(r"[A-Za-z][A-Za-z0-9_.]*\Z", rest) else None


def queue_client() -> redis.Redis:
    """The intake's Redis client for this process (one per process, as foundation's sync_client):
    the server's default or admin user, which may run ACL, MEMORY, XAUTOCLAIM and CLIENT KILL."""
    global _client
    url = queue_redis_url()
    if _client is None or _client[0] != os.getpid() or _client[1] != url:
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
        # XAUTOCLAIM … JUSTID as Redis answers it: redis-py's parser fails on an entry deleted while
        # pending. Entries themselves are never read through this client (redis-py holds a whole
        # reply, however large an entry is) but through intake.stream.reader.
        client.set_response_callback("XAUTOCLAIM", lambda answer, **_: answer)
        _client = (os.getpid(), url, client)
    return _client[2]
