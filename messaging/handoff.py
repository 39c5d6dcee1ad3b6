"""The one door from "stored" to "routed": work handed to the workers, by task name, through one
dispatcher object chosen once by the composition root.

Whatever commits deliveries (a send, a confirmation, a re-queue, a dead node's settlement) hands
their ids through here, once committed; the network's senders (a link's queue, its channel
publishes, its receipts) and webhook calls are woken the same way. Tasks are named, not imported:
this module imports nothing of messaging, so nothing that stores a message depends on the code that
routes it (messaging.tasks, run by the workers), and no import cycle can run through the hand-off.

The dispatcher is the one thing that decides how named work runs:
- `CeleryDispatcher` (production, and every process a test starts): the task goes to the broker, on
  its queue, for a worker;
- `InlineDispatcher` (the test process, config.settings.test): the task is recorded, and runs in
  this process, as the same task function a worker would run, when a test calls `pump()`.
config.apps installs the one named by settings.HANDOFF_DISPATCHER; `dispatcher_use` replaces it
(a test harness that plays several domains records which domain handed each task over).

A web node batches before it hands over: its routing batcher (messaging.runtime) gathers what its
connections commit within ROUTING_LINGER_SECONDS and calls `routing_enqueue` once for them. The
node passes that batcher to whatever it stores with, as the `route` argument (`Route`); everyone
else hands over one task per call.
"""

from __future__ import annotations

import importlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from celery import current_app
from django.conf import settings

from foundation.transport.redis_clients import sync_client

Route = Callable[[Sequence[int]], None]  # takes committed delivery ids on their way to routing

ROUTE_TASK = "messaging.tasks.route_deliveries"
ROUTING_QUEUE = "routing"
ROUTING_TASK_MAX_IDS = 500  # keeps one task's claim statement and its pushes short
WEBHOOK_TASK = "messaging.tasks.webhook_deliver"
# Webhook calls wait on tenants' receivers: a queue of their own, served by a worker of their own
# (`-Q webhooks`), so a slow receiver never holds a thread that routing needs.
WEBHOOK_QUEUE = "webhooks"
# The domain network (messaging.network): a link's senders (its deliveries, its channel publishes,
# its receipts). A queue of their own: a call waits on a neighbour (up to FORWARD_TIMEOUT_SECONDS),
# and a link that is down must never hold a thread that routing needs. Served by make run's outbound
# worker with the webhook calls (`-Q webhooks,forwarding`), not by the routing worker.
FORWARD_LINK_TASK = "messaging.tasks.forward_link"
FORWARD_RECEIPTS_TASK = "messaging.tasks.forward_receipts"
FORWARDING_QUEUE = "forwarding"
FLOOD_TASK = "messaging.tasks.flood_link"  # a link's queue of channel publishes
FAST_FORWARD_TASK = "messaging.tasks.forward_fast"  # a FAST item for users homed elsewhere
# "A wake-up of this domain's flood sender to `peer` is on its way": publishes made before the sender
# starts need no wake-up of their own (it sends the whole queue). Expires, so a wake-up lost with a
# worker (or a "forwarding" queue nobody serves) costs one task per link per this many seconds, not
# one per publish.
FLOOD_WAKE_KEY = "sb:flood:wake:{here}:{peer}"
FLOOD_WAKE_SECONDS = 10


# --- the dispatcher -------------------------------------------------------------------------------


class Dispatcher(Protocol):
    def dispatch(self, task: str, args: list, queue: str) -> None:
        """Have the task named `task` run with `args` (JSON-serialisable), on `queue`'s workers."""


class CeleryDispatcher:
    """Production: each task goes to the broker, on its queue."""

    def dispatch(self, task: str, args: list, queue: str) -> None:
        current_app.send_task(task, args=args, queue=queue)


@dataclass(frozen=True)
class Handed:
    task: str
    args: list
    queue: str
    context: Any = None  # what the recorder knew when it was handed over (a test network: the domain)


def task_run(task: str, args: list) -> Any:
    """Run the task named `task` here, now: the function the workers run (`messaging.tasks.x`)."""
    module, _, name = task.rpartition(".")
    return getattr(importlib.import_module(module), name)(*args)


