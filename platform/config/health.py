"""Liveness and readiness: /healthz says the process serves, /readyz that its services answer, that
it is not draining (foundation.draining: told to stop, it answers 503 from the first moment), and,
as it starts, that it would admit the users it serves: "network" while it is cut off from the
network and refuses the logins of users with a standby (messaging.federation.takeover.fence, the
very check AUTH_CLIENT makes, from the same per-process cache), as a domain is from its start until
the first gossip reaches it (for at most the fence's window: `fence.starting_fenced` says why not
longer).

/readyz is public (load balancers and orchestrators ask it without credentials), so a failure names
only the part that fails ("database", "redis"); the error itself, which may carry host names, ports,
user names or file paths, goes to the log.

Both answer without costing the node a thread or a connection per check: a load balancer asks every
second, and a check that timed out on a busy node took that node out of rotation (HAProxy's
`fall 1`). On a web node (ASGI) /healthz and a draining /readyz answer on the event loop; the checks
of the database and Redis run on one thread of their own (`_checks`) that keeps its connection and
its Redis client, neither queued behind the node's database pool nor opening a Postgres backend per
check, as a sync view did (a new thread per request, so a new connection: with a slowed machine's
Postgres, over HAProxy's 2 s, on all three nodes of a rolling restart at once). Under WSGI (the test
client) the checks run on the request's own thread.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest, JsonResponse

from foundation.draining import draining
from foundation.patches.django import response_logged
from messaging.federation.takeover.fence import starting_fenced

log = logging.getLogger(__name__)

DRAINING = "draining"
DATABASE = "database"
REDIS = "redis"
NETWORK = "network"

_checks = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readyz")  # its connection kept: one check at a time
# By URL: a client (and its connection) kept per Redis. Not foundation.transport.redis_clients.sync_client:
# its 5 s timeouts and retries would outlast HAProxy's 2 s check, and it does not follow REDIS_URL.
_redis_clients: dict[str, redis.Redis] = {}


def checks_connection_close() -> None:
    """Close the checks thread's database connection (the test database can only be dropped then)."""
    _checks.submit(lambda: connection.close()).result()  # (its own: `connection` is per thread)


async def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok", "node": settings.NODE_ID})


def _database_answers() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("select 1")
        return True
    except Exception:  # any failure means "not ready"
        log.warning("readiness: the database does not answer", exc_info=True)
        connection.close_if_unusable_or_obsolete()
        return False


def _redis_answers() -> bool:
    url = settings.REDIS_URL
    client = _redis_clients.get(url)
    if client is None:
        client = _redis_clients[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()  # (a connection the ping found broken is dropped by redis-py, and made anew next time)
        return True
    except redis.RedisError as exc:
        log.warning("readiness: redis does not answer: %r", exc)
        return False


def _failing() -> list[str]:
    """The parts that do not answer; NETWORK when both do but the domain refuses its users' logins."""
    failing = [name for name, answers in ((DATABASE, _database_answers), (REDIS, _redis_answers)) if not answers()]
    if not failing and starting_fenced():  # (read from the database: only once it answers)
        failing = [NETWORK]
    return failing


async def readyz(request: HttpRequest) -> JsonResponse:
    if draining():  # SIGTERM: a load balancer must stop sending new connections here at once
        response = JsonResponse({"status": "draining", "failing": [DRAINING], "node": settings.NODE_ID}, status=503)
        response_logged(response)  # expected while draining: not Django's "Service Unavailable" error line
        return response
    if isinstance(request, ASGIRequest):
        failing = await asyncio.get_running_loop().run_in_executor(_checks, _failing)
    else:
        failing = await sync_to_async(_failing, thread_sensitive=True)()
    if failing:
        return JsonResponse({"status": "unavailable", "failing": failing}, status=503)
    return JsonResponse({"status": "ready", "node": settings.NODE_ID, "domain": settings.DOMAIN_NAME})
