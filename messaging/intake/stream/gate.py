"""Where an app's queue writer is let in or refused: its intake stream is bounded in bytes.

Redis 6.2 cannot refuse an XADD by the size of its key, and a user allowed XADD cannot be made to
go through a script (scripts run with the caller's permissions). So the bound is kept from the
consumer side: each stream's size (MEMORY USAGE … SAMPLES 0) is measured every QUEUE_INTAKE_WATCH_SECONDS
by a thread of every consuming worker (runner.py), and every QUEUE_SYNC_SECONDS by beat's sync on the
outbound worker, and the app's ACL user loses +xadd (its XADD answers
`NOPERM`) once the stream holds QUEUE_INTAKE_MAX_BYTES, or QUEUE_INTAKE_UNREAD_BYTES while no
consumer is alive; it gets +xadd back once the stream is under half of that (no flapping at the
edge). ACL SETUSER changes a user in place, so a writer's open connection is refused at its next
command.

Guarantee, and its limit: a stream exceeds its cap by at most what its writer can XADD between two
measurements (its rate times QUEUE_INTAKE_WATCH_SECONDS while a consumer is alive; times
QUEUE_SYNC_SECONDS while only beat's sync watches), plus one entry (a command is bounded by
Redis's client-query-buffer-limit). Measured on the project's two-core machine, one connection
pipelining 1 KiB entries writes about 110 MB/s: some 6 MB past the cap at the default 50 ms. With no worker running at all, nothing watches: a hard bound
needs QUEUE_REDIS_URL on a Redis of its own with `maxmemory` (docs/security.md).

Why SAMPLES 0: MEMORY USAGE without it adds up the first five nodes of the stream's radix tree and
the last, and counts every other node as their average. A writer could hide a 32 MB entry between
small ones (it takes a node of its own) and be measured at 170 KB: the gate never closed. SAMPLES 0
adds up every node: exact, at a cost that grows with the nodes (Redis packs up to 100 entries or
4 KiB in one): measured here, 0.4 ms for a 13 MB stream of 130-byte entries, 4 ms for a 16 MiB
stream of the smallest entries there are (a million, in 10,000 nodes); a stream that its consumers
keep up with is small, and costs microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from django.conf import settings

from foundation.transport.queue_names import CONSUMERS_KEY, acl_user, intake_key
from messaging.intake.stream.stats import stats_add

WRITE = "+xadd"
# A closed gate opens again once the stream is under this fraction of its cap.
REOPEN_FRACTION = 0.5


@dataclass(frozen=True)
class AclState:
    """An ACL user as ACL GETUSER shows it."""

    enabled: bool
    passwords: tuple[str, ...]
    commands: frozenset[str]
    keys: tuple[str, ...]

    @property
    def writable(self) -> bool:
        return WRITE in self.commands


@dataclass(frozen=True)
class Measured:
    app_name: str
    used: int  # bytes the stream holds (0: no stream yet)
    acl: AclState | None  # None: Redis has no such user (never applied, or Redis restarted)


@dataclass(frozen=True)
class Gate:
    app_name: str
    used: int
    cap: int
    writable: bool  # after this check
    changed: bool


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def acl_state_parse(answer: object) -> AclState | None:
    if not answer:
        return None
    fields = answer if isinstance(answer, dict) else dict(zip(answer[::2], answer[1::2], strict=True))
    fields = {_text(k): v for k, v in fields.items()}
    return AclState(enabled=b"on" in fields.get("flags", []) or "on" in fields.get("flags", []),
                    passwords=tuple(_text(p) for p in fields.get("passwords", [])),
                    commands=frozenset(_text(fields.get("commands", b"")).split()),
                    keys=tuple(_text(k) for k in fields.get("keys", [])))


def consumer_alive_say(client: redis.Redis, consumer: str) -> None:
    """A consumer says it is alive (every loop round): the larger cap holds while one is."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.zadd(CONSUMERS_KEY, {consumer: now})
    pipe.zremrangebyscore(CONSUMERS_KEY, "-inf", now - 10 * settings.QUEUE_CONSUMER_TIMEOUT_SECONDS)
    pipe.execute()


def consumer_gone_say(client: redis.Redis, consumer: str) -> None:
    client.zrem(CONSUMERS_KEY, consumer)


def consumers_alive(client: redis.Redis) -> bool:
    return client.zcount(CONSUMERS_KEY, time.time() - settings.QUEUE_CONSUMER_TIMEOUT_SECONDS, "+inf") > 0


def intake_cap(*, alive: bool) -> int:
    return settings.QUEUE_INTAKE_MAX_BYTES if alive else settings.QUEUE_INTAKE_UNREAD_BYTES


def gate_decide(*, was_writable: bool, used: int, cap: int) -> bool:
    """Whether the writer may XADD: an open gate closes at the cap, a closed one opens under
    REOPEN_FRACTION of it."""
    return used < cap if was_writable else used < cap * REOPEN_FRACTION


def streams_measure(client: redis.Redis, app_names: Sequence[str]) -> list[Measured]:
    """Each app's stream size and ACL user, in one round trip."""
    if not app_names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in app_names:
        pipe.memory_usage(intake_key(name), samples=0)  # every node (the module's docstring says why)
        pipe.execute_command("ACL", "GETUSER", acl_user(name))
    answers = pipe.execute()
    return [Measured(name, int(answers[2 * i] or 0), acl_state_parse(answers[2 * i + 1]))
            for i, name in enumerate(app_names)]


def queue_gates_enforce(*, client: redis.Redis, app_names: Sequence[str]) -> list[Gate]:
    """Measure every app's stream and give or take its writer's +xadd as gate_decide says. Only
    +xadd is touched (never a password: that is credentials.queue_acl_sync's, from Postgres), and
    only for users that exist. Safe from any number of processes at once: each sets what the same
    measurement says."""
    alive = consumers_alive(client)
    cap = intake_cap(alive=alive)
    gates = []
    pipe = client.pipeline(transaction=False)
    for m in streams_measure(client, app_names):
        if m.acl is None:
            continue
        writable = gate_decide(was_writable=m.acl.writable, used=m.used, cap=cap)
        changed = writable != m.acl.writable
        if changed:
            pipe.execute_command("ACL", "SETUSER", acl_user(m.app_name), WRITE if writable else "-xadd")
            if not writable:
                stats_add(pipe, m.app_name, **{"closed_full" if alive else "closed_unread": 1})
        gates.append(Gate(m.app_name, m.used, cap, writable, changed))
    if len(pipe):
        pipe.execute()
    return gates
