from __future__ import annotations

from django.apps import AppConfig


class PresenceConfig(AppConfig):
    name = "presence"
    default_auto_field = "django.db.models.BigAutoField"
