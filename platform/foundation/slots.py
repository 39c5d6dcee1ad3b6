"""Counted slots across processes (a Redis semaphore): at most `cap` holders of one name at once.

A slot is a member of a sorted set scored with its expiry, so a holder that dies (a killed worker)
frees its slot when the expiry passes: give a ttl longer than the work it guards. Taking one is a
single script (drop the expired, count, add), so two processes never both take the last slot.
"""

from __future__ import annotations

import secrets
import time

from foundation.transport.redis_clients import sync_client

_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""


def _key(name: str) -> str:
    return f"sb:slots:{name}"


def slot_take(name: str, *, cap: int, ttl: float) -> str | None:
    """A slot of `name` (its token, for slot_release), or None when `cap` are taken."""
    token = secrets.token_hex(8)
    now = time.time()
    taken = sync_client().eval(_TAKE, 1, _key(name), now, now + ttl, cap, token, int(ttl * 1000) + 1000)
    return token if taken else None


def slot_release(name: str, token: str) -> None:
    sync_client().zrem(_key(name), token)


def slots_taken(name: str) -> int:
    """Slots of `name` held now (expired ones not counted)."""
    return sync_client().zcount(_key(name), time.time(), "+inf")
