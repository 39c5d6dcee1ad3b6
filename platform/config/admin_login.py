"""The admin login, throttled: a password cannot be guessed at network speed.

After ADMIN_LOGIN_MAX_FAILURES failed logins for one username, or from one address, within
ADMIN_LOGIN_WINDOW_SECONDS, further attempts for that username or from that address are refused
with 429 until the window has passed (counters live in the Redis-backed cache, so every web node
sees them). A successful login clears the username's count.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.contrib import admin
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse


def _keys(request: HttpRequest) -> tuple[str, str]:
    username = (request.POST.get("username") or "").strip().lower()
    # hashed: cache keys must be short and safe whatever a client types
    user_key = "sb:login:u:" + hashlib.sha256(username.encode(errors="replace")).hexdigest()[:32]
    return user_key, "sb:login:ip:" + request.META.get("REMOTE_ADDR", "")


def _blocked(keys: tuple[str, str]) -> bool:
    counts = cache.get_many(keys)
    return any(int(counts.get(k) or 0) >= settings.ADMIN_LOGIN_MAX_FAILURES for k in keys)


def _record_failure(keys: tuple[str, str]) -> None:
    for key in keys:
        if cache.add(key, 1, timeout=settings.ADMIN_LOGIN_WINDOW_SECONDS):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=settings.ADMIN_LOGIN_WINDOW_SECONDS)


def admin_login(request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
    if request.method != "POST":
        return admin.site.login(request, extra_context)
    keys = _keys(request)
    if _blocked(keys):
        minutes = max(1, settings.ADMIN_LOGIN_WINDOW_SECONDS // 60)
        context = {**admin.site.each_context(request), "title": "Log in", "minutes": minutes}
        return TemplateResponse(request, "admin/login_throttled.html", context, status=429)
    response = admin.site.login(request, extra_context)
    logged_in = response.status_code in (301, 302) and request.user.is_authenticated
    if logged_in:
        cache.delete(keys[0])
    else:
        _record_failure(keys)
    return response
