"""The web node's per-process machinery, started by its first WebSocket connection.

- registers the Node row and heartbeats (Redis key + Node row + re-asserting local connections in
  the presence cache, which also heals a restarted Redis);
- owns the two micro-batchers: "route these committed deliveries" and "these deliveries were
  written to their sockets";
- knows the connections this process holds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from django.conf import settings

from messaging import dispatch
from messaging.asyncdb import run_db
from messaging.batching import Batcher
from messaging.services import deliveries_mark_delivered
from presence import cache
from presence.liveness import node_restart_cleanup
from presence.services import node_heartbeat_record, node_register

log = logging.getLogger(__name__)


@dataclass
class LocalConnection:
    user_id: str
    acks: bool


def _mark_delivered(ids: list[int]) -> None:
    deliveries_mark_delivered(delivery_ids=ids)


class NodeRuntime:
    def __init__(self) -> None:
        self.node_id = settings.NODE_ID
        self.connections: dict[str, LocalConnection] = {}
        self.routing = Batcher("routing", dispatch.routing_task_send, linger=0.003)
        self.delivered = Batcher("delivered", _mark_delivered, linger=0.002)
        self._started: asyncio.Future | None = None
        self._heartbeat: asyncio.Task | None = None

    async def ensure_started(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self.routing.bind(loop)
        self.delivered.bind(loop)
        dispatch.routing_batch_sink_install(self.routing.add_threadsafe)
        await run_db(node_restart_cleanup, node_id=self.node_id)
        await run_db(node_register, node_id=self.node_id, domain=settings.DOMAIN_NAME)
        await cache.node_heartbeat(node_id=self.node_id, ttl=settings.PRESENCE_NODE_TIMEOUT, connections=[])
        self._heartbeat = asyncio.ensure_future(self._beat())
        log.info("node %s joined domain %s", self.node_id, settings.DOMAIN_NAME)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(settings.PRESENCE_HEARTBEAT_SECONDS)
            try:
                conns = [(c.user_id, ch, c.acks) for ch, c in list(self.connections.items())]
                await cache.node_heartbeat(node_id=self.node_id, ttl=settings.PRESENCE_NODE_TIMEOUT,
                                           connections=conns)
                await run_db(node_heartbeat_record, node_id=self.node_id)
            except Exception:
                # Redis or Postgres away for a moment: the next beat tries again. If it stays away
                # long enough, the reaper elsewhere declares this node dead, which is right.
                log.exception("heartbeat of node %s failed", self.node_id)


_runtime: NodeRuntime | None = None


def runtime() -> NodeRuntime:
    global _runtime
    if _runtime is None:
        _runtime = NodeRuntime()
    return _runtime
