"""Production: every service comes from the environment; nothing is started for you.

Misconfiguration is reported by the system checks in config/checks.py (run on every
`manage.py` command and at daphne start through `check --deploy` in the Dockerfile).
"""

from __future__ import annotations

from .base import *  # noqa: F403
from .base import env_bool, env_int, env_list, env_str, service_settings, webhooks_allow_http

DEBUG = False
WEBHOOKS_ALLOW_HTTP = webhooks_allow_http(DEBUG)  # https:// endpoints only, unless set
PRODUCTION = True
DEMO_ENABLED = env_bool("DEMO_ENABLED", False)
# In production the scrape allow-list is empty unless set: a token or an explicit network.
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", [])
# Placeholders keep settings importable so the system checks can name what is missing.
globals().update(
    service_settings(
        env_str("DATABASE_URL", "") or "postgresql://unset/switchboard",
        env_str("REDIS_URL", "") or "redis://unset:6379/0",
    )
)
PRODUCTION_DATABASE_URL_SET = bool(env_str("DATABASE_URL", ""))
PRODUCTION_REDIS_URL_SET = bool(env_str("REDIS_URL", ""))

# No SECURE_PROXY_SSL_HEADER: Django would read X-Forwarded-Proto from any peer. The daphne adapter
# sets scope["scheme"] from it only when a TRUSTED_PROXIES peer sent it (foundation.forwarded), and
# request.is_secure() reads scope["scheme"]. Behind a TLS-terminating proxy, set TRUSTED_PROXIES.
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_CONTENT_TYPE_NOSNIFF = True
WHITENOISE_USE_FINDERS = False
