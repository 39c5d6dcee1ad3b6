"""The one door from "stored" to "routed": work handed to the workers, by task name, through one
dispatcher object chosen once by the composition root.

Whatever commits deliveries (a send, a confirmation, a re-queue, a dead node's settlement) hands
their ids through here, once committed; the network's senders (a link's queue, its channel
publishes, its receipts) and webhook calls are woken the same way, and an app's own named tasks
(analytics' jobs) are handed over here too (`task_enqueue`). Tasks are named, not imported:
this module imports nothing of messaging, so nothing that stores a message depends on the code that
routes it (messaging.tasks, run by the workers), and no import cycle can run through the hand-off.

The dispatcher is the one thing that decides how named work runs:
- `CeleryDispatcher` (production, and every process a test starts): the task goes to the broker, on
  its queue, for a worker;
- `InlineDispatcher` (the test process, config.settings.test): the task is recorded, and runs in
  this process, as the same task function a worker would run, when a test calls `pump()`.
config.apps installs the one named by settings.HANDOFF_DISPATCHER; `dispatcher_use` replaces it
(a test harness that plays several domains records which domain handed each task over).

A web node batches before it hands over: its routing batcher (messaging.gateway.runtime) gathers what its
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
# Many recorded calls at once (a storm's user.connected, a batch of dead letters): the recorder hands
# them over in one task, whose worker hands each call its own WEBHOOK_TASK. A web node pays one
# broker publish per batch of calls, not one per call.
WEBHOOK_HAND_OUT_TASK = "messaging.tasks.webhook_hand_out"
WEBHOOK_HAND_OUT_MAX_IDS = 500  # keeps one hand-out task's message small
# Webhook calls wait on tenants' receivers: a queue of their own, served by a worker of their own
# (`-Q webhooks`), so a slow receiver never holds a thread that routing needs.
WEBHOOK_QUEUE = "webhooks"
# The domain network (messaging.federation): a link's senders (its deliveries, its channel publishes,
# its receipts). A queue of their own: a call waits on a neighbour (up to FORWARD_TIMEOUT_SECONDS),
# and a link that is down must never hold a thread that routing needs. Served by make run's outbound
# worker with the webhook calls (`-Q webhooks,forwarding`), not by the routing worker.
FORWARD_LINK_TASK = "messaging.tasks.forward_link"
FORWARD_RECEIPTS_TASK = "messaging.tasks.forward_receipts"
STANDBY_TASK = "messaging.tasks.standby_copy"  # the live copy to one standby domain
GOSSIP_TASK = "messaging.tasks.gossip_presence"  # a round of the network's gossip (presence, takeovers)
GIVEN_BACK_TASK = "messaging.tasks.takeover_given_back"  # a home given its users back settles their rows
FORWARDING_QUEUE = "forwarding"
FLOOD_TASK = "messaging.tasks.flood_link"  # a link's queue of channel publishes
FAST_FORWARD_TASK = "messaging.tasks.forward_fast"  # a FAST item for users homed elsewhere
# Celery's own default queue, served by the routing worker (`-Q celery,routing`): tasks with no queue
# of their own (analytics' jobs) go there, as a task handed over without a queue always did.
DEFAULT_QUEUE = "celery"
# A link's senders are woken once: while a wake-up of one is on its way (handed over, its task not
# yet started), what is queued for it meanwhile needs no wake-up of its own (the sender takes the
# whole queue). The mark expires, so a wake-up lost with a worker (or a "forwarding" queue nobody
# serves) costs one task per link per WAKE_SECONDS, not one per item; the sweeps make up for it.
WAKE_KEY = "sb:wake:{here}:{task}:{peer}"
WAKE_SECONDS = 10
# Receipts are no one's wait (the origin's console shows them, nobody is blocked on them): their
# sender is woken this long after the first receipt of a quiet link, so one call carries what a
# burst of deliveries wrote meanwhile rather than a call per routing batch.
RECEIPT_LINGER_SECONDS = 0.25
# A sender task that finds its link's sender busy looks again this much later (woken like any other,
# so one such task per link is on its way at most): what was queued just after the running sender's
# last look is sent then, not at the next sweep.
BUSY_LOOK_AGAIN_SECONDS = 0.1


# --- the dispatcher -------------------------------------------------------------------------------


class Dispatcher(Protocol):
    def dispatch(self, task: str, args: list, queue: str, *, countdown: float = 0.0) -> None:
        """Have the task named `task` run with `args` (JSON-serialisable), on `queue`'s workers
        (not before `countdown` seconds)."""

    def wake(self, task: str, peer: str, queue: str, *, countdown: float = 0.0, again: bool = False) -> None:
        """`task` with [peer], unless a wake-up of it is already on its way (not yet `woken`);
        `again`: whatever is on its way (a sweep making up for a wake-up lost with a worker)."""

    def woken(self, task: str, peer: str) -> None:
        """`task` for `peer` has started: what is queued from now on wakes it again."""


class CeleryDispatcher:
    """Production: each task goes to the broker, on its queue; a wake-up on its way is a mark in
    Redis (WAKE_KEY), set with the task and cleared when it starts."""

    def dispatch(self, task: str, args: list, queue: str, *, countdown: float = 0.0) -> None:
        current_app.send_task(task, args=args, queue=queue, countdown=countdown or None)

    def wake(self, task: str, peer: str, queue: str, *, countdown: float = 0.0, again: bool = False) -> None:
        key = WAKE_KEY.format(here=settings.DOMAIN_NAME, task=task, peer=peer)
        # SET NX as a dedupe mark, not a lock (those are foundation.locks'): it holds nothing back but
        # a second wake-up; the sender it wakes takes its own lock, and a lost mark costs one task.
        if sync_client().set(key, b"1", nx=not again, ex=WAKE_SECONDS + int(countdown)):
            self.dispatch(task, [peer], queue, countdown=countdown)

    def woken(self, task: str, peer: str) -> None:
        sync_client().delete(WAKE_KEY.format(here=settings.DOMAIN_NAME, task=task, peer=peer))


@dataclass(frozen=True)
class Handed:
    task: str
    args: list
    queue: str
    context: Any = None  # what the recorder knew when it was handed over (a test network: the domain)


# Where the functions of named tasks live, where a name's prefix is not its module (the tasks of
# messaging keep the names they had before their module moved: messaging.routing.tasks).
TASK_MODULES = {"messaging.tasks": "messaging.routing.tasks"}


def task_run(task: str, args: list) -> Any:
    """Run the task named `task` here, now: the function the workers run (`messaging.tasks.x`)."""
    module, _, name = task.rpartition(".")
    return getattr(importlib.import_module(TASK_MODULES.get(module, module)), name)(*args)


class InlineDispatcher:
    """Tests: each task is recorded, in order; `pump()` runs what is waiting (and what that hands
    over in turn) in this process, through the task functions the workers run."""

    def __init__(self) -> None:
        self.waiting: deque[Handed] = deque()
        self.ran: list[Handed] = []
        self._lock = threading.Lock()

    def context(self) -> Any:
        return None

    def dispatch(self, task: str, args: list, queue: str, *, countdown: float = 0.0) -> None:
        with self._lock:
            self.waiting.append(Handed(task, list(args), queue, self.context()))

    def wake(self, task: str, peer: str, queue: str, *, countdown: float = 0.0, again: bool = False) -> None:
        """A wake-up on its way is one waiting here (in the same context)."""
        handed = Handed(task, [peer], queue, self.context())
        with self._lock:
            if again or handed not in self.waiting:
                self.waiting.append(handed)

    def woken(self, task: str, peer: str) -> None:
        pass  # taken off `waiting` as it runs

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
    """One task per recorded webhook call (each waits on a different receiver), under `claim`: what
    a worker hands out (the sweep, a hand-out task)."""
    for delivery_id in delivery_ids:
        _dispatcher.dispatch(WEBHOOK_TASK, [str(delivery_id), claim], WEBHOOK_QUEUE)


def webhook_calls_hand_over(delivery_ids: Sequence, claim: int) -> None:
    """What a recorder hands over once committed: one call goes straight to its task; more go in one
    WEBHOOK_HAND_OUT_TASK per WEBHOOK_HAND_OUT_MAX_IDS, and a webhook worker gives each call its
    task (`webhook_calls_enqueue`). A lost hand-out loses nothing: its calls are handed out again by
    the sweep once their lease has passed, as a lost call's task is."""
    ids = [str(delivery_id) for delivery_id in delivery_ids]
    if len(ids) == 1:
        _dispatcher.dispatch(WEBHOOK_TASK, [ids[0], claim], WEBHOOK_QUEUE)
        return
    for start in range(0, len(ids), WEBHOOK_HAND_OUT_MAX_IDS):
        _dispatcher.dispatch(WEBHOOK_HAND_OUT_TASK, [ids[start:start + WEBHOOK_HAND_OUT_MAX_IDS], claim],
                             WEBHOOK_QUEUE)


