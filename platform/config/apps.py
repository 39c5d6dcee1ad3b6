"""The composition root as a Django app: it registers the platform's own system checks."""

from __future__ import annotations

from django.apps import AppConfig


class PlatformConfig(AppConfig):
    name = "config"
    label = "platform_config"
    verbose_name = "Platform"

    def ready(self) -> None:
        from config import checks  # noqa: F401  (registering is importing: the switchboard.* system checks)
