"""Settings shared by every environment. Environment variables are read here and only here.

Leaf modules (local, test, production) import this and call :func:`service_settings` with the
Postgres and Redis URLs they resolved; everything that depends on those URLs is built there.
"""

from __future__ import annotations

import socket
from pathlib import Path

from celery.schedules import crontab

from .env import database_from_url, database_options_set, env_bool, env_float, env_int, env_list, env_str, process_label
from .network import *  # noqa: F403  (the domain network's settings, and NETWORK_BEAT_SCHEDULE)
from .web import *  # noqa: F403  (request bodies and Socket.IO on the web nodes)

BASE_DIR = Path(__file__).resolve().parents[3]
VAR_DIR = Path(env_str("SWITCHBOARD_VAR_DIR", str(BASE_DIR / "var")))

# Recognised by the production system check (switchboard.E001): never deploy with it.
DEFAULT_SECRET_KEY = "insecure-switchboard-dev-key-do-not-use-in-production"
SECRET_KEY = env_str("SECRET_KEY", DEFAULT_SECRET_KEY)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# Proxies (addresses or networks) whose X-Forwarded-For / -Proto headers are believed; from anyone
# else those headers are ignored. The client is the rightmost X-Forwarded-For hop not in this list
# (foundation.forwarded, applied by foundation.patches.daphne).
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
# foundation.patches reaches into libraries' internals, so a process refuses to start on versions they were not
# tested with; on, it starts anyway, with a warning (DAPHNE_: daphne, autobahn, Twisted; the other: the rest).
DAPHNE_ALLOW_UNTESTED_VERSIONS = env_bool("DAPHNE_ALLOW_UNTESTED_VERSIONS", False)
ALLOW_UNTESTED_VERSIONS = env_bool("ALLOW_UNTESTED_VERSIONS", False)  # the variable analytics.jobs.patches reads
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- this node ---------------------------------------------------------------------------------
DOMAIN_NAME = env_str("DOMAIN_NAME", "domain-01")
PORT = env_int("PORT", 8000)
NODE_ID = env_str("NODE_ID", f"{socket.gethostname()}-{PORT}")

# --- Django ------------------------------------------------------------------------------------
INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "config.apps.PlatformConfig",  # the composition root: the switchboard.* system checks
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served from here: /api/docs/ needs no CDN
    "apps_registry",
    "messaging",
    "presence",
    "analytics",
]