def flood_links_enqueue(peers: Sequence[str]) -> None:
    """Wake the channel-publish sender of each link to `peers`, unless a wake-up is already on its
    way (one sender runs per link at a time; the flood sweep makes up for a wake-up that is lost)."""
    for peer in sorted(set(peers)):
        _dispatcher.wake(FLOOD_TASK, peer, FORWARDING_QUEUE)


def link_recovered_enqueue(peer: str) -> None:
    """A link answers again after being down: its queues are sent now, not at their next retry."""
    for task in (FORWARD_LINK_TASK, FLOOD_TASK, FORWARD_RECEIPTS_TASK, STANDBY_TASK):
        _dispatcher.dispatch(task, [peer], FORWARDING_QUEUE)


def forward_links_kick(peers: Sequence[str], *, again: bool = False) -> None:
    """Wake the sender of each link, unless a wake-up is already on its way (a sender already
    running makes an extra task a no-op, messaging.federation.senders.outbox). `again`: forward_sweep, making
    up for a wake-up lost with a worker."""
    for peer in sorted(set(peers)):
        _dispatcher.wake(FORWARD_LINK_TASK, peer, FORWARDING_QUEUE, again=again)


def standby_senders_kick(standbys: Sequence[str]) -> None:
    """Wake the live-copy sender to each standby domain, unless a wake-up is already on its way."""
    for standby in sorted(set(standbys)):
        _dispatcher.wake(STANDBY_TASK, standby, FORWARDING_QUEUE)


