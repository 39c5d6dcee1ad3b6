"""The eventsource process: an app's exchange built from its durable state, served over TCP (and the
Redis intake) until SIGTERM/SIGINT, then flushed. `manage.py eventsource` is its thin entry point."""

from __future__ import annotations

import asyncio
import logging
import signal

from django.conf import settings
from django.db import connections

from messaging.exchange import ws_bridge
from messaging.exchange.adapter import Exchange, servers_start
from messaging.exchange.engine import Engine
from messaging.exchange.event_lines_reader import intake_loop
from messaging.exchange.store import exchange_batch_commit, exchange_state_load, follow_graph_load

log = logging.getLogger(__name__)


def _ws_forward(app_id: int, events: list) -> None:
    # Looked up per call through the module, so tests can replace the functions.
    try:
        if ws_bridge.ws_listeners(app_id):
            ws_bridge.events_to_ws(app_id, events)
    except Exception:  # /ws users missing a batch must not stop the exchange
        log.exception("exchange %s: EVENT frames for /ws failed", app_id)


def exchange_build(*, app_id: int, label: str) -> Exchange:
    """The app's exchange, resuming at applied_seq + 1 with the committed follow graph."""
    state = exchange_state_load(app_id=app_id)
    engine = Engine(applied_seq=state.applied_seq, followers=follow_graph_load(app_id=app_id),
                    gap_report_seconds=settings.EXCHANGE_GAP_REPORT_SECONDS,
                    gap_timeout_seconds=settings.EXCHANGE_GAP_TIMEOUT_SECONDS)
    connections.close_all()  # the loop thread is done with the database: the commit thread has its own
    return Exchange(app_id=app_id, engine=engine, commit=exchange_batch_commit, ws=_ws_forward, label=label,
                    commit_events=settings.EXCHANGE_COMMIT_EVENTS, commit_ms=settings.EXCHANGE_COMMIT_MS,
                    client_buffer_bytes=settings.EXCHANGE_CLIENT_BUFFER_BYTES, max_ahead=settings.EXCHANGE_MAX_AHEAD,
                    source_secret=settings.EXCHANGE_SOURCE_SECRET.encode() or None)


async def task_stop(task: asyncio.Task, *, again_after: float = 1.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling again every `again_after` seconds: a
    cancellation that lands in a library's own timeout (a Redis read with `block`) can be swallowed
    there, and the task would then run on while its caller waits for ever."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_after)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s ended with an error", task.get_name(), exc_info=task.exception())


async def exchange_serve(*, exchange: Exchange, host: str, event_port: int, client_port: int,
                         intake: bool = True, ready: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    exchange.start()
    servers = await servers_start(exchange, host=host, event_port=event_port, client_port=client_port)
    reader = asyncio.create_task(intake_loop(exchange)) if intake else None
    log.info("exchange %s: events on %s:%s, clients on %s:%s, resuming after %s", exchange.label, host,
             event_port, host, client_port, exchange.engine.applied_seq)
    print(f"eventsource ready: events {host}:{event_port} clients {host}:{client_port} "
          f"applied_seq={exchange.engine.applied_seq}", flush=True)
    if ready is not None:
        ready.set()
    await stop.wait()
    # Stop accepting, flush the last commit, close the clients.
    for server in servers:
        server.close()
    if reader is not None:
        await task_stop(reader)
    await exchange.close()
    print(f"eventsource stopped at applied_seq={exchange.engine.applied_seq}", flush=True)
