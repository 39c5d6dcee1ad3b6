"""The Redis presence cache: who is connected, on which channel of which node.

Keys:
- `sb:u:<userId>`: hash, field = channel name, value = "<node>|<acks 0/1>": the user's connections
  anywhere in the cluster (what routing reads).
- `sb:n:<node>:conns`: hash, field = channel name, value = user id: what one node holds.
- `sb:n:<node>:alive`: a key with a TTL, refreshed by the node's heartbeat.
- `sb:n:<node>:dead`: the tombstone the reaper leaves when it declares a node dead.
- `sb:n:<node>:suspect`: channels the last heartbeat found in the cache but not on the node.
- `sb:n:<node>:regs`: other hashes in which the node holds a field named after itself (the channel
  registry of messaging.channels, say); when the node is declared dead its field goes from each.
- `sb:a:<appName>:online`: sorted set (every score 0, so ordered by user id, byte-wise) of the app's
  users that hold at least one connection: the app's index, what a master's snapshot and the REST
  list of online users read. The scripts below keep it in the same step as the user hashes (a user
  enters it with its hash's first field and leaves it with the last), so it is exact whenever they
  are; the app name is the user id's part before its last '-' (`<appName>-<digits>`). The
  heartbeat re-adds every user it re-asserts, so an index that is missing users (a cluster upgraded
  while users were connected, an emptied Redis) is whole again within one heartbeat of every node.

Adding and removing a connection are Lua scripts, so "was this the user's first / last connection
in the cluster?" is answered atomically: two nodes connecting (or a node and the reaper
disconnecting) the same user at once cannot both announce.

The cache is rebuilt, not trusted. Every heartbeat reconciles the node's whole set in one script:
what the node holds is re-asserted (an emptied, restarted Redis is whole again within one
heartbeat), and entries the node no longer holds are removed (a disconnect whose Redis call failed
leaves no ghost; the users whose last connection that was are returned so the master hears
USER_DISCONNECTED). An entry is removed only when two heartbeats in a row found it missing on the
node: a connection registered between the node's snapshot and the script's run is not mistaken
for a ghost. A node with a tombstone is told so instead of re-adding its sockets behind the
reaper's back.

A user may hold at most the app's `max_connections_per_user` connections in the cluster: the
connect script refuses the next one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from redis.exceptions import NoScriptError

from foundation.transport.redis_clients import async_client, sync_client

from . import scripts

USER_KEY = "sb:u:{user_id}"
NODE_CONNS_KEY = "sb:n:{node_id}:conns"
NODE_ALIVE_KEY = "sb:n:{node_id}:alive"
NODE_DEAD_KEY = "sb:n:{node_id}:dead"
NODE_SUSPECT_KEY = "sb:n:{node_id}:suspect"
# Channels removed since the node's last heartbeat (scripts.DISCONNECT, HEARTBEAT); kept at most this
# long when no heartbeat comes to empty it (a node that died).
NODE_REMOVED_KEY = "sb:n:{node_id}:removed"
REMOVED_TTL_SECONDS = 3600
NODE_REGS_KEY = "sb:n:{node_id}:regs"
APP_ONLINE_KEY = "sb:a:{app_name}:online"
TOMBSTONE_SECONDS = 24 * 3600

class NodeDeclaredDead(Exception):
    """The reaper declared this node dead while it was silent: its sockets must go."""


class TooManyConnections(Exception):
    def __init__(self, user_id: str, limit: int):
        super().__init__(f"{user_id} already has {limit} connections")
        self.limit = limit


@dataclass(frozen=True)
class LiveConnection:
    channel_name: str
    node_id: str
    acks: bool
    session: str = ""  # the client's resumable session ("": none)


@dataclass(frozen=True)
class HeldConnection:
    """A connection as the node holding it knows it (heartbeat input)."""

    channel_name: str
    user_id: str
    acks: bool
    session: str = ""


def user_key(user_id: str) -> str:
    return USER_KEY.format(user_id=user_id)


def _node_keys(node_id: str) -> tuple[str, str, str]:
    return (NODE_CONNS_KEY.format(node_id=node_id), NODE_ALIVE_KEY.format(node_id=node_id),
            NODE_DEAD_KEY.format(node_id=node_id))


def _suspect_key(node_id: str) -> str:
    return NODE_SUSPECT_KEY.format(node_id=node_id)


def _removed_key(node_id: str) -> str:
    return NODE_REMOVED_KEY.format(node_id=node_id)


def node_registrations_key(node_id: str) -> str:
    """Where a node lists the hashes it holds a field in (dropped with it when it dies)."""
    return NODE_REGS_KEY.format(node_id=node_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# A connection's value in its user's hash: `<node>|<acks 0/1>`, or `<node>|<session>|<acks>` for one
# of a resumable session (the session before the flag: a reader of the older form still finds the
# flag last). Node ids and session ids hold no '|'.
def _decode(channel: bytes | str, value: bytes | str) -> LiveConnection:
    where, _, acks = _text(value).rpartition("|")
    node_id, _, session = where.partition("|")
    return LiveConnection(channel_name=_text(channel), node_id=node_id, acks=acks == "1", session=session)


def _flag(acks: bool, session: str) -> str:
    """The value's part after `<node>|` (the heartbeat script joins them)."""
    return f"{session}|{1 if acks else 0}" if session else f"{1 if acks else 0}"


