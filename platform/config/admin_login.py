"""The admin login, throttled: a password cannot be guessed at network speed, and nobody can lock an
admin out from elsewhere.

Failures are counted per (username, client address) and per client address (any username); the
address is the one foundation.forwarded found (the rightmost untrusted X-Forwarded-For hop). After
ADMIN_LOGIN_FREE_FAILURES failures for a pair (ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS for an address),
each further failure makes it wait before the next attempt: ADMIN_LOGIN_BACKOFF_SECONDS, doubling
with each failure, at most ADMIN_LOGIN_BACKOFF_MAX_SECONDS. An attempt during the wait gets 429 with
Retry-After and its password is not checked. An attacker failing for `admin` from one address
therefore never stops the real admin logging in from another. Counts live in the Redis-backed cache
(every web node sees them; `incr` is atomic there) and are forgotten ADMIN_LOGIN_WINDOW_SECONDS after
the last failure; a successful login clears its pair.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.contrib import admin
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from foundation.backoff import Backoff


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Counter:
    key: str
    free_failures: int

    @property
    def wait_key(self) -> str:
        return self.key + ":until"


def _counters(request: HttpRequest) -> tuple[Counter, Counter]:
    """(username from this address, this address); hashed, as cache keys must be short and safe
    whatever a client types."""
    username = (request.POST.get("username") or "").strip().lower()
    address = request.META.get("REMOTE_ADDR", "")
    pair = hashlib.sha256(f"{username}\n{address}".encode(errors="replace")).hexdigest()[:32]
    by_address = hashlib.sha256(address.encode(errors="replace")).hexdigest()[:32]
    return (Counter("sb:login:ua:" + pair, settings.ADMIN_LOGIN_FREE_FAILURES),
            Counter("sb:login:a:" + by_address, settings.ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS))


def login_backoff_seconds(failures: int, free_failures: int) -> float:
    """How long to wait after the `failures`-th failure: nothing for the free ones, then doubling
    (foundation.backoff's Backoff, without jitter: Retry-After says exactly when)."""
    over = failures - free_failures
    if over <= 0:
        return 0.0
    return Backoff(settings.ADMIN_LOGIN_BACKOFF_SECONDS, settings.ADMIN_LOGIN_BACKOFF_MAX_SECONDS, jitter=0).seconds(over)


def _seconds_to_wait(counters: tuple[Counter, ...]) -> float:
    until = cache.get_many([c.wait_key for c in counters]).values()
    return max([0.0, *(float(u) - _now() for u in until)])


def _record_failure(counters: tuple[Counter, ...]) -> None:
    window = settings.ADMIN_LOGIN_WINDOW_SECONDS
    for counter in counters:
        if cache.add(counter.key, 1, timeout=window):
            failures = 1
        else:
            try:
                failures = cache.incr(counter.key)
                cache.touch(counter.key, window)
            except ValueError:  # expired between add and incr
                cache.add(counter.key, 1, timeout=window)
                failures = 1
        wait = login_backoff_seconds(failures, counter.free_failures)
        if wait:
            cache.set(counter.wait_key, _now() + wait, timeout=math.ceil(wait) + 1)


def admin_login(request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
    if request.method != "POST":
        return admin.site.login(request, extra_context)
    counters = _counters(request)
    wait = _seconds_to_wait(counters)
    if wait > 0:
        seconds = math.ceil(wait)
        context = {**admin.site.each_context(request), "title": "Log in", "seconds": seconds}
        response = TemplateResponse(request, "admin/login_throttled.html", context, status=429)
        response["Retry-After"] = str(seconds)
        return response
    response = admin.site.login(request, extra_context)
    logged_in = response.status_code in (301, 302) and request.user.is_authenticated
    if logged_in:
        cache.delete_many([counters[0].key, counters[0].wait_key])
    else:
        _record_failure(counters)
    return response
