"""The consumer of a routing worker: a thread that reads every app's intake stream with the
consumer group (XREADGROUP, a consumer name per process, on a connection of its own that never holds
an entry over QUEUE_INTAKE_ENTRY_MAX_BYTES: reader.py), hands each app's entries to
consume.queue_entries_consume, claims what a dead consumer left pending (XAUTOCLAIM, once idle for
QUEUE_INTAKE_RECLAIM_SECONDS; then read as its own pending entries) and says it is alive; and a
second thread that keeps the gates (gate.queue_gates_enforce) every QUEUE_INTAKE_WATCH_SECONDS.
An app over its API rate limit has the entries it has no tokens for left pending; its stream is left
out of the reads until they may have tokens (at most consume.RETRY_AFTER_MAX later), then its pending
entries are read again; the other apps' streams are read meanwhile as usual.

Started by the worker itself (messaging.tasks, on worker_ready, for workers serving the routing
queue), so `make run`, compose and the Procfile need nothing more. The backlog stays in Redis: a
read takes at most QUEUE_INTAKE_BATCH entries per stream. Redis or Postgres away: it logs, waits
(backoff up to 30 s) and starts again: ACL users re-applied (a restarted Redis has none), groups
made again where missing, then its own pending entries first (read before and not acknowledged).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from foundation.backoff import Backoff
from foundation.transport.queue_names import GROUP, intake_key, queue_client, queue_redis_url
from messaging.intake.stream.consume import queue_entries_consume
from messaging.intake.stream.credentials import credential_app_names, queue_acl_sync
from messaging.intake.stream.gate import consumer_alive_say, consumer_gone_say, queue_gates_enforce
from messaging.intake.stream.reader import EntryReader

log = logging.getLogger(__name__)

RESTART_BACKOFF = Backoff(base=0.5, cap=30.0, jitter=0.5)
APPS_REFRESH_SECONDS = 2.0  # a new credential's stream is read within this long
# A consumer with nothing pending, idle this many reclaim periods, is removed from the group.
FORGET_AFTER_RECLAIMS = 10


class QueueConsumer:
    def __init__(self, name: str | None = None):
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        # The gate has a thread of its own: a batch being stored never delays a measurement.
        self._threads = [threading.Thread(target=self._restarting, args=(work,), name=f"queue-intake-{role}",
                                          daemon=True) for role, work in (("consumer", self._serve),
                                                                          ("gate", self._watch))]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the batch in hand, then leave (what is pending stays pending for whoever comes next)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        try:
            consumer_gone_say(queue_client(), self.name)
        except redis.RedisError:
            pass  # its last word expires by itself

    def _restarting(self, work) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                work()
                return
            except Exception as exc:  # never ends silently: logged, and started again after a pause
                failures += 1
                delay = RESTART_BACKOFF.seconds(failures)
                expected = isinstance(exc, (redis.RedisError, DatabaseError, OSError))
                log.warning("queue intake %s of %s: %s; starting again in %.1f s", work.__name__.strip("_"),
                            self.name, exc, delay, exc_info=not expected)
                close_old_connections()
                self._stop.wait(delay)

    def _watch(self) -> None:
        """Every QUEUE_INTAKE_WATCH_SECONDS: every app's stream measured and its gate set (gate.py)."""
        client = queue_client()
        apps: list[str] = []
        apps_at = 0.0
        while not self._stop.wait(settings.QUEUE_INTAKE_WATCH_SECONDS):
            if time.monotonic() >= apps_at:
                close_old_connections()
                apps = credential_app_names()
                apps_at = time.monotonic() + APPS_REFRESH_SECONDS
            if apps:  # no app has a credential: nothing to measure (and no Redis call 20 times a second)
                queue_gates_enforce(client=client, app_names=apps)

    def _serve(self) -> None:
        client = queue_client()
        reader = EntryReader(queue_redis_url(), name=f"sbq-reader-{self.name}")
        # Alive from the start: the gate (another thread, measuring from its first 50 ms) applies the
        # consumed stream's cap, not the smaller one of a stream nobody reads, while this one starts.
        consumer_alive_say(client, self.name)
        queue_acl_sync()
        apps: list[str] = []
        own: set[str] | None = None  # apps whose own pending entries are read first ("0"): all of them at a start
        paused: dict[str, float] = {}  # app -> when its entries waiting for tokens may be read again (monotonic)
        apps_at = reclaim_at = 0.0
        try:
            while not self._stop.is_set():
                close_old_connections()  # a connection Postgres dropped is replaced, as a task's would be
                now = time.monotonic()
                if now >= apps_at:
                    apps = credential_app_names()
                    groups_ensure(client, apps)
                    own = set(apps) if own is None else own & set(apps)
                    apps_at = now + APPS_REFRESH_SECONDS
                consumer_alive_say(client, self.name)
                if now >= reclaim_at:
                    own |= self._reclaim(client, apps)  # what it claimed is read as its own
                    reclaim_at = now + settings.QUEUE_INTAKE_RECLAIM_SECONDS / 2
                if apps:
                    self._read(client, reader, apps, own, paused)
                else:  # no app has a credential yet: look again when the list is read again
                    self._stop.wait(APPS_REFRESH_SECONDS)
        finally:
            reader.close()

    def _read(self, client: redis.Redis, reader: EntryReader, apps: list[str], own: set[str],
              paused: dict[str, float]) -> None:
        """One XREADGROUP over the apps' streams and their entries consumed. An app with entries of
        its own pending is read from "0" (and without blocking) until none are left; an app whose
        entries wait for tokens of its rate limit is left out until they may have some, then read
        from "0" again; the others are read from ">" (new entries), blocking up to
        QUEUE_INTAKE_BLOCK_SECONDS, or less when a paused app is due sooner."""
        now = time.monotonic()
        for name, until in list(paused.items()):
            if until <= now:
                del paused[name]
        ready = [name for name in apps if name not in paused]
        if not ready:  # every app waits for tokens: until the first may have some
            self._stop.wait(min(paused.values()) - now)
            return
        block = None
        if not own & set(ready):
            wait = min([settings.QUEUE_INTAKE_BLOCK_SECONDS, *(until - now for until in paused.values())])
            block = max(1, int(wait * 1000))
        streams = [(intake_key(name), "0" if name in own else ">") for name in ready]
        answer = reader.read(group=GROUP, consumer=self.name, streams=streams, count=settings.QUEUE_INTAKE_BATCH,
                             block_ms=block)
        names = {intake_key(name).encode(): name for name in ready}
        answered = set()
        for key, entries in answer:
            name = names[key]
            answered.add(name)
            if not entries:
                own.discard(name)  # none of its own left: new entries from now on
                continue
            done = queue_entries_consume(client=client, app_name=name, entries=entries)
            if done.waiting:  # over its rate limit: the rest stays pending, read again from "0" once due
                own.add(name)
                paused[name] = time.monotonic() + done.retry_after
        own -= {name for name in ready if name in own and name not in answered}

    def _reclaim(self, client: redis.Redis, apps: list[str]) -> set[str]:
        """Entries left pending by a consumer that died (or hangs), idle long enough, claimed by this one
        (ids only: Redis 6.2 answers an entry deleted meanwhile with no id); they are then read as its own
        pending entries. The apps it claimed entries of."""
        idle_ms = int(settings.QUEUE_INTAKE_RECLAIM_SECONDS * 1000)
        claimed: dict[str, int] = {}
        for name in apps:
            start = b"0-0"
            while not self._stop.is_set():
                start, ids = client.execute_command("XAUTOCLAIM", intake_key(name), GROUP, self.name, idle_ms, start,
                                                    "COUNT", settings.QUEUE_INTAKE_BATCH, "JUSTID")[:2]
                if ids:
                    claimed[name] = claimed.get(name, 0) + len(ids)
                if start in (b"0-0", "0-0"):
                    break
            self._forget_consumers(client, name, idle_ms * FORGET_AFTER_RECLAIMS)
        if claimed:
            log.info("queue intake: %d entries claimed from consumers gone quiet", sum(claimed.values()))
        return set(claimed)

    def _forget_consumers(self, client: redis.Redis, app_name: str, idle_ms: int) -> None:
        for consumer in client.xinfo_consumers(intake_key(app_name), GROUP):
            gone = consumer["name"].decode() if isinstance(consumer["name"], bytes) else consumer["name"]
            if gone != self.name and consumer["pending"] == 0 and consumer["idle"] > idle_ms:
                client.xgroup_delconsumer(intake_key(app_name), GROUP, gone)


def groups_ensure(client: redis.Redis, app_names: list[str]) -> None:
    """The consumer group of each app's stream (and the stream), from its first entry: entries
    written before the group existed are consumed too."""
    for name in app_names:
        try:
            client.xgroup_create(intake_key(name), GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


_consumer: QueueConsumer | None = None


def queue_consumer_start() -> QueueConsumer | None:
    """Start this process's consumer (once; not where QUEUE_INTAKE_CONSUMER is off)."""
    global _consumer
    if _consumer is None and settings.QUEUE_INTAKE_CONSUMER:
        _consumer = QueueConsumer()
        _consumer.start()
        log.info("queue intake consumer %s started", _consumer.name)
    return _consumer


def queue_consumer_stop() -> None:
    global _consumer
    if _consumer is not None:
        _consumer.stop()
        _consumer = None