def _value(node_id: str, acks: bool, session: str = "") -> str:
    return f"{node_id}|{_flag(acks, session)}"


# --- async (web nodes) ---------------------------------------------------------------------------


async def connection_add(*, user_id: str, channel_name: str, node_id: str, acks: bool, limit: int) -> bool:
    """Register a connection; True when it is the user's first in the cluster.

    Raises TooManyConnections when the user already holds `limit` connections, and NodeDeclaredDead
    when this node carries the reaper's tombstone.
    """
    conns, _, dead = _node_keys(node_id)
    added, count = await async_client().eval(scripts.CONNECT, 3, user_key(user_id), conns, dead, channel_name,
                                             _value(node_id, acks), user_id, limit)
    if int(added) == -1:
        raise NodeDeclaredDead(node_id)
    if int(added) == -2:
        raise TooManyConnections(user_id, limit)
    return bool(added) and int(count) == 1


async def connection_remove(*, user_id: str, channel_name: str, node_id: str) -> bool:
    """Forget a connection; True when it was the user's last one in the cluster."""
    conns, _, _ = _node_keys(node_id)
    removed, count = await async_client().eval(scripts.DISCONNECT, 3, user_key(user_id), conns, _removed_key(node_id),
                                               channel_name, REMOVED_TTL_SECONDS)
    return bool(removed) and int(count) == 0


@dataclass(frozen=True)
class ConnectionEntry:
    """One connection to add or remove in a batch (connections_add / connections_remove)."""

    user_id: str
    channel_name: str
    node_id: str
    acks: bool = False
    limit: int = 0  # adding: the app's max_connections_per_user
    session: str = ""  # the client's resumable session


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


async def _evalsha_many(script: str, calls: Sequence[tuple[int, list]]) -> list:
    """Run `script` once per (numkeys, keys + args) call, all in one pipeline (one round trip);
    each call's result or exception, in order. The script is loaded once where Redis lacks it
    (first use, or a Redis restarted empty)."""
    client, sha = async_client(), _sha(script)
    results: list = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            numkeys, keys_and_args = calls[i]
            pipe.evalsha(sha, numkeys, *keys_and_args)
        answers = await pipe.execute(raise_on_error=False)
        missing = []
        for i, answer in zip(todo, answers, strict=True):
            if isinstance(answer, NoScriptError) and attempt == 0:
                missing.append(i)
            else:
                results[i] = answer
        if not missing:
            break
        await client.script_load(script)
        todo = missing
    return results


async def connections_add(*, entries: Sequence[ConnectionEntry]) -> list[bool | Exception]:
    """connection_add for many connections in one round trip (the same script, run once per entry,
    so each entry's first-connection answer is as atomic as connection_add's). Per entry: True when
    it is the user's first connection in the cluster, else False, or the exception connection_add
    would have raised (TooManyConnections, NodeDeclaredDead, a Redis error)."""
    calls = []
    for e in entries:
        conns, _, dead = _node_keys(e.node_id)
        calls.append((3, [user_key(e.user_id), conns, dead, e.channel_name, _value(e.node_id, e.acks, e.session), e.user_id,
                          e.limit]))
    out: list[bool | Exception] = []
    for e, answer in zip(entries, await _evalsha_many(scripts.CONNECT, calls), strict=True):
        if isinstance(answer, Exception):
            out.append(answer)
            continue
        added, count = answer
        if int(added) == -1:
            out.append(NodeDeclaredDead(e.node_id))
        elif int(added) == -2:
            out.append(TooManyConnections(e.user_id, e.limit))
        else:
            out.append(bool(added) and int(count) == 1)
    return out


