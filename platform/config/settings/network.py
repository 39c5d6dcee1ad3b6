"""Settings of the domain network (issue 18): forwarding between domains, link health, the meta role.

Read from the environment here and only here; base.py imports the names and merges
NETWORK_BEAT_SCHEDULE into the beat schedule.
"""

from __future__ import annotations

from .env import env_float, env_int, env_str

# --- forwarding between domains (messaging.federation) ---------------------------------------------
# A forwarding call (the next hop stores before it answers) must answer within this many seconds,
# for the whole exchange: a neighbour that answers one byte a second is cut off at this deadline.
FORWARD_TIMEOUT_SECONDS = env_float("FORWARD_TIMEOUT_SECONDS", 5.0)
# A signed internal call whose timestamp is further than this from the receiver's clock is refused;
# its nonce is remembered (Redis) at least this long, so a replay inside the window is refused too.
FORWARD_MAX_SKEW_SECONDS = env_int("FORWARD_MAX_SKEW_SECONDS", 300)
# How many domains a message may pass through after its origin before it is refused (and dead-lettered).
FORWARD_HOP_LIMIT = env_int("FORWARD_HOP_LIMIT", 10)
# Deliveries (or channel publishes, or receipts) per forwarding call, and the most payload one call
# carries beyond its first item (a backlog of large messages goes in calls a neighbour accepts).
FORWARD_BATCH_SIZE = env_int("FORWARD_BATCH_SIZE", 500)
FORWARD_BATCH_BYTES = env_int("FORWARD_BATCH_BYTES", 1024 * 1024)
# A link's failed call is retried after base x 2^(failures-1) s, capped, with jitter.
FORWARD_RETRY_BASE_SECONDS = env_float("FORWARD_RETRY_BASE_SECONDS", 1.0)
FORWARD_RETRY_MAX_SECONDS = env_float("FORWARD_RETRY_MAX_SECONDS", 60.0)
# A link's sender task stops after this many seconds (and hands the rest to a new task): a long
# queue never holds a forwarding thread for longer than this and one call's deadline.
FORWARD_TASK_BUDGET_SECONDS = env_float("FORWARD_TASK_BUDGET_SECONDS", 20.0)
# Beat: forwarding queues whose retry is due are sent again (and a lost task is made up for).
FORWARD_SWEEP_SECONDS = env_float("FORWARD_SWEEP_SECONDS", 2.0)
# A neighbour that has not answered for longer than this is routed around where another path exists.
LINK_DOWN_AFTER_SECONDS = env_float("LINK_DOWN_AFTER_SECONDS", 15.0)
# A neighbour that said it has no way on to a domain (it refused an item for it, or handed one back)
# is passed over for that domain this long where another path exists; then it is tried again.
ROUTE_BLOCK_SECONDS = env_float("ROUTE_BLOCK_SECONDS", 30.0)
# A message that reaches its recipient's home before an earlier one from the same origin waits for it
# (messaging.federation.order) at most this long; then the earlier one is taken for lost on the way, and
# goes into the mailbox late if it ever comes. Longer than a domain on the way is usually away.
NETWORK_ORDER_WAIT_SECONDS = env_float("NETWORK_ORDER_WAIT_SECONDS", 60.0)
# Beat: the senders of the live copy to standby domains are woken this often (messaging.federation.standby.copy):
# the copy's lag under normal load is about this long plus one call.
STANDBY_COPY_SECONDS = env_float("STANDBY_COPY_SECONDS", 1.0)
# A standby takes its home's users over (messaging.federation.takeover.take) once the home has been silent
# and its link down this long, and a third domain agrees; beat looks every TAKEOVER_WATCH_SECONDS.
FAILOVER_SECONDS = env_float("FAILOVER_SECONDS", 30.0)
TAKEOVER_WATCH_SECONDS = env_float("TAKEOVER_WATCH_SECONDS", 2.0)
# A takeover's epoch is its writer's clock in microseconds; a record a neighbour tells whose epoch is
# further ahead of this domain's clock than this is refused (it would beat every genuine record of
# that home until then; 2^63-1 for ever), and a stored row that far ahead counts as no epoch.
TAKEOVER_EPOCH_MAX_AHEAD_SECONDS = env_float("TAKEOVER_EPOCH_MAX_AHEAD_SECONDS", 300.0)
# A hand-back first stops admitting the users at the holder and closes their connections, this long
# before it gives their mailboxes up (every web node has seen it, and their last ACKs are read).
HAND_BACK_GRACE_SECONDS = env_float("HAND_BACK_GRACE_SECONDS", 3.0)
# Beat: every neighbour is told who of this domain's apps' users is online (and what this domain heard
# of the others) this often; a domain not heard of for PRESENCE_REMOTE_TTL_SECONDS has nobody online.
PRESENCE_GOSSIP_SECONDS = env_float("PRESENCE_GOSSIP_SECONDS", 2.0)
PRESENCE_REMOTE_TTL_SECONDS = env_float("PRESENCE_REMOTE_TTL_SECONDS", 20.0)
# Beat: every neighbour is probed this often (a signed ping), so a link's state is live without traffic.
LINK_PROBE_SECONDS = env_float("LINK_PROBE_SECONDS", 5.0)
# A probe not answered within this many seconds counts as a failure (probes run in parallel).
LINK_PROBE_TIMEOUT_SECONDS = env_float("LINK_PROBE_TIMEOUT_SECONDS", 3.0)

