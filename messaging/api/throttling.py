"""Per-app rate limit of the server API: one token bucket per app in Redis, so every web node draws
on the same budget. Taking a token is one Lua script (atomic: two nodes cannot both take the last
token), timed by Redis's own clock (the nodes' clocks need not agree). The limits are the app's
`api_rate_limit_per_second` and `api_rate_limit_burst`; beyond them a request is answered 429 with
`Retry-After` (whole seconds, at least 1).

If Redis cannot be asked, requests pass: the limit protects the platform, and a send needs the
database (and, to be routed, the broker) anyway.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from foundation.transport.redis_clients import sync_client

log = logging.getLogger(__name__)
KEY = "sb:api:rate:{app_pk}"

# KEYS: the bucket. ARGV: rate per second, burst, cost. -> seconds to wait (as text; 0 = taken).
_TAKE = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens, stamp = tonumber(state[1]), tonumber(state[2])
if tokens == nil or stamp == nil then tokens, stamp = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = (cost - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""
_script = None


def rate_limit_take(*, app_pk: int, rate: float, burst: int, cost: int = 1) -> float:
    """Take `cost` tokens of the app's bucket: 0.0 when taken, else the seconds until they are there."""
    global _script
    client = sync_client()
    if _script is None or _script.registered_client is not client:
        _script = client.register_script(_TAKE)
    return float(_script(keys=[KEY.format(app_pk=app_pk)], args=[rate, burst, cost]))


class AppRateThrottle(BaseThrottle):
    """DRF's throttle step (it runs after authentication): draws one token per request."""

    def allow_request(self, request: Request, view: object) -> bool:
        app = getattr(request.user, "app", None)
        if app is None:
            return True  # refused by authentication anyway
        try:
            self._wait = rate_limit_take(app_pk=app.pk, rate=app.api_rate_limit_per_second,
                                         burst=app.api_rate_limit_burst)
        except RedisError:
            log.warning("API rate limit not applied: Redis unavailable", exc_info=True)
            return True
        return self._wait == 0.0

    def wait(self) -> float:
        return self._wait
