"""The figures a web node counts as it serves (its connections, frames, deliveries written, channel
streams): Prometheus counters and gauges in the node's own registry (foundation.metrics), each node
scraped on its own at /metrics (messaging.gateway.scrape, which adds the figures read at scrape time).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from foundation.metrics import REGISTRY

CONNECTIONS = Gauge("switchboard_ws_connections", "Authenticated WebSocket connections on this node",
                    registry=REGISTRY)
FRAMES = Counter("switchboard_ws_frames_received_total", "Client frames received, by type", ["type"],
                 registry=REGISTRY)
REFUSED = Counter("switchboard_ws_frames_refused_total", "Frames answered with INVALID_MESSAGE or GENERAL_ERROR",
                  ["answer"], registry=REGISTRY)
AUTH = Counter("switchboard_ws_auth_total", "AUTH_CLIENT outcomes", ["result"], registry=REGISTRY)
SOCKETIO_CONNECTS = Counter("switchboard_socketio_connects_total", "Socket.IO CONNECT outcomes (admitted, refused)",
                            ["result"], registry=REGISTRY)
SOCKETIO_LIMITED = Counter("switchboard_socketio_limited_total",
                           "Engine.IO requests refused and sessions ended by a bound (docs/security.md, Socket.IO)",
                           ["bound"], registry=REGISTRY)
WRITTEN = Counter("switchboard_deliveries_written_total", "Stored messages written to sockets on this node",
                  registry=REGISTRY)
DELIVERY_LATENCY = Histogram(
    "switchboard_delivery_latency_seconds", "From a RELIABLE message being stored to its frame being written",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
    registry=REGISTRY,
)
INTAKE_REFUSED = Counter("switchboard_intake_refused_total",
                         "Sends refused because the node's intake was full (the database fell behind)",
                         registry=REGISTRY)
LIMITED = Counter("switchboard_ws_limited_total", "Frames refused by a rate or work limit, by limit", ["limit"],
                  registry=REGISTRY)
PRESENCE_STALE = Counter("switchboard_presence_stale_total",
                         "Presence announcements not written to a master: no longer true when they arrived",
                         registry=REGISTRY)
PRESENCE_RESYNCED = Counter("switchboard_presence_resynced_total",
                            "Notices written to a master by its periodic re-check: announcements lost on the way",
                            registry=REGISTRY)


TRANSPORT_CONNECTIONS = Gauge("switchboard_connections", "Open connections on this node, by transport", ["transport"],
                              registry=REGISTRY)
STREAM_CLOSED = Counter("switchboard_stream_closed_total", "Channel streams ended by the server, by transport and reason",
                        ["transport", "reason"], registry=REGISTRY)
STREAM_REFUSED = Counter("switchboard_stream_refused_total",
                         "Channel streams refused at a cap (per client address or per app), by transport and cap",
                         ["transport", "cap"], registry=REGISTRY)
STREAM_REPLAY_CUT = Counter("switchboard_stream_replay_cut_total",
                            "Channel replays cut to the newest STREAM_REPLAY_MAX messages, by transport",
                            ["transport"], registry=REGISTRY)
CHANNEL_OCCUPANCY = Counter("switchboard_channel_occupancy_total",
                            "Channels that got their first reader (occupied) or lost their last (vacated)",
                            ["change"], registry=REGISTRY)
CHANNEL_MESSAGES = Counter("switchboard_channel_messages_written_total",
                           "Channel messages written to readers on this node, by transport", ["transport"],
                           registry=REGISTRY)
