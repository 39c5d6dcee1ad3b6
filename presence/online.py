"""Who is online in an app: reading the app index `sb:a:<appName>:online` (presence.cache).

The index is kept by presence.cache's scripts in the same step as the users' hashes, so it lists
exactly the users that hold a connection somewhere in the cluster. Two readers:

- `app_online_users`: the whole set in one ZRANGE, a single point-in-time view (what a master
  user's snapshot on /ws is built from);
- `app_online_page`: a page after a user id (ZRANGEBYLEX, the REST list); each page is a
  point-in-time view, a walk through several pages is not.

Order is the user ids' bytes ("ANZ-10" before "ANZ-9"): stable, and what a cursor can name.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation.transport.redis_clients import async_client, sync_client

from .cache import APP_ONLINE_KEY, user_key


def app_online_key(app_name: str) -> str:
    return APP_ONLINE_KEY.format(app_name=app_name)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def user_is_online(user_id: str) -> bool:
    """Whether the user holds a connection anywhere in the cluster now (its hash, which the index
    follows)."""
    return bool(await async_client().exists(user_key(user_id)))


async def app_online_users(app_name: str) -> list[str]:
    """Every user of the app holding a connection, in user id order: one ZRANGE, so one
    point-in-time view of the index, however many users it lists."""
    return [_text(u) for u in await async_client().zrange(app_online_key(app_name), 0, -1)]


def app_online_users_sync(app_name: str) -> list[str]:
    return [_text(u) for u in sync_client().zrange(app_online_key(app_name), 0, -1)]


def app_online_count_sync(app_name: str) -> int:
    """How many users of the app hold a connection now (one ZCARD)."""
    return int(sync_client().zcard(app_online_key(app_name)))


@dataclass(frozen=True)
class OnlinePage:
    users: list[str]
    count: int  # the app's users online when the page was read
    more: bool  # users after the last one listed


def app_online_page(app_name: str, *, after: str | None, limit: int) -> OnlinePage:
    """Up to `limit` online users of the app after the user id `after`.

    The page and its count are one MULTI (one point-in-time view of the index); pages read one
    after the other are not: a user online throughout the walk is listed exactly once, one who
    came or went meanwhile may or may not be.
    """
    key = app_online_key(app_name)
    pipe = sync_client().pipeline(transaction=True)
    pipe.zrangebylex(key, "-" if after is None else f"({after}", "+", start=0, num=limit + 1)
    pipe.zcard(key)
    users, count = pipe.execute()
    listed = [_text(u) for u in users]
    return OnlinePage(users=listed[:limit], count=int(count), more=len(listed) > limit)