MIDDLEWARE = [
    "foundation.http_metrics.request_latency_middleware",  # outermost: times everything below it
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE, TIME_ZONE = "en-us", "UTC"
USE_I18N = USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns about a missing root
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "admin:login"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "messaging.api.negotiation.JsonAlways",  # never a 406
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "messaging.api.errors.api_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchboard server API",
    "DESCRIPTION": (
        "Send from your server to your app's users and channels, manage subscriptions, see presence, read "
        "channel history, handle dead letters. Authenticate with an API key of your app "
        "(`Authorization: Bearer <key>`). Errors are `{\"error\": code, \"detail\": text}`. Sends take an "
        "`Idempotency-Key`. Each app has a rate limit (429 with `Retry-After`). Lists are cursor-paginated: "
        "follow `next` until it is null."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# One handler for every process (web, worker, beat: Celery is told not to install its own). A
# repeated failure logs once per kind and window with a count (foundation.logs.RepeatFilter). Nothing
# logs per message at the default level: Celery's "task received / succeeded" lines are warnings-only.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"repeats": {"()": "foundation.logs.RepeatFilter", "window": env_float("LOG_REPEAT_WINDOW", 10.0)}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["repeats"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"}, "httpx": {"level": "WARNING"},  # (a line per call)
    },
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Switchboard limits and tuning ---------------------------------------------------------------
# redis-py's asyncio pool raises "Too many connections" past max_connections (100 by default);
# hundreds of consumers each awaiting a channel-layer send must never hit that ceiling.
REDIS_MAX_CONNECTIONS = env_int("REDIS_MAX_CONNECTIONS", 2000)
DB_CONN_MAX_AGE = env_int("DB_CONN_MAX_AGE", 60)
# Per-message statements prepared once per connection (foundation.db); off behind a transaction-mode pooler.
DB_PREPARED_STATEMENTS = env_bool("DB_PREPARED_STATEMENTS", True)
# /metrics outside DEBUG: a scraper shows this token (Authorization: Bearer …) or comes from one of
# these addresses/networks; anyone else gets 403.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", ["127.0.0.1/32", "::1/128"])
# The /demo/ page (it shows the demo app's appId): on in local runs, off in production unless enabled.
DEMO_ENABLED = env_bool("DEMO_ENABLED", True)
# Admin login throttling (config.admin_login), per username *and* address, so nobody can lock an admin
# out from elsewhere: after ADMIN_LOGIN_FREE_FAILURES failures for one username from one address (or
# ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS from one address, whatever the username), each further failure
# makes that pair (that address) wait, ADMIN_LOGIN_BACKOFF_SECONDS at first, doubling with each failure
# up to ADMIN_LOGIN_BACKOFF_MAX_SECONDS. Failures are forgotten ADMIN_LOGIN_WINDOW_SECONDS after the last.
ADMIN_LOGIN_FREE_FAILURES = env_int("ADMIN_LOGIN_FREE_FAILURES", 3)
ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS = env_int("ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS", 20)
ADMIN_LOGIN_BACKOFF_SECONDS = env_float("ADMIN_LOGIN_BACKOFF_SECONDS", 2.0)
ADMIN_LOGIN_BACKOFF_MAX_SECONDS = env_float("ADMIN_LOGIN_BACKOFF_MAX_SECONDS", 900.0)
ADMIN_LOGIN_WINDOW_SECONDS = env_int("ADMIN_LOGIN_WINDOW_SECONDS", 86400)
ADMIN_USERNAME = env_str("ADMIN_USERNAME", "admin")
ADMIN_PASSWORD = env_str("ADMIN_PASSWORD", "")


CHANNEL_LAYER = env_str("CHANNEL_LAYER", "pubsub")


def channel_layer_settings(redis_url: str) -> dict:
    """channels-redis, pub/sub flavour by default.

    Every event Switchboard sends to a socket is either re-creatable from Postgres (stored
    messages: the retry sweep re-pushes what was not confirmed) or best effort by contract (FAST,
    presence notices). So the layer need not buffer for absent readers, and Redis pub/sub delivers
    without the core layer's per-message BZPOPMIN round trips, which were a fifth of a web node's
    CPU under load. CHANNEL_LAYER=core selects the buffered list-based layer instead.
    """
    # redis-py 8 reads with a 5 s socket timeout by default, exactly the BZPOPMIN timeout the
    # core layer uses: reads raced and killed consumers, hence the explicit 15 s.
    host = {"address": redis_url, "max_connections": REDIS_MAX_CONNECTIONS,
            "socket_timeout": 15, "socket_connect_timeout": 5}
    if CHANNEL_LAYER == "core":
        return {"BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"hosts": [host], "prefix": "sb-asgi", "capacity": 5000, "expiry": 30}}
    host["socket_timeout"] = None  # the subscriber connection blocks while nothing is published
    return {"BACKEND": "foundation.patches.channels_redis.SlimPubSubChannelLayer",  # channels-redis pub/sub, slimmer
            "CONFIG": {"hosts": [host], "prefix": "sb-asgi"}}


def service_settings(database_url: str, redis_url: str) -> dict:
    """Everything that depends on where Postgres and Redis are."""
    database = database_from_url(database_url)
    database["CONN_MAX_AGE"] = DB_CONN_MAX_AGE
    database["CONN_HEALTH_CHECKS"] = True
    database["OPTIONS"].setdefault("application_name", process_label(env_str("DB_APPLICATION_NAME", "switchboard")))
    database_options_set(database["OPTIONS"], prepared=DB_PREPARED_STATEMENTS, domain=DOMAIN_NAME)
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "DATABASES": {"default": database},
        "CACHES": {
            "default": {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": redis_url,
                "KEY_PREFIX": "sb-cache",
            }
        },
        "CHANNEL_LAYERS": {"default": channel_layer_settings(redis_url)},
        "CELERY_BROKER_URL": redis_url,
        "CELERY_RESULT_BACKEND": None,
    }

# --- messaging ---------------------------------------------------------------------------------
WS_AUTH_TIMEOUT = env_int("WS_AUTH_TIMEOUT", 15)  # seconds an unauthenticated socket may stay
WS_MAX_FRAME_BYTES = env_int("WS_MAX_FRAME_BYTES", 1024 * 1024)  # larger frames close with 1009
# Before AUTH_CLIENT a frame may be only this long (AUTH_CLIENT itself is a few hundred bytes): an
# anonymous client cannot make the node hold or parse large frames. Larger closes with 1009.
WS_PREAUTH_MAX_FRAME_BYTES = env_int("WS_PREAUTH_MAX_FRAME_BYTES", 4096)
WEB_DB_THREADS = env_int("WEB_DB_THREADS", 8)
# Listen backlog (capped by net.core.somaxconn) and seconds a WebSocket handshake may take once
# accepted: Twisted's 50 and daphne's 5 s sent a reconnect storm into TCP retransmits (issue 17).
WEB_LISTEN_BACKLOG = env_int("WEB_LISTEN_BACKLOG", 4096)
WS_HANDSHAKE_TIMEOUT = env_int("WS_HANDSHAKE_TIMEOUT", WS_AUTH_TIMEOUT)
# A pushed message not confirmed (written or ACKed) within this many seconds is retried.
DELIVERY_ACK_TIMEOUT = env_int("DELIVERY_ACK_TIMEOUT", 30)
RETRY_BASE_SECONDS = env_int("RETRY_BASE_SECONDS", 2)
RETRY_MAX_SECONDS = env_int("RETRY_MAX_SECONDS", 300)
RETRY_SWEEP_SECONDS = env_int("RETRY_SWEEP_SECONDS", 5)
# A delivery not routed this long after it was stored lost its routing task (a process crashed
# between commit and enqueue) or waits behind a long routing queue: the sweep hands it to routing.
ROUTING_DEADLINE_SECONDS = env_int("ROUTING_DEADLINE_SECONDS", 10)
# What the sweep hands to routing is leased for this long: it is not handed out again meanwhile.
ROUTING_LEASE_SECONDS = env_int("ROUTING_LEASE_SECONDS", 60)
# FETCH_MISSING_MESSAGES answers at most this much content per request (and at least one message).
FETCH_MAX_BYTES = env_int("FETCH_MAX_BYTES", 4 * 1024 * 1024)
# Group commit: what a node's connections send within this long is stored in one statement; at most
# this many sends may wait for the database before senders are told "server busy". 10 ms rather
# than 1 ms: at a few hundred messages a second a batch then holds three or four, not one (measured
# at 300 msg/s: about 0.4 ms less server CPU per message, for 8 ms of median latency). Under
# sustained load a node never waits this long: what arrives during one commit goes in the next.
INTAKE_LINGER_SECONDS = env_float("INTAKE_LINGER_SECONDS", 0.01)
INTAKE_MAX_PENDING = env_int("INTAKE_MAX_PENDING", 5000)
# Committed deliveries gather this long into one routing task (each task costs its worker, its node
# and the broker far more than routing one more delivery in it: 40 ms rather than 20 ms took about
# 0.4 ms of server CPU off each message at 300 msg/s, for 12 ms of median latency).
ROUTING_LINGER_SECONDS = env_float("ROUTING_LINGER_SECONDS", 0.04)
# "Delivered" marks (and confirmations) gather this long into one statement. Keep it short: until the
# mark commits, a client that ACKed and reconnects at once is sent the message again (measured: 50 ms
# saved little CPU and made that visible).
DELIVERED_LINGER_SECONDS = env_float("DELIVERED_LINGER_SECONDS", 0.002)
# Per connection: bytes queued for a socket beyond which the reader is too slow (close 4002), frames
# received but not yet handled beyond which the sender floods (close 4003), and how many
# ACK-mode messages may be in flight (sent, not yet ACKed) before further pushes wait in the mailbox.
WS_MAX_OUTGOING_BYTES = env_int("WS_MAX_OUTGOING_BYTES", 8 * 1024 * 1024)
WS_MAX_QUEUED_FRAMES = env_int("WS_MAX_QUEUED_FRAMES", 500)
WS_MAX_QUEUED_BYTES = env_int("WS_MAX_QUEUED_BYTES", 4 * 1024 * 1024)  # the same, in bytes received (close 4003)
WS_ACK_WINDOW = env_int("WS_ACK_WINDOW", 1000)
WS_MAX_CHANNELS = env_int("WS_MAX_CHANNELS", 100)  # channels one connection may read
# SIGTERM drains a web node (messaging.gateway.drain): /readyz 503, no new sockets, each closed (1012) at a random
# moment of DRAIN_SECONDS (ACK mode: after DRAIN_ACK_WAIT_SECONDS, half the grace at most, for its ACKs); cut after the grace.
DRAIN_SECONDS, DRAIN_GRACE_SECONDS = env_float("DRAIN_SECONDS", 10.0), env_float("DRAIN_GRACE_SECONDS", 5.0)
DRAIN_ACK_WAIT_SECONDS = env_float("DRAIN_ACK_WAIT_SECONDS", 5.0)
# --- push-compatible channel streams (the push seed's settings and defaults) ---------------------
PUSH_HEARTBEAT_SECONDS = env_float("PUSH_HEARTBEAT_SECONDS", 30.0)  # heartbeat (SSE) / ping (WS) interval
PUSH_CLIENT_GRACE_SECONDS = env_float("PUSH_CLIENT_GRACE_SECONDS", 4.0)  # pong deadline; reconnect notice lead
PUSH_RECONNECT_DITHER_MIN_SECONDS = env_float("PUSH_RECONNECT_DITHER_MIN_SECONDS", 120.0)  # connection lifetime
PUSH_RECONNECT_DITHER_MAX_SECONDS = env_float("PUSH_RECONNECT_DITHER_MAX_SECONDS", 180.0)
PUSH_MAX_CHANNELS = env_int("PUSH_MAX_CHANNELS", 50)  # channels one stream may read
# A stream whose reader lets this much pile up on the node is closed (counted); it resumes with Last-Event-ID.
PUSH_MAX_BUFFER_BYTES = env_int("PUSH_MAX_BUFFER_BYTES", 1024 * 1024)
# Channel streams (SSE, stream sockets) per node per client address and per app, beyond which a stream
# is refused (SSE 429, socket 1013); a replay sends at most the newest STREAM_REPLAY_MAX of a channel.
STREAM_MAX_PER_ADDRESS = env_int("STREAM_MAX_PER_ADDRESS", 50)
STREAM_MAX_PER_APP = env_int("STREAM_MAX_PER_APP", 10_000)
STREAM_REPLAY_MAX = env_int("STREAM_REPLAY_MAX", 1000)
# --- the server REST API (messaging.api) -----------------------------------------------------------
# A verified API key is remembered per process this long: a revoked key stops working within it.
API_KEY_CACHE_SECONDS = env_float("API_KEY_CACHE_SECONDS", 5.0)
# How long an Idempotency-Key's answer is kept (the hourly expiry drops older keys).
API_IDEMPOTENCY_HOURS = env_int("API_IDEMPOTENCY_HOURS", 24)
# --- presence ----------------------------------------------------------------------------------
PRESENCE_HEARTBEAT_SECONDS = env_int("PRESENCE_HEARTBEAT_SECONDS", 5)
PRESENCE_NODE_TIMEOUT = env_int("PRESENCE_NODE_TIMEOUT", 20)  # no heartbeat for this long = dead node
PRESENCE_SNAPSHOT_PAGE = env_int("PRESENCE_SNAPSHOT_PAGE", 1000)  # users per ONLINE_USERS frame (master)
PRESENCE_MASTER_RESYNC_SECONDS = env_float("PRESENCE_MASTER_RESYNC_SECONDS", 10.0)  # presence.master_view
# --- analytics ---------------------------------------------------------------------------------
ANALYTICS_LAKE = env_str("ANALYTICS_LAKE", str(VAR_DIR / "lake"))  # a folder, or any URI pyarrow and Spark read
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
SPARK_DEFAULTS_FILE = BASE_DIR / "platform" / "spark-defaults.conf"
ANALYTICS_EXPORT_SECONDS = env_int("ANALYTICS_EXPORT_SECONDS", 300)
# Rows past their app's retention, once exported, are deleted every RETENTION_SWEEP_SECONDS in
# batches of RETENTION_BATCH_ROWS for at most RETENTION_BUDGET_SECONDS (analytics.services.retention).
RETENTION_SWEEP_SECONDS, RETENTION_BATCH_ROWS = env_int("RETENTION_SWEEP_SECONDS", 600), env_int("RETENTION_BATCH_ROWS", 5000)
RETENTION_BUDGET_SECONDS, RETENTION_ORPHAN_DAYS = env_float("RETENTION_BUDGET_SECONDS", 60.0), 30
# How long one day of retention_days lasts, for that sweep's cutoff only (nothing else reads it):
# a day, unless a test or a trial shortens it to watch rows come and go within minutes.
RETENTION_DAY_SECONDS = env_int("RETENTION_DAY_SECONDS", 86_400)
ANALYTICS_EXPORT_BATCH_ROWS = env_int("ANALYTICS_EXPORT_BATCH_ROWS", 100_000)  # rows per Parquet file at most
# How long an export waits for transactions older than its horizon (analytics.services.export).
ANALYTICS_EXPORT_HORIZON_WAIT = env_int("ANALYTICS_EXPORT_HORIZON_WAIT", 10)

# --- outgoing calls (webhooks, auth URLs: foundation.outgoing) ------------------------------------
# Networks tenants' URLs may reach besides the public internet (CIDRs). Loopback, link-local, private,
# cloud metadata and every other non-public address is refused unless listed here (a metadata
# address only when listed on its own, e.g. 169.254.169.254/32). Empty in production; under DEBUG
# (local runs) loopback and private networks. The leaf settings call this again once DEBUG is settled.
LOCAL_DEV_NETWORKS = ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"]


def outgoing_allowed_networks(debug: bool) -> list[str]:
    return env_list("OUTGOING_ALLOWED_NETWORKS", LOCAL_DEV_NETWORKS if debug else [])


OUTGOING_ALLOWED_NETWORKS = outgoing_allowed_networks(DEBUG)
# The auth URL: an app's own timeout, but never over this whole-exchange deadline; an answer over
# this size is refused; at most this many calls per app in flight on one web node, and a login that
# finds them all busy waits this long before it is refused ("auth service busy").
AUTH_URL_MAX_SECONDS = env_float("AUTH_URL_MAX_SECONDS", 5.0)
AUTH_URL_MAX_ANSWER_BYTES = env_int("AUTH_URL_MAX_ANSWER_BYTES", 16 * 1024)
AUTH_URL_APP_CONCURRENCY = env_int("AUTH_URL_APP_CONCURRENCY", 20)
AUTH_URL_QUEUE_SECONDS = env_float("AUTH_URL_QUEUE_SECONDS", 0.5)

# --- webhooks ----------------------------------------------------------------------------------
def webhooks_allow_http(debug: bool) -> bool:
    """Plain http:// webhook endpoints: refused unless set, except under DEBUG (local runs). The leaf
    settings modules call this again once they have settled DEBUG."""
    return env_bool("WEBHOOKS_ALLOW_HTTP", debug)


WEBHOOKS_ALLOW_HTTP = webhooks_allow_http(DEBUG)
# One call's deadline for the whole exchange (address check, connect, TLS, request, headers, body),
# whatever the receiver does: a receiver that drips its answer is cut off here (foundation.outgoing).
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 10.0)
# Calls of one app in flight at once, across all webhook workers (a Redis semaphore, foundation.slots):
# a slow receiver costs its own app's calls only. A call over the cap waits this long (not an attempt).
WEBHOOK_APP_CONCURRENCY = env_int("WEBHOOK_APP_CONCURRENCY", 2)
WEBHOOK_BUSY_RETRY_SECONDS = env_float("WEBHOOK_BUSY_RETRY_SECONDS", 2.0)
# A call that fails (non-2xx, timeout, refused) is retried after base x 2^(attempt-1) s, capped, with
# jitter; after this many failed attempts the webhook delivery is dead.
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 8)
WEBHOOK_RETRY_BASE_SECONDS = env_float("WEBHOOK_RETRY_BASE_SECONDS", 10.0)
WEBHOOK_RETRY_MAX_SECONDS = env_float("WEBHOOK_RETRY_MAX_SECONDS", 3600.0)
WEBHOOK_SWEEP_SECONDS = env_int("WEBHOOK_SWEEP_SECONDS", 5)
WEBHOOK_RETENTION_DAYS = env_int("WEBHOOK_RETENTION_DAYS", 30)  # delivery records older than this go

