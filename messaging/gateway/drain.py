"""A draining web node lets its clients go: the application's side of foundation.drain_server.

By the time `node_drain` returns (the window, plus what the last ends take; the server cuts it at
DRAIN_SECONDS + DRAIN_GRACE_SECONDS):
- every /ws socket the node held (authenticated or not) was closed with 1012, and every channel
  stream was sent `reconnect` and ended, each at its own random moment within the window, so the
  clients reconnect to other nodes spread out rather than all at once;
- every connection's end has run (messaging.gateway.connection.life.ConnectionLife.end): what a client held
  but had not ACKed is back in its mailbox, its presence is gone, the master user was told
  USER_DISCONNECTED where it was the user's last connection in the cluster (the presence cache
  answers that atomically: a user already reconnected on another node is not announced), its
  session row is closed;
- every ACK the node read is recorded: a client's ACKs sent before it saw the close frame are still
  read (autobahn reads while closing) and handled before its disconnect, one frame at a time; their
  marks, like everything else the node batched, are flushed and committed (NodeRuntime.batchers);
- the node has left: no heartbeat, its Node row stopped, its Redis keys gone
  (presence.lost_nodes.node_deregister). A session whose end failed is closed there, and what was
  in flight to its user re-queued, as for a node that died.
"""

from __future__ import annotations

import asyncio
import logging
import random

from foundation.asyncdb import run_db
from messaging.core.delivery.lost_nodes import lost_nodes_settle
from messaging.gateway.runtime import NodeRuntime, runtime
from presence.lost_nodes import node_deregister

log = logging.getLogger(__name__)
POLL_SECONDS = 0.05


async def node_drain(window: float) -> str:
    """Let every client of this node go within `window` seconds, then leave; one line saying so."""
    node = runtime()
    loop = asyncio.get_running_loop()
    started = loop.time()
    closed = await _connections_end(node, window)
    took = loop.time() - started
    log.info("closed %d sockets and streams over %.1fs", closed, took)
    if not node.started:
        return f"drain: {closed} sockets closed; the node had not joined, nothing to flush or deregister"
    await node.batchers_flushed()
    node.heartbeat_stop()
    leftover = await run_db(node_deregister, node_id=node.node_id)
    if leftover is not None and leftover.users:
        await run_db(lost_nodes_settle, reaped=[leftover])
    await node.batchers_flushed()
    left = leftover.sessions if leftover is not None else 0
    return f"drain: batchers flushed, node {node.node_id} deregistered ({left} sessions left to close)"


async def _connections_end(node: NodeRuntime, window: float) -> int:
    """Ask every drainable connection to end at a random moment of the window (one that appears
    meanwhile, in what is left of it), and wait until each one's end has run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window
    asked: set[object] = set()
    pending: set[asyncio.Task] = set()
    while True:
        for key, end in list(node.drainable.items()):
            if key not in asked:
                asked.add(key)
                delay = random.uniform(0.0, max(0.0, deadline - loop.time()))
                task = asyncio.ensure_future(_end_after(delay, end))
                pending.add(task)
                task.add_done_callback(pending.discard)
        if not pending and not node.drainable:
            return len(asked)
        await asyncio.sleep(POLL_SECONDS)


async def _end_after(delay: float, end) -> None:
    await asyncio.sleep(delay)
    try:
        await end()
    except Exception:
        log.exception("ending a connection at drain failed")
