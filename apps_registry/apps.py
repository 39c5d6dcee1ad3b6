from __future__ import annotations

from django.apps import AppConfig


class AppsRegistryConfig(AppConfig):
    name = "apps_registry"
    verbose_name = "Configuration registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the switchboard.W01x deploy checks of the apps)