CELERY_BEAT_SCHEDULE = {
    "retry-sweep": {"task": "messaging.tasks.retry_sweep", "schedule": float(RETRY_SWEEP_SECONDS)},
    "reap-dead-nodes": {"task": "messaging.tasks.reap_dead_nodes", "schedule": float(PRESENCE_HEARTBEAT_SECONDS)},
    "expire-deliveries": {"task": "messaging.tasks.expire_deliveries", "schedule": 3600.0},
    "analytics-export": {"task": "analytics.tasks.export_run", "schedule": float(ANALYTICS_EXPORT_SECONDS)},
    "analytics-retention": {"task": "analytics.tasks.retention_sweep", "schedule": float(RETENTION_SWEEP_SECONDS)},
    # Yesterday's reports (UTC), after the exports of the first minutes of today have caught up.
    "analytics-presence-report": {"task": "analytics.tasks.report_run", "schedule": crontab(hour=0, minute=30),
                                  "kwargs": {"kind": "presence"}},
    "analytics-backlog-report": {"task": "analytics.tasks.report_run", "schedule": crontab(hour=0, minute=40),
                                 "kwargs": {"kind": "backlog"}},
    "webhook-sweep": {"task": "messaging.tasks.webhook_sweep", "schedule": float(WEBHOOK_SWEEP_SECONDS)},
    "webhook-purge": {"task": "messaging.tasks.webhook_purge", "schedule": 3600.0},
    "expire-idempotency-keys": {"task": "messaging.tasks.expire_idempotency_keys", "schedule": 3600.0},
    # Channel history past each app's retention_days (messaging.channels.retention).
    "expire-channel-history": {"task": "messaging.tasks.expire_channel_history", "schedule": 3600.0},
    **NETWORK_BEAT_SCHEDULE, **QUEUE_BEAT_SCHEDULE, **REQUESTS_BEAT_SCHEDULE,  # noqa: F405
}
# Celery's Django fix-up closes the DB connection after every task unless told otherwise: reuse it
# (it is recycled every 2 x this many tasks).
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1000)
# Threads, not prefork: routing waits on Postgres and Redis, and threads spare every task the pickling and pipes
# to a pool process (a fifth of the worker's CPU per message). `WORKER_POOL=prefork` for CPU-bound work.
CELERY_WORKER_POOL = env_str("WORKER_POOL", "threads")
CELERY_WORKER_CONCURRENCY = env_int("WORKER_CONCURRENCY", 4)
# Webhook calls wait on tenants' receivers: their own queue, served by their own worker (`-Q webhooks`),
# never by the routing worker (`-Q celery,routing`). The names are foundation.handoff's.
CELERY_TASK_ROUTES = {"messaging.tasks.route_deliveries": {"queue": "routing"}, "messaging.tasks.webhook_deliver": {"queue": "webhooks"}, "messaging.tasks.webhook_hand_out": {"queue": "webhooks"}, **NETWORK_TASK_ROUTES, **QUEUE_TASK_ROUTES}  # noqa: F405,E501
HANDOFF_DISPATCHER = "foundation.handoff.CeleryDispatcher"  # how named work reaches the workers: the broker
# Every task's time limit (soft: SoftTimeLimitExceeded inside the task; hard: the pool kills it). Only
# the prefork pool enforces them: the threads pool (the default) ignores both, so a webhook call is
# bounded by its own deadline (WEBHOOK_TIMEOUT_SECONDS), not by these. analytics.tasks set longer ones.
CELERY_TASK_SOFT_TIME_LIMIT = env_int("TASK_SOFT_TIME_LIMIT", 300)
CELERY_TASK_TIME_LIMIT = env_int("TASK_TIME_LIMIT", 360)
ANALYTICS_TASK_SOFT_TIME_LIMIT = env_int("ANALYTICS_TASK_SOFT_TIME_LIMIT", 3 * 3600)
ANALYTICS_TASK_TIME_LIMIT = env_int("ANALYTICS_TASK_TIME_LIMIT", 3 * 3600 + 600)
