"""Per-app rate limit of the server API: one token bucket per app in Redis, so every web node draws
on the same budget. Taking a token is one Lua script (atomic: two nodes cannot both take the last
token), timed by Redis's own clock (the nodes' clocks need not agree). The limits are the app's
`api_rate_limit_per_second` and `api_rate_limit_burst`; beyond them a request is answered 429 with
`Retry-After` (whole seconds, at least 1). The queue intake's consumers draw on the same bucket,
a token per entry of the app's stream (messaging.intake.stream.consume): an entry without one waits
in the stream.

If Redis cannot be asked, requests pass: the limit protects the platform, and a send needs the
database (and, to be routed, the broker) anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from redis.exceptions import RedisError
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from foundation.transport.redis_clients import async_client, sync_client

log = logging.getLogger(__name__)
KEY = "sb:api:rate:{app_pk}"

# KEYS: the bucket. ARGV: rate per second, burst, requests. -> how many of them got a token, and
# (as text) the seconds until the next token when not all did.
_TAKE_MANY = """
local rate, burst, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens, stamp = tonumber(state[1]), tonumber(state[2])
if tokens == nil or stamp == nil then tokens, stamp = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local granted = math.min(wanted, math.floor(tokens))
tokens = tokens - granted
local wait = 0
if granted < wanted then wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {granted, tostring(wait)}
"""
_script = None  # the sync client's
_many_scripts: dict[int, object] = {}  # per async client (one per event loop)


def rate_limit_take(*, app_pk: int, rate: float, burst: int) -> float:
    """Take a token of the app's bucket: 0.0 when taken, else the seconds until there is one."""
    granted, wait = rate_limit_take_up_to(app_pk=app_pk, rate=rate, burst=burst, wanted=1)
    return 0.0 if granted else wait


def rate_limit_take_up_to(*, app_pk: int, rate: float, burst: int, wanted: int) -> tuple[int, float]:
    """Take up to `wanted` tokens of the app's bucket (a worker's batch of queued sends,
    messaging.intake.stream.consume): how many it got, and when it got fewer, the seconds until the
    next one."""
    global _script
    client = sync_client()
    if _script is None or _script.registered_client is not client:
        _script = client.register_script(_TAKE_MANY)
    granted, wait = _script(keys=[KEY.format(app_pk=app_pk)], args=[rate, burst, wanted])
    return int(granted), float(wait)


@dataclass(frozen=True)
class Bucket:
    app_pk: int
    rate: float
    burst: int


async def rate_limit_take_many(buckets: list[Bucket]) -> list[float]:
    """One token for each request of `buckets` (a request per item, several per app), taken with
    one script call per app in one pipeline: the LoopBatcher flush of the REST send on the event
    loop (messaging.api.send_endpoint). Per request, in order: 0.0 when it got its token, else the
    seconds until there is one. Requests of one app are served in their order: the first ones get
    the tokens there are."""
    client = async_client()
    script = _many_scripts.get(id(client))
    if script is None or script.registered_client is not client:
        script = _many_scripts[id(client)] = client.register_script(_TAKE_MANY)
    wanted: dict[int, list[int]] = {}
    for index, bucket in enumerate(buckets):
        wanted.setdefault(bucket.app_pk, []).append(index)
    pipe = client.pipeline(transaction=False)
    for app_pk, indexes in wanted.items():
        bucket = buckets[indexes[0]]
        await script(keys=[KEY.format(app_pk=app_pk)], args=[bucket.rate, bucket.burst, len(indexes)], client=pipe)
    answers = await pipe.execute()
    waits = [0.0] * len(buckets)
    for (granted, wait), indexes in zip(answers, wanted.values(), strict=True):
        for index in indexes[int(granted):]:
            waits[index] = float(wait)
    return waits


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
