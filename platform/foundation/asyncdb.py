"""Running sync ORM services from async consumers.

Channels' `database_sync_to_async` funnels every call of a process through one thread (one DB
connection). A web node with hundreds of sockets needs more than one lane, so services run on a
small dedicated pool. Each thread keeps its connection (no per-call health check: that would be a
SELECT 1 per frame); a call that fails drops its connection if it is broken, so a restarted
Postgres costs one failed call (GENERAL_ERROR to the client), not a dead thread. A call that
returns with a transaction still open on its thread's connection (an atomic block entered and never
left, or autocommit left off by a failure on the way out of one) is logged as the error it is, and
that connection is closed, so the server rolls the transaction back (Django's connection read and
reset by foundation.patches.django): a pooled thread never carries one call's transaction, and its
row locks, into the next call, where it would stay open for the life of the process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections, connection
from django.http import HttpRequest, HttpResponse

from foundation.patches.django import connection_discard, transaction_left_open

log = logging.getLogger(__name__)

T = TypeVar("T")
_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.WEB_DB_THREADS, thread_name_prefix="db")
    return _executor


def _call(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    try:
        return fn(*args, **kwargs)
    except Exception:
        close_old_connections()  # closes connections that errored and are no longer usable
        raise
    finally:
        if transaction_left_open(connection):
            log.error("%s returned inside a transaction it never ended: rolled back, its connection replaced",
                      getattr(fn, "__qualname__", fn))
            connection_discard(connection)


async def run_db(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), functools.partial(_call, fn, args, kwargs))


def pool_connections_close() -> None:
    """Close the database connection of every pool thread (each closes its own: connections are
    per thread). Used where a database must be dropped, e.g. at the end of a test run."""
    if _executor is None:
        return
    workers = _executor._max_workers
    barrier = threading.Barrier(workers)

    def close() -> None:
        connection.close()
        try:
            barrier.wait(timeout=5)  # holds each thread until all have taken one: one call per thread
        except threading.BrokenBarrierError:
            pass

    for future in [_executor.submit(close) for _ in range(workers)]:
        future.result()


def _rendered(view: Callable[..., HttpResponse], request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
    response = view(request, *args, **kwargs)
    if hasattr(response, "render"):
        response.render()  # JSON rendering too, off the event loop
    return response


def pooled(view: Callable[..., HttpResponse]) -> Callable[..., object]:
    """`view` (sync) as an async view that runs on the database pool under ASGI. Under WSGI (tests,
    a WSGI server) the request's own thread is the right one: it runs there."""

    @functools.wraps(view)  # keeps DRF's `cls` (the schema reads it) and `csrf_exempt`
    async def pooled_view(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if isinstance(request, ASGIRequest):
            return await run_db(_rendered, view, request, *args, **kwargs)
        return await sync_to_async(_rendered, thread_sensitive=True)(view, request, *args, **kwargs)

    return pooled_view
