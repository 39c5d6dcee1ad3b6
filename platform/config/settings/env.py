"""The one place settings read the environment: typed helpers, secrets from ``NAME_FILE``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str = "") -> str:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        with open(file_path) as fh:
            return fh.read().strip()
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = env_str(name, "")
    if raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false)")


def env_int(name: str, default: int) -> int:
    raw = env_str(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = env_str(name, "")
    if raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name, "")
    if raw == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict:
    """Django DATABASES entry for a postgres:// URL (host may be a socket dir via ?host=)."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL must be a postgresql:// URL (got scheme {parsed.scheme!r}); Switchboard runs on Postgres only"
        )
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = query.pop("host", None) or parsed.hostname or ""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "switchboard",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        "OPTIONS": query,
    }


def database_options_set(options: dict, *, prepared: bool, domain: str) -> None:
    """The connection options every platform connection opens with."""
    if prepared:
        # psycopg prepares nothing while this is None (Django's default). Only foundation.db's
        # server-binding cursors prepare; the ORM's cursors bind on the client and never do.
        options.setdefault("prepare_threshold", 5)
        # Prepared statements keep one generic plan. Left to choose, Postgres re-plans a statement
        # whose array holds one id every time (a custom plan looks cheaper than the generic one),
        # which cost a one-row delivered mark 0.71 ms of backend CPU instead of 0.24. Only prepared
        # statements are affected; the ORM's are planned per execution as before.
        options["options"] = f"{options.get('options', '')} -c plan_cache_mode=force_generic_plan".strip()
    # The domain this database serves, for its triggers (the standby feed: messaging.federation.standby.copy).
    domain = domain.replace("\\", "\\\\").replace(" ", "\\ ")
    options["options"] = f"{options.get('options', '')} -c switchboard.domain={domain}".strip()


def process_label(name: str) -> str:
    """`name`, what this process is (web, worker, beat, or manage.py's command) and its pid, as a
    Postgres application_name (at most 63 bytes): an operator can tell which process holds a lock
    or a long transaction."""
    argv = sys.argv
    role = next((r for r in ("web", "worker", "beat") if r in argv or f"config.{r}" in argv), None)
    if role is None:
        role = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else Path(argv[0]).name
    return f"{name} {role} {os.getpid()}"[:63]