# --- the meta role (apps_registry.meta) ---------------------------------------------------------
# Set on a domain that takes its configuration from another domain's signed export endpoint: that
# domain's base URL (http://host:port). Empty: this domain's own admin is its configuration.
META_URL = env_str("META_URL", "")
# The secret every domain of the network shares with its meta domain (signs the pull and the export).
META_SECRET = env_str("META_SECRET", "")
META_PULL_SECONDS = env_float("META_PULL_SECONDS", 30.0)
# How long a link's replaced secret stays valid after a change (both ends sign with both and accept
# either): longer than the two ends can be apart, a pull interval and a pull that fails a few times.
LINK_SECRET_OVERLAP_SECONDS = env_float("LINK_SECRET_OVERLAP_SECONDS", 900.0)

NETWORK_BEAT_SCHEDULE: dict[str, dict] = {
    # Every neighbour pinged: each link's state is live without traffic (messaging.federation.wire.probes).
    "probe-links": {"task": "messaging.tasks.probe_links", "schedule": LINK_PROBE_SECONDS},
    # Links with channel publishes waiting and their retry due get their sender woken (the flood).
    "flood-sweep": {"task": "messaging.tasks.flood_sweep", "schedule": FORWARD_SWEEP_SECONDS},
    # Links whose retry is due are sent again, a lost sender task is made up for, and the queues of
    # links that are down move to another path where one exists (messaging.federation.senders.queue).
    "forward-sweep": {"task": "messaging.tasks.forward_sweep", "schedule": FORWARD_SWEEP_SECONDS},
    # The live copy of the mailboxes of users with a standby domain, sent (messaging.federation.standby.copy).
    "standby-sweep": {"task": "messaging.tasks.standby_sweep", "schedule": STANDBY_COPY_SECONDS,
                      "options": {"expires": STANDBY_COPY_SECONDS}},
    # (The gossip round, PRESENCE_GOSSIP_SECONDS, and the takeover watch, TAKEOVER_WATCH_SECONDS, are
    # no beat tasks: the outbound worker runs them on threads of their own, messaging.federation.control_loop.)
}
if META_URL:
    # A pull that waited longer than its period is worthless: the next one is already due.
    NETWORK_BEAT_SCHEDULE["meta-pull"] = {"task": "apps_registry.tasks.meta_pull", "schedule": META_PULL_SECONDS,
                                          "options": {"expires": META_PULL_SECONDS}}
# Merged into CELERY_TASK_ROUTES (base.py). Everything that waits on a neighbour (the link senders,
# FAST hops, probes, the meta pull) is on queue "forwarding" (foundation.handoff.FORWARDING_QUEUE),
# served by the outbound worker (`-Q webhooks,forwarding`), never by the routing worker's threads.
NETWORK_TASK_ROUTES: dict[str, dict] = {
    "messaging.tasks.flood_link": {"queue": "forwarding"},
    "messaging.tasks.forward_link": {"queue": "forwarding"},
    "messaging.tasks.forward_receipts": {"queue": "forwarding"},
    "messaging.tasks.standby_copy": {"queue": "forwarding"},
    "messaging.tasks.standby_sweep": {"queue": "forwarding"},
    "messaging.tasks.forward_fast": {"queue": "forwarding"},
    "messaging.tasks.probe_links": {"queue": "forwarding"},
    "messaging.tasks.gossip_presence": {"queue": "forwarding"},
    "messaging.tasks.takeover_watch": {"queue": "forwarding"},
    "messaging.tasks.takeover_given_back": {"queue": "forwarding"},
    "apps_registry.tasks.meta_pull": {"queue": "forwarding"},
}

from .exchange import *  # noqa: E402, F403  (issue 19's settings, in their own module)
from .queues import *  # noqa: E402, F403  (issue 29's queue intake: QUEUE_BEAT_SCHEDULE, QUEUE_TASK_ROUTES)
from .requests import *  # noqa: E402, F403  (requests to the apps' servers: REQUESTS_BEAT_SCHEDULE)