async def connections_remove(*, entries: Sequence[ConnectionEntry]) -> list[bool | Exception]:
    """connection_remove for many connections in one round trip. Per entry: True when it was the
    user's last connection in the cluster, else False, or the Redis error."""
    calls = [(3, [user_key(e.user_id), _node_keys(e.node_id)[0], _removed_key(e.node_id), e.channel_name,
                  REMOVED_TTL_SECONDS]) for e in entries]
    out: list[bool | Exception] = []
    for answer in await _evalsha_many(scripts.DISCONNECT, calls):
        if isinstance(answer, Exception):
            out.append(answer)
        else:
            removed, count = answer
            out.append(bool(removed) and int(count) == 0)
    return out


async def connections_of(user_id: str) -> list[LiveConnection]:
    raw = await async_client().hgetall(user_key(user_id))
    return [_decode(c, v) for c, v in raw.items()]


async def connections_of_many_async(user_ids: Iterable[str]) -> dict[str, list[LiveConnection]]:
    users = list(dict.fromkeys(user_ids))
    pipe = async_client().pipeline(transaction=False)
    for user_id in users:
        pipe.hgetall(user_key(user_id))
    results = await pipe.execute()
    return {u: [_decode(c, v) for c, v in raw.items()] for u, raw in zip(users, results, strict=True)}


async def node_heartbeat(*, node_id: str, ttl: int, held: Iterable[HeldConnection]) -> list[str]:
    """Mark the node alive and make the cache hold exactly `held` for it.

    Returns the users whose last connection in the cluster was a stale entry that is now gone.
    Raises NodeDeclaredDead when the reaper declared this node dead.
    """
    conns, alive, dead = _node_keys(node_id)
    args: list[str | int] = [ttl, node_id]
    for conn in held:
        args.extend((conn.channel_name, conn.user_id, _flag(conn.acks, conn.session)))
    result = await async_client().eval(scripts.HEARTBEAT, 5, conns, alive, dead, _suspect_key(node_id),
                                       _removed_key(node_id), *args)
    if int(result[0]) == -1:
        raise NodeDeclaredDead(node_id)
    return [_text(u) for u in result[1:]]


async def node_revive(*, node_id: str) -> list[str]:
    """A node starting afresh under its id: no tombstone, no connections from an earlier life.

    Connections the earlier life left in the cache (it died between registering a connection and
    opening its session row, so the restart's cleanup found no session to end) leave the users'
    hashes and the app index too; returns the users whose last connection that was.
    """
    conns, _, dead = _node_keys(node_id)
    gone = await async_client().eval(scripts.REVIVE, 4, conns, dead, _suspect_key(node_id), node_registrations_key(node_id),
                                     node_id)
    return [_text(u) for u in gone]


# --- sync (workers, maintenance, admin) ----------------------------------------------------------


def connections_of_many(user_ids: Iterable[str]) -> dict[str, list[LiveConnection]]:
    users = list(dict.fromkeys(user_ids))
    pipe = sync_client().pipeline(transaction=False)
    for user_id in users:
        pipe.hgetall(user_key(user_id))
    return {u: [_decode(c, v) for c, v in raw.items()] for u, raw in zip(users, pipe.execute(), strict=True)}


@dataclass(frozen=True)
class ForgottenConnection:
    channel_name: str
    user_id: str
    was_last: bool  # the user has no connection left anywhere


def node_forget(*, node_id: str) -> list[ForgottenConnection]:
    """The reaper's half in Redis: tombstone the node and drop every connection it held."""
    conns, alive, dead = _node_keys(node_id)
    sync_client().delete(_suspect_key(node_id))
    flat = sync_client().eval(scripts.FORGET_NODE, 4, conns, dead, alive, node_registrations_key(node_id),
                              TOMBSTONE_SECONDS, node_id)
    return [ForgottenConnection(_text(flat[i]), _text(flat[i + 1]), int(flat[i + 2]) == 1)
            for i in range(0, len(flat), 3)]


def connection_remove_sync(*, user_id: str, channel_name: str, node_id: str) -> bool:
    conns, _, _ = _node_keys(node_id)
    removed, count = sync_client().eval(scripts.DISCONNECT, 3, user_key(user_id), conns, _removed_key(node_id),
                                        channel_name, REMOVED_TTL_SECONDS)
    return bool(removed) and int(count) == 0


def node_is_alive(node_id: str) -> bool:
    _, alive, _ = _node_keys(node_id)
    return bool(sync_client().exists(alive))


def users_online(user_ids: Iterable[str]) -> dict[str, bool]:
    pipe = sync_client().pipeline(transaction=False)
    users = list(dict.fromkeys(user_ids))
    for user_id in users:
        pipe.exists(user_key(user_id))
    return {u: bool(n) for u, n in zip(users, pipe.execute(), strict=True)}
