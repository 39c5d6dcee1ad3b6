"""The network's control rounds, on time whatever the forwarding queue holds: the gossip round
(messaging.federation.presence_gossip), the takeover watch (messaging.federation.takeover.take) and
the live copy to the standbys (`copy_round`: messaging.federation.standby.copy) run on threads of
their own in every worker that serves the forwarding queue (the outbound worker), not as beat tasks
on that queue.

The copy joined them in session 24: on an overloaded day the fault run read, at each SIGKILL, how far
the victim's copy was behind: 9-100 s, because its sender's wake-ups waited behind the link
senders on that queue (and the beat's sweep that makes them was discarded as expired). What a home
stores or reads in that window is what its standby lacks when it takes the users over.

Why (issue 46, item 3): that queue's threads are the link senders'. When a domain comes back with
a backlog, each of them is busy for seconds at a time, and a beat task due every two seconds with
a two-second expiry waited behind them and was discarded. A hand-back needs a few looks in a row
(closing, then sending the last of the feed, then handing back) and took up to two minutes; a
gossip round lost made this domain look silent to its neighbours. Here each round starts on time,
and a takeover or a hand-back wakes the gossip round at once (foundation.handoff.gossip_now calls
`gossip_wake` when this process runs the rounds) instead of queueing one behind the senders.

With several outbound workers, one of them runs each round at a time: a Redis lease per round and
domain (foundation.locks.lease), never waited for (a worker that finds it taken skips that look).
With Redis away the rounds run without it: two at once are safe (the takeover's own row lock
orders them), only wasteful.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections
from redis.exceptions import RedisError

from foundation import handoff
from foundation.locks import lease
from messaging.federation.presence_gossip import presence_gossip
from messaging.federation.standby.copy import standby_send, standbys_due
from messaging.federation.takeover.take import takeover_watch

log = logging.getLogger(__name__)


class Round:
    """One control round on a thread of its own: `work` every `period()` seconds, or at once when woken."""

    def __init__(self, name: str, work: Callable[[], object], period: Callable[[], float]) -> None:
        self.name, self.work, self.period = name, work, period
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"network-{name}", daemon=True)
        self.rounds = 0

    def _run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            self.wake.clear()
            try:
                close_old_connections()  # a connection Postgres dropped is replaced, as a task's would be
                self._once()
            except Exception:
                log.exception("the network's %s round failed; the next one is due in %.1f s", self.name,
                              self.period())
            self.rounds += 1
            left = self.period() - (time.monotonic() - started)
            if left > 0:
                self.wake.wait(left)

    def _once(self) -> None:
        working = False
        try:
            with lease(f"{settings.DOMAIN_NAME}:{self.name}", ttl=max(30, int(self.period() * 10))) as mine:
                if mine:
                    working = True
                    self.work()
                return
        except RedisError:
            if working:  # (the round's own Redis error: not run a second time)
                raise
        self.work()  # Redis away, no lease to take: run it anyway (see the module doc)


def copy_round() -> list[str]:
    """The live copy (and a holder's feed home) to every standby with changes waiting whose link's
    retry is due, here and now: the same sender the beat's standby_sweep wakes on the queue (one run
    per standby at a time: a run already sending makes this one a no-op). Returns the standbys sent to."""
    due = standbys_due()
    for standby in due:
        standby_send(standby=standby)
    return due


class ControlLoop:
    def __init__(self) -> None:
        self.gossip = Round("gossip", presence_gossip, lambda: settings.PRESENCE_GOSSIP_SECONDS)
        self.takeover = Round("takeover-watch", takeover_watch, lambda: settings.TAKEOVER_WATCH_SECONDS)
        self.copy = Round("standby-copy", copy_round, lambda: settings.STANDBY_COPY_SECONDS)
        self.rounds = (self.gossip, self.takeover, self.copy)

    def start(self) -> None:
        for r in self.rounds:
            r.thread.start()

    def stop(self) -> None:
        for r in self.rounds:
            r.stopping.set()
            r.wake.set()


_loop: ControlLoop | None = None


def control_loop_start() -> ControlLoop:
    """Start this process's rounds (once)."""
    global _loop
    if _loop is None:
        _loop = ControlLoop()
        _loop.start()
        handoff.gossip_here_set(gossip_wake)
    return _loop


def control_loop_stop() -> None:
    global _loop
    if _loop is not None:
        handoff.gossip_here_set(None)
        _loop.stop()
        _loop = None


def gossip_wake() -> bool:
    """Run this process's gossip round now; False when this process runs none (queue one instead)."""
    if _loop is None:
        return False
    _loop.gossip.wake.set()
    return True
