"""Who is online at the other domains of the network, as this domain last heard (Redis).

Each domain tells its neighbours, every PRESENCE_GOSSIP_SECONDS, the online users of its apps and
what it heard of the other domains (messaging.federation.presence_gossip); a domain's list carries a
number its origin raised (the origin's clock in nanoseconds), so an older list heard by a longer
way never replaces a newer one. A list lives PRESENCE_REMOTE_TTL_SECONDS after the last newer one
arrived: a domain that stops telling (it is down, or cut off) has no users online here once that
passes, however its neighbours go on repeating what they heard. A user is admitted only at its home
domain, so it is online in at most one domain.

Keys, per app: `sb:rp:<app>:<domain>` the set of users, `sb:rpv:<app>:<domain>` the list's number
(both expiring together), `sb:rpd:<app>` the domains heard of.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundation.transport.redis_clients import async_client, sync_client


def _users_key(app_name: str, domain: str) -> str:
    return f"sb:rp:{app_name}:{domain}"


def _version_key(app_name: str, domain: str) -> str:
    return f"sb:rpv:{app_name}:{domain}"


def _domains_key(app_name: str) -> str:
    return f"sb:rpd:{app_name}"


# KEYS: users set, version key, domains set. ARGV: version, ttl, domain, users...
# -> {applied (0/1), arrived..., "|", left...}
_APPLY = """
local old = tonumber(redis.call('GET', KEYS[2]) or '-1')
local version = tonumber(ARGV[1])
if version <= old then return {0} end
local before = {}
for _, u in ipairs(redis.call('SMEMBERS', KEYS[1])) do before[u] = true end
local after = {}
for i = 4, #ARGV do after[ARGV[i]] = true end
local out = {1}
for u, _ in pairs(after) do if not before[u] then table.insert(out, u) end end
table.insert(out, '|')
for u, _ in pairs(before) do if not after[u] then table.insert(out, u) end end
redis.call('DEL', KEYS[1])
for i = 4, #ARGV, 5000 do
  redis.call('SADD', KEYS[1], unpack(ARGV, i, math.min(i + 4999, #ARGV)))
end
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ttl)
if #ARGV >= 4 then redis.call('EXPIRE', KEYS[1], ttl) end
redis.call('SADD', KEYS[3], ARGV[3])
return out
"""


@dataclass(frozen=True)
class Applied:
    applied: bool  # False: not newer than the list held
    arrived: list[str]
    left: list[str]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def remote_apply(*, app_name: str, domain: str, version: int, users: list[str], ttl: int) -> Applied:
    """Take `domain`'s list of online users of `app_name` if it is newer than the one held: who
    arrived and who left since the one held."""
    answer = sync_client().eval(_APPLY, 3, _users_key(app_name, domain), _version_key(app_name, domain),
                                _domains_key(app_name), version, ttl, domain, *users)
    if not int(answer[0]):
        return Applied(False, [], [])
    rest = [_text(v) for v in answer[1:]]
    cut = rest.index("|")
    return Applied(True, sorted(rest[:cut]), sorted(rest[cut + 1:]))


@dataclass(frozen=True)
class RemoteList:
    domain: str
    version: int
    users: list[str]


def _read(pipe, app_name: str, domains: list[str]) -> None:
    for domain in domains:
        pipe.get(_version_key(app_name, domain))
        pipe.smembers(_users_key(app_name, domain))


def _lists(domains: list[str], answers: list) -> tuple[list[RemoteList], list[str]]:
    """_read's answers: the lists alive, and the domains whose list has expired."""
    out, gone = [], []
    for i, domain in enumerate(domains):
        version, users = answers[2 * i], answers[2 * i + 1]
        if version is None:
            gone.append(domain)
        else:
            out.append(RemoteList(domain, int(version), sorted(_text(u) for u in users)))
    return out, gone


def remote_lists(app_name: str) -> list[RemoteList]:
    """Every other domain's list of `app_name`'s online users still alive here (their numbers, to
    pass on), in domain order; the expired ones are forgotten."""
    client = sync_client()
    domains = sorted(_text(d) for d in client.smembers(_domains_key(app_name)))
    if not domains:
        return []
    pipe = client.pipeline(transaction=False)
    _read(pipe, app_name, domains)
    out, gone = _lists(domains, pipe.execute())
    if gone:
        client.srem(_domains_key(app_name), *gone)
    return out


async def remote_online_async(app_name: str) -> list[str]:
    """Every user of `app_name` online at another domain, as heard here."""
    client = async_client()
    domains = sorted(_text(d) for d in await client.smembers(_domains_key(app_name)))
    if not domains:
        return []
    pipe = client.pipeline(transaction=False)
    _read(pipe, app_name, domains)
    lists, _ = _lists(domains, await pipe.execute())
    return sorted({u for heard in lists for u in heard.users})


async def remote_is_online(app_name: str, domain: str, user_id: str) -> bool:
    """Whether `domain`'s list (alive here) has `user_id` online."""
    pipe = async_client().pipeline(transaction=False)
    pipe.exists(_version_key(app_name, domain))
    pipe.sismember(_users_key(app_name, domain), user_id)
    alive, member = await pipe.execute()
    return bool(alive) and bool(member)


def remote_heard_of(app_name: str, domain: str) -> bool:
    """Whether `domain`'s list of `app_name`'s users is alive here."""
    return bool(sync_client().exists(_version_key(app_name, domain)))


def remote_online_sync(app_name: str, domain: str, user_id: str) -> bool:
    pipe = sync_client().pipeline(transaction=False)
    pipe.exists(_version_key(app_name, domain))
    pipe.sismember(_users_key(app_name, domain), user_id)
    alive, member = pipe.execute()
    return bool(alive) and bool(member)
