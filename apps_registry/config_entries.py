"""What reading a configuration file's entries shares (apps_registry.config_io): the error that
names the entry it could not import, and the checks of a required key and of a whole number."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError


class ConfigError(Exception):
    """A config file entry that cannot be imported; the message names the entry."""


def entry_required(entry: dict, key: str, where: str) -> Any:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    if entry.get(key) in (None, ""):
        raise ConfigError(f"{where}: '{key}' is required")
    return entry[key]


def entry_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{where}: {value!r} is not a whole number")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not a whole number") from None


def validation_text(exc: ValidationError) -> str:
    if hasattr(exc, "message_dict"):
        return "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
    return " ".join(exc.messages)
