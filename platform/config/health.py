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
"""

from __future__ import annotations

import logging

import redis
from django.conf import settings
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


def healthz(request: HttpRequest) -> JsonResponse:
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
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        client.close()
        return True
    except redis.RedisError as exc:
        log.warning("readiness: redis does not answer: %r", exc)
        return False


def readyz(request: HttpRequest) -> JsonResponse:
    if draining():  # SIGTERM: a load balancer must stop sending new connections here at once
        response = JsonResponse({"status": "draining", "failing": [DRAINING], "node": settings.NODE_ID}, status=503)
        response_logged(response)  # expected while draining: not Django's "Service Unavailable" error line
        return response
    failing = [name for name, answers in ((DATABASE, _database_answers), (REDIS, _redis_answers)) if not answers()]
    if not failing and starting_fenced():  # (read from the database: only once it answers)
        failing = [NETWORK]
    if failing:
        return JsonResponse({"status": "unavailable", "failing": failing}, status=503)
    return JsonResponse({"status": "ready", "node": settings.NODE_ID, "domain": settings.DOMAIN_NAME})