class InlineDispatcher:
    """Tests: each task is recorded, in order; `pump()` runs what is waiting (and what that hands
    over in turn) in this process, through the task functions the workers run."""

    def __init__(self) -> None:
        self.waiting: deque[Handed] = deque()
        self.ran: list[Handed] = []
        self._lock = threading.Lock()

    def context(self) -> Any:
        return None

    def dispatch(self, task: str, args: list, queue: str) -> None:
        with self._lock:
            self.waiting.append(Handed(task, list(args), queue, self.context()))

    def run(self, handed: Handed) -> Any:
        return task_run(handed.task, handed.args)

    def pump(self, *, rounds: int = 1000, only: Callable[[Handed], bool] | None = None) -> list[Handed]:
        """Run the waiting tasks, oldest first, and those they hand over, until none is left (or
        none that `only` accepts). Returns what ran."""
        done: list[Handed] = []
        for _ in range(rounds):
            with self._lock:
                handed = next((h for h in self.waiting if only is None or only(h)), None)
                if handed is None:
                    return done
                self.waiting.remove(handed)
            self.run(handed)
            self.ran.append(handed)
            done.append(handed)
        raise AssertionError(f"the hand-off did not settle after {rounds} tasks: {list(self.waiting)[:5]}")

    def tasks(self, name: str | None = None) -> list[Handed]:
        """What waits now (only tasks named `name`)."""
        with self._lock:
            return [h for h in self.waiting if name is None or h.task == name]

    def clear(self) -> None:
        with self._lock:
            self.waiting.clear()


_dispatcher: Dispatcher = CeleryDispatcher()


def dispatcher() -> Dispatcher:
    return _dispatcher


def dispatcher_use(new: Dispatcher) -> Dispatcher:
    """Hand every task from now on to `new`; returns the one it replaces."""
    global _dispatcher
    previous, _dispatcher = _dispatcher, new
    return previous


# --- what is handed over --------------------------------------------------------------------------


def routing_enqueue(delivery_ids: Sequence[int]) -> None:
    """One routing task per ROUTING_TASK_MAX_IDS committed deliveries."""
    ids = list(delivery_ids)
    for start in range(0, len(ids), ROUTING_TASK_MAX_IDS):
        _dispatcher.dispatch(ROUTE_TASK, [ids[start:start + ROUTING_TASK_MAX_IDS]], ROUTING_QUEUE)


def webhook_calls_enqueue(delivery_ids: Sequence, claim: int) -> None:
    """One task per recorded webhook call (each waits on a different receiver), under `claim`."""
    for delivery_id in delivery_ids:
        _dispatcher.dispatch(WEBHOOK_TASK, [str(delivery_id), claim], WEBHOOK_QUEUE)


def flood_links_enqueue(peers: Sequence[str]) -> None:
    """Wake the channel-publish sender of each link to `peers`, unless a wake-up is already on its
    way (one sender runs per link at a time; the flood sweep makes up for a wake-up that is lost)."""
    if not peers:
        return
    pipe = sync_client().pipeline(transaction=False)
    for peer in peers:
        pipe.set(FLOOD_WAKE_KEY.format(here=settings.DOMAIN_NAME, peer=peer), b"1", nx=True, ex=FLOOD_WAKE_SECONDS)
    for peer, first in zip(peers, pipe.execute(), strict=True):
        if first:
            _dispatcher.dispatch(FLOOD_TASK, [peer], FORWARDING_QUEUE)


def flood_link_woken(peer: str) -> None:
    """The link's sender starts: a publish from now on needs a wake-up of its own again."""
    sync_client().delete(FLOOD_WAKE_KEY.format(here=settings.DOMAIN_NAME, peer=peer))


def link_recovered_enqueue(peer: str) -> None:
    """A link answers again after being down: its queues are sent now, not at their next retry."""
    for task in (FORWARD_LINK_TASK, FLOOD_TASK, FORWARD_RECEIPTS_TASK):
        _dispatcher.dispatch(task, [peer], FORWARDING_QUEUE)


def forward_links_kick(peers: Sequence[str]) -> None:
    """Wake the sender of each link (one task per neighbour; a sender already running makes the
    extra task a no-op, messaging.network.outbox)."""
    for peer in sorted(set(peers)):
        _dispatcher.dispatch(FORWARD_LINK_TASK, [peer], FORWARDING_QUEUE)


def receipt_links_kick(peers: Sequence[str]) -> None:
    """Wake the receipt sender of each link (messaging.network.receipts)."""
    for peer in sorted(set(peers)):
        _dispatcher.dispatch(FORWARD_RECEIPTS_TASK, [peer], FORWARDING_QUEUE)


def fast_forward_enqueue(item: dict) -> None:
    """Carry a FAST item towards its recipients' home domains (messaging.network.fast_forward)."""
    _dispatcher.dispatch(FAST_FORWARD_TASK, [item], FORWARDING_QUEUE)
