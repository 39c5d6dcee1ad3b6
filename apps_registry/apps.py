from __future__ import annotations

from django.apps import AppConfig


class AppsRegistryConfig(AppConfig):
    name = "apps_registry"
    verbose_name = "Configuration registry"
    default_auto_field = "django.db.models.BigAutoField"
