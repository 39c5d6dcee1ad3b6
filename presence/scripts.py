"""The presence cache's Lua scripts (presence.cache says what each key holds and why the scripts
are atomic). Each script keeps the app index `sb:a:<appName>:online` in the same step as the user
hashes, so the index lists exactly the users holding a connection somewhere in the cluster.
"""

# The app index's key of a user id, computed in the scripts (like the user hashes: fine on a single
# Redis, a Redis Cluster would need hash tags). nil for an id that is no `<appName>-<digits>`.
INDEX = """
local function app_index(user)
  local app = string.match(user, '^(.+)%-%d+$')
  if app then return 'sb:a:' .. app .. ':online' end
  return nil
end
local function index_add(user)
  local key = app_index(user)
  if key then redis.call('ZADD', key, 0, user) end
end
local function index_remove_if_gone(user)
  if redis.call('EXISTS', 'sb:u:' .. user) == 0 then
    local key = app_index(user)
    if key then redis.call('ZREM', key, user) end
  end
end
"""

# KEYS: user hash, node hash, tombstone. ARGV: channel, value, user, limit.
# -> {added, count}, {-1} (node declared dead) or {-2, count} (the user has `limit` connections).
CONNECT = INDEX + """
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1, 0} end
local count = redis.call('HLEN', KEYS[1])
if count >= tonumber(ARGV[4]) and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return {-2, count} end
local added = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
index_add(ARGV[3])
return {added, redis.call('HLEN', KEYS[1])}
"""
# KEYS: user hash, node hash, node's removed set. ARGV: channel, the removed set's ttl. -> {removed, count}
# The user's id is the user hash's key past 'sb:u:' (the Python signature stays as it was).
# The channel is noted in the node's removed set: a heartbeat whose snapshot of the node's
# connections was taken before this removal must not put it back (HEARTBEAT).
DISCONNECT = INDEX + """
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[2]))
local count = redis.call('HLEN', KEYS[1])
if count == 0 then index_remove_if_gone(string.sub(KEYS[1], 6)) end
return {removed, count}
"""
# KEYS: node hash, alive key, tombstone, suspect set, removed set. ARGV: ttl, node id, then triples
# channel, user, acks. -> {-1} when the node was declared dead, else {1, user whose last connection
# went, ...}. A held channel in the removed set was removed after the node's snapshot (its
# connection ended while this beat was on its way): it is not put back, or the user would stay
# online as a ghost and its next connection would not be announced as its first.
# User hashes are computed keys: fine on a single Redis (the deployment this project supports);
# a Redis Cluster would need hash tags.
HEARTBEAT = INDEX + """
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1} end
redis.call('SET', KEYS[2], '1', 'EX', tonumber(ARGV[1]))
local node = ARGV[2]
local held = {}
for i = 3, #ARGV, 3 do held[ARGV[i]] = true end
local gone = {1}
local suspects = {}
local stored = redis.call('HGETALL', KEYS[1])
for i = 1, #stored, 2 do
  local channel, user = stored[i], stored[i + 1]
  if not held[channel] then
    if redis.call('SISMEMBER', KEYS[4], channel) == 1 then
      local ukey = 'sb:u:' .. user
      local removed = redis.call('HDEL', ukey, channel)
      redis.call('HDEL', KEYS[1], channel)
      if removed == 1 and redis.call('HLEN', ukey) == 0 then table.insert(gone, user) end
      index_remove_if_gone(user)
    else
      table.insert(suspects, channel)
    end
  end
end
redis.call('DEL', KEYS[4])
for _, channel in ipairs(suspects) do redis.call('SADD', KEYS[4], channel) end
for i = 3, #ARGV, 3 do
  if redis.call('SISMEMBER', KEYS[5], ARGV[i]) == 0 then
    redis.call('HSET', 'sb:u:' .. ARGV[i + 1], ARGV[i], node .. '|' .. ARGV[i + 2])
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    index_add(ARGV[i + 1])
  end
end
redis.call('DEL', KEYS[5])
return gone
"""
# KEYS: node hash, tombstone, alive key, registrations set. ARGV: tombstone ttl, node id
# -> flat list channel, user, was-last (0/1).
FORGET_NODE = INDEX + """
redis.call('SET', KEYS[2], '1', 'EX', tonumber(ARGV[1]))
redis.call('DEL', KEYS[3])
for _, key in ipairs(redis.call('SMEMBERS', KEYS[4])) do redis.call('HDEL', key, ARGV[2]) end
redis.call('DEL', KEYS[4])
local out = {}
local stored = redis.call('HGETALL', KEYS[1])
for i = 1, #stored, 2 do
  local channel, user = stored[i], stored[i + 1]
  local ukey = 'sb:u:' .. user
  local removed = redis.call('HDEL', ukey, channel)
  local last = 0
  if removed == 1 and redis.call('HLEN', ukey) == 0 then last = 1 end
  index_remove_if_gone(user)
  table.insert(out, channel); table.insert(out, user); table.insert(out, last)
end
redis.call('DEL', KEYS[1])
return out
"""

# KEYS: node hash, tombstone, suspect set, registrations set. ARGV: node id
# -> users whose last connection in the cluster was one of the node's earlier life.
REVIVE = INDEX + """
for _, key in ipairs(redis.call('SMEMBERS', KEYS[4])) do redis.call('HDEL', key, ARGV[1]) end
local gone = {}
local stored = redis.call('HGETALL', KEYS[1])
for i = 1, #stored, 2 do
  local ukey = 'sb:u:' .. stored[i + 1]
  if redis.call('HDEL', ukey, stored[i]) == 1 and redis.call('HLEN', ukey) == 0 then
    table.insert(gone, stored[i + 1])
  end
  index_remove_if_gone(stored[i + 1])
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return gone
"""
