"""The Pusher door's figures on /metrics, per app (its app name), beside the native ones
(switchboard_connections{transport="pusher"} counts the node's Pusher connections of every app)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from foundation.metrics import REGISTRY

CONNECTIONS = Gauge("switchboard_pusher_connections", "Pusher connections open on this node, by app", ["app"],
                    registry=REGISTRY)
SUBSCRIPTIONS = Gauge("switchboard_pusher_subscriptions", "Channel subscriptions of Pusher connections on this node, "
                      "by app", ["app"], registry=REGISTRY)
PUBLISHED = Counter("switchboard_pusher_events_published_total",
                    "Pusher events published through this node, by app and source: api (the HTTP API, one per "
                    "channel) or client (client events)", ["app", "source"], registry=REGISTRY)
WRITTEN = Counter("switchboard_pusher_events_written_total", "Channel events written to Pusher connections on this "
                  "node, by app", ["app"], registry=REGISTRY)
MEMBERS = Counter("switchboard_pusher_members_total", "Presence members added and removed in the cluster, told by "
                  "this node (their first / last connection was here), by app and change", ["app", "change"],
                  registry=REGISTRY)
REFUSED = Counter("switchboard_pusher_refused_total", "Pusher frames and subscriptions refused, by app and reason",
                  ["app", "reason"], registry=REGISTRY)
