"""The web node's per-process machinery, started by its first WebSocket connection.

- registers the Node row and heartbeats: each beat reconciles the presence cache with exactly the
  connections this process holds (presence.cache.node_heartbeat), announces USER_DISCONNECTED (and
  the user.disconnected webhook) for users a stale entry kept online, and stamps the Node row. A
  node the reaper declared dead while it was silent closes every socket with 1012 (clients
  reconnect and fetch) and starts a new life;
- owns the micro-batchers: the intake (group commit of what senders send, messaging.intake.group_commit),
  "route these committed deliveries" (gathered into one task, handed over by foundation.handoff),
  "these deliveries reached their sockets" and "these claims go back to the mailbox". The routing
  batcher is given, as `route`, to everything the node stores or confirms with. Every one of them is
  in `batchers` (what a drain flushes). Beside them, a connection's once-per-life work is batched
  too (messaging.gateway.connection.admission): session rows and first reads in `batchers`, and, on the
  event loop, presence entries, the master's lookups and FAST sends' lookups in `loop_batchers`;
- knows the connections this process holds, and the per-user delivery budgets;
- knows what a drain must end (`drainable`): every /ws socket from its connect on (authenticated
  or not) and every channel stream, each with the coroutine that ends it asking its client to
  reconnect elsewhere (messaging.gateway.drain). An entry goes once the connection's end has run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps_registry.selectors import app_snapshot, user_id_parse
from foundation.asyncdb import run_db
from foundation.handoff import Route, routing_enqueue
from foundation.heap import heap_freeze
from foundation.loop_watch import loop_watch_start
from foundation.transport.frames import CLOSE_RESTART
from messaging.channels.hub import ChannelHub
from messaging.channels.services import channel_occupancy_record
from messaging.core import metrics
from messaging.core.delivery.claims import deliveries_release
from messaging.core.delivery.delivered import deliveries_mark_delivered
from messaging.core.delivery.lost_nodes import lost_nodes_settle
from messaging.core.presence_notices import user_presence_announce
from messaging.gateway.connection.admission import (
    connections_lookup_batch,
    fast_lookups_batch,
    first_reads,
    presence_add_batch,
    presence_remove_batch,
    sessions_close_batch,
    sessions_open_batch,
)
from messaging.gateway.limits import UserWorkLimits
from messaging.gateway.pusher.webhooks import pusher_occupancy_changed
from messaging.intake.batching import Batcher, LoopBatcher
from messaging.intake.group_commit import Intake
from messaging.requests.submit import requests_submit
from messaging.requests.webhook import readers_routed_by
from messaging.webhooks.inline import webhook_calls_settle
from presence import cache
from presence.lost_nodes import node_restart_cleanup
from presence.services import node_heartbeat_record, node_register

log = logging.getLogger(__name__)


@dataclass
class LocalConnection:
    user_id: str
    app_id: int
    acks: bool
    close: Callable[[int, str], Awaitable[None]]  # closes the socket with a code
    session: str = ""  # the client's resumable session


def _release(claims: list[tuple[int, int]]) -> None:
    deliveries_release(claims=claims, park=True)


async def _occupancy_changed(app_id: int, channel: str, occupied: bool) -> None:
    await run_db(channel_occupancy_record, app_id=app_id, channel=channel, occupied=occupied)
    await pusher_occupancy_changed(app_id, channel, occupied)  # (a Pusher channel's, in Pusher's format)


class NodeRuntime:
    def __init__(self) -> None:
        self.node_id = settings.NODE_ID
        self.connections: dict[str, LocalConnection] = {}
        self.routing = Batcher("routing", routing_enqueue, linger=settings.ROUTING_LINGER_SECONDS)
        # Where whatever this node commits hands its deliveries over (from any thread: transactions
        # commit in DB threads): gathered into one routing task per ROUTING_LINGER_SECONDS.
        self.route: Route = self.routing.add_threadsafe
        self.intake = Intake(route=self.route)
        # ACK marks and releases are idempotent, and an ACK's mark exists nowhere else: a failed
        # flush is tried again for about 6 s (0.05 s doubling, 7 tries) before it is given up.
        self.delivered = Batcher("delivered", self._mark_delivered, linger=settings.DELIVERED_LINGER_SECONDS,
                                 retries=6)
        self.released = Batcher("released", _release, linger=settings.DELIVERED_LINGER_SECONDS, retries=6)
        self.sessions_opened = Batcher("sessions opened", sessions_open_batch)
        self.sessions_closed = Batcher("sessions closed", sessions_close_batch)
        self.first_reads = Batcher("first reads", first_reads)
        # Requests to the apps' servers, taken in together (messaging.requests.submit).
        self.requests = Batcher("requests", lambda items: requests_submit(submissions=items, inline=True),
                                linger=settings.INTAKE_LINGER_SECONDS, max_pending=settings.INTAKE_MAX_PENDING)
        # ... and their webhooks' first attempts, made here, recorded together (messaging.webhooks.inline).
        self.calls_settled = Batcher("request calls settled", webhook_calls_settle,
                                     linger=settings.DELIVERED_LINGER_SECONDS)
        # Every batcher of the node: bound to the loop at start, flushed by a drain before the node leaves.
        self.batchers: list[Batcher] = [self.intake.batcher, self.routing, self.delivered, self.released,
                                        self.sessions_opened, self.sessions_closed, self.first_reads, self.requests,
                                        self.calls_settled]
        self.presence_adds = LoopBatcher("presence adds", presence_add_batch)
        self.presence_removes = LoopBatcher("presence removes", presence_remove_batch)
        self.master_lookups = LoopBatcher("master lookups", connections_lookup_batch)
        # The recipients' connections of the FAST sends of one turn of the loop, in one round trip.
        self.fast_lookups = LoopBatcher("FAST lookups", fast_lookups_batch)
        self.loop_batchers: list[LoopBatcher] = [self.presence_adds, self.presence_removes, self.master_lookups,
                                                 self.fast_lookups]
        self.drainable: dict[object, Callable[[], Awaitable[None]]] = {}
        self.work_limits = UserWorkLimits()
        self.hub = ChannelHub(self.node_id, on_occupancy=_occupancy_changed)
        self.tasks: set[asyncio.Task] = set()  # background work (background())
        self.declared_dead_hooks: list[Callable[[], Awaitable[None]]] = []  # (declared_dead)
        self.request_readers = readers_routed_by(self.route)  # what a request webhook's answer means, here
        self._started: asyncio.Future | None = None
        self._heartbeat: asyncio.Task | None = None

    def background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run `work` on the node's loop without waiting for it (a request's webhook call): kept until
        it ends, and a failure logged."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background work of node %s failed", self.node_id, exc_info=task.exception())

    async def ensure_started(self) -> None:
        if self._started is None or (self._started.done() and self._started.exception() is not None):
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    def _mark_delivered(self, ids: list[int]) -> None:
        deliveries_mark_delivered(delivery_ids=ids, route=self.route)  # confirmations routed through this node

    def _restart_cleanup(self) -> None:
        reaped = node_restart_cleanup(node_id=self.node_id)
        if reaped is not None:
            lost_nodes_settle(reaped=[reaped], route=self.route)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        loop_watch_start()
        for batcher in self.batchers:
            batcher.bind(loop)
        await run_db(self._restart_cleanup)
        await self.join()
        await self.hub.start()
        if settings.WEB_HEAP_FREEZE:
            heap_freeze()  # (once: what a node holds for its life, out of every full collection's walk)
        self._heartbeat = asyncio.ensure_future(self._beat())
        log.info("node %s joined domain %s", self.node_id, settings.DOMAIN_NAME)

    async def join(self) -> None:
        """Register this node (again: a new life after it was declared dead, or after its Node row
        went) in the presence cache and the Node table, and announce what its last life left behind."""
        gone = await cache.node_revive(node_id=self.node_id)
        await run_db(node_register, node_id=self.node_id, domain=settings.DOMAIN_NAME)
        await cache.node_heartbeat(node_id=self.node_id, ttl=settings.PRESENCE_NODE_TIMEOUT, held=[])
        await self._announce_offline(gone)

    def connection_add(self, channel_name: str, conn: LocalConnection) -> None:
        self.connections[channel_name] = conn
        metrics.CONNECTIONS.set(len(self.connections))
        metrics.TRANSPORT_CONNECTIONS.labels("ws").set(len(self.connections))

    def connection_remove(self, channel_name: str) -> None:
        self.connections.pop(channel_name, None)
        metrics.CONNECTIONS.set(len(self.connections))
        metrics.TRANSPORT_CONNECTIONS.labels("ws").set(len(self.connections))

    @property
    def started(self) -> bool:
        return self._started is not None and self._started.done() and self._started.exception() is None

    def drainable_add(self, key: object, end: Callable[[], Awaitable[None]]) -> None:
        self.drainable[key] = end

    def drainable_remove(self, key: object) -> None:
        self.drainable.pop(key, None)

    async def batchers_flushed(self) -> None:
        """Wait until every batcher is idle at once: a flush may feed another (a delivered mark is
        routed, an intake batch too), so the pass repeats until none has anything left."""
        while any(b.busy for b in self.batchers):
            for batcher in self.batchers:
                await batcher.flushed()

    def heartbeat_stop(self) -> None:
        """A draining node leaves: no beat may re-assert anything in the presence cache after it."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(settings.PRESENCE_HEARTBEAT_SECONDS)
            try:
                await self.heartbeat()
            except Exception:
                # Redis or Postgres away for a moment: the next beat tries again. If it stays away
                # long enough, the reaper elsewhere declares this node dead, which is right.
                log.exception("heartbeat of node %s failed", self.node_id)

    async def heartbeat(self) -> None:
        held = [cache.HeldConnection(ch, c.user_id, c.acks, c.session) for ch, c in list(self.connections.items())]
        try:
            gone = await cache.node_heartbeat(node_id=self.node_id, ttl=settings.PRESENCE_NODE_TIMEOUT, held=held)
            alive = await run_db(node_heartbeat_record, node_id=self.node_id)
            await self.hub.reassert()
        except cache.NodeDeclaredDead:
            alive, gone = False, []
        if not alive:
            await self.declared_dead()
            return
        await self._announce_offline(gone)

    async def _announce_offline(self, users: list[str]) -> None:
        """USER_DISCONNECTED for users whose last connection was a stale entry the cache just dropped."""
        for user_id in users:
            parsed = user_id_parse(user_id)
            app = await run_db(app_snapshot, parsed.app_name) if parsed else None
            if app:
                await user_presence_announce(app=app, user_id=user_id, connected=False)

    async def declared_dead(self) -> None:
        """The reaper ended this node's sessions while it was silent: its sockets are ghosts.

        Close them all with 1012 (the clients reconnect, to this node or another, and fetch what
        they missed), then join again as a new life of the node.
        """
        conns = list(self.connections.values())
        self.connections.clear()  # the next beat must not re-assert sockets that are closing
        metrics.CONNECTIONS.set(0)
        metrics.TRANSPORT_CONNECTIONS.labels("ws").set(0)
        log.warning("node %s was declared dead while silent; closing %d sockets with 1012",
                    self.node_id, len(conns))
        await asyncio.gather(*(c.close(CLOSE_RESTART, "this node was declared dead; reconnect") for c in conns),
                             return_exceptions=True)
        # Doors whose connections are not in `connections` (Pusher clients) end theirs too.
        await asyncio.gather(*(hook() for hook in self.declared_dead_hooks), return_exceptions=True)
        await self.join()


_runtime: NodeRuntime | None = None


def runtime() -> NodeRuntime:
    global _runtime
    if _runtime is None:
        _runtime = NodeRuntime()
    return _runtime