def given_back_enqueue(holder: str, *, countdown: float = 0.0) -> None:
    """This domain got its users back from `holder`: settle their rows (messaging.federation.takeover.take)."""
    _dispatcher.dispatch(GIVEN_BACK_TASK, [holder], FORWARDING_QUEUE, countdown=countdown)


# Set by a process that runs the gossip round on a thread of its own (messaging.federation.control_loop):
# gossip_now wakes it there instead of queueing a task behind the forwarding queue's senders.
_gossip_here: Callable[[], object] | None = None


def gossip_here_set(wake: Callable[[], object] | None) -> None:
    global _gossip_here
    _gossip_here = wake


def gossip_now() -> None:
    """A gossip round now, not at the next one due (a takeover or a hand-back to tell the neighbours)."""
    if _gossip_here is not None:
        _gossip_here()
        return
    _dispatcher.dispatch(GOSSIP_TASK, [], FORWARDING_QUEUE)


def receipt_links_kick(peers: Sequence[str], *, again: bool = False) -> None:
    """Wake the receipt sender of each link (messaging.federation.senders.receipts) RECEIPT_LINGER_SECONDS
    from now, unless a wake-up is already on its way (`again`: the sweep, at once)."""
    for peer in sorted(set(peers)):
        _dispatcher.wake(FORWARD_RECEIPTS_TASK, peer, FORWARDING_QUEUE,
                         countdown=0.0 if again else RECEIPT_LINGER_SECONDS, again=again)


def link_sender_run(task: str, peer: str, send: Callable[[], dict]) -> dict:
    """Run a link's sender task (`task` for `peer`; `send` drains its queue and returns its outcome
    as a dict): what is queued from the start on needs a wake-up of its own again; a run stopped by
    its time budget hands the rest to a new one at once (no thread is held for long), and one that
    found another run sending looks again BUSY_LOOK_AGAIN_SECONDS later, for what was queued after
    that run's last look (its wake-up found the run busy)."""
    _dispatcher.woken(task, peer)
    outcome = send()
    if outcome["skipped"] == "budget":
        _dispatcher.wake(task, peer, FORWARDING_QUEUE)
    elif outcome["skipped"] == "busy":
        _dispatcher.wake(task, peer, FORWARDING_QUEUE, countdown=BUSY_LOOK_AGAIN_SECONDS)
    return outcome


def task_enqueue(task: str, args: Sequence = (), *, queue: str = DEFAULT_QUEUE, countdown: float = 0.0) -> None:
    """Any other named task (an app's own: analytics' jobs) with `args`, on `queue`'s workers, not
    before `countdown` seconds: what has no door of its own above still goes through this one."""
    _dispatcher.dispatch(task, list(args), queue, countdown=countdown)


def fast_forward_enqueue(item: dict) -> None:
    """Carry a FAST item towards its recipients' home domains (messaging.federation.senders.fast_forward)."""
    _dispatcher.dispatch(FAST_FORWARD_TASK, [item], FORWARDING_QUEUE)
