"""Settings of the Pusher protocol door (messaging.gateway.pusher, docs/protocol.md "Pusher protocol").

Read from the environment here and only here; web.py star-imports this module.
"""

from __future__ import annotations

from .env import env_float, env_int

# Told to clients in pusher:connection_established: a client silent this long sends pusher:ping. The
# server pings a connection silent this long itself, and closes it (4201) when no pong comes within
# PUSHER_PONG_TIMEOUT_SECONDS.
PUSHER_ACTIVITY_TIMEOUT_SECONDS = env_int("PUSHER_ACTIVITY_TIMEOUT_SECONDS", 120)
PUSHER_PONG_TIMEOUT_SECONDS = env_float("PUSHER_PONG_TIMEOUT_SECONDS", 30.0)
# An event's data (client events, and the HTTP API's events) may be at most this many bytes (Pusher's
# default: 10 KB); a frame from a client at most this plus PUSHER_FRAME_OVERHEAD_BYTES (its name,
# channel, a presence channel's channel_data).
PUSHER_MAX_EVENT_BYTES = env_int("PUSHER_MAX_EVENT_BYTES", 10 * 1024)
PUSHER_FRAME_OVERHEAD_BYTES = env_int("PUSHER_FRAME_OVERHEAD_BYTES", 6 * 1024)
# Client events one connection may send per second (Pusher's limit: 10), and in a burst.
PUSHER_CLIENT_EVENTS_PER_SECOND = env_float("PUSHER_CLIENT_EVENTS_PER_SECOND", 10.0)
PUSHER_CLIENT_EVENTS_BURST = env_int("PUSHER_CLIENT_EVENTS_BURST", 20)
# A connection whose client events are refused for the rate this many times in a row is closed (4301).
PUSHER_FLOOD_CLOSE_AFTER = env_int("PUSHER_FLOOD_CLOSE_AFTER", 100)
# Frames of any kind one connection may send per second (and in a burst) before they are refused
# (pusher:error 4301) unanswered otherwise.
PUSHER_FRAMES_PER_SECOND = env_float("PUSHER_FRAMES_PER_SECOND", 50.0)
PUSHER_FRAMES_BURST = env_int("PUSHER_FRAMES_BURST", 200)
# How long a cache channel's last event is sent to new subscribers (Pusher's: 30 minutes); older, or
# none: pusher:cache_miss.
PUSHER_CACHE_TTL_SECONDS = env_int("PUSHER_CACHE_TTL_SECONDS", 30 * 60)
# Channels one Pusher connection may be subscribed to.
PUSHER_MAX_CHANNELS = env_int("PUSHER_MAX_CHANNELS", 100)
# Pusher connections one web node holds per client address; beyond: 4100 (over capacity, the client
# reconnects after a backoff).
PUSHER_MAX_PER_ADDRESS = env_int("PUSHER_MAX_PER_ADDRESS", 2000)
# Pusher connections of one app the cluster holds (messaging.gateway.pusher.quota; the native door
# has no per-app connection cap, only maxConnectionsPerUser, which a Pusher connection has no user
# for); beyond: pusher:error and close 4004, the protocol's "over the app's connection quota"
# (pusher-js does not reconnect).
PUSHER_MAX_PER_APP = env_int("PUSHER_MAX_PER_APP", 20_000)
# A presence channel's members, counted by user (Pusher's limit: 100); the next user is refused.
PUSHER_MAX_PRESENCE_MEMBERS = env_int("PUSHER_MAX_PRESENCE_MEMBERS", 100)
# The HTTP API: how far an auth_timestamp may be from the server's clock.
PUSHER_API_TIMESTAMP_GRACE_SECONDS = env_int("PUSHER_API_TIMESTAMP_GRACE_SECONDS", 600)
# The console's Pusher figures (messaging.gateway.pusher.figures): a node's connection counts in Redis
# live this long unless its heartbeat (PRESENCE_HEARTBEAT_SECONDS) writes them again.
PUSHER_FIGURES_TTL_SECONDS = env_int("PUSHER_FIGURES_TTL_SECONDS", 30)
