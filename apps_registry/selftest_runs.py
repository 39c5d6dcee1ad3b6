"""The record of a `manage.py selftest` run (a model of apps_registry, in its own module)."""

from __future__ import annotations

from django.db import models


class SelftestRun(models.Model):
    """What one `manage.py selftest` run was given, so that ending it removes exactly that: a
    throwaway app it created (`app_created`, the whole app goes), or, on an operator's existing app,
    the temporary API key, the throwaway users' traffic, the test channel and webhook endpoint.
    A run whose client died without ending it stays listed in the admin until ended there."""

    name = models.CharField(max_length=64, unique=True)
    app = models.ForeignKey("apps_registry.ClientApp", on_delete=models.CASCADE, related_name="+")
    app_created = models.BooleanField()
    api_key = models.ForeignKey("apps_registry.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    users = models.JSONField(default=list, help_text="The throwaway user ids this run logs in.")
    channel = models.CharField(max_length=128)
    webhook_endpoint_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "selftest run"

    def __str__(self) -> str:
        return f"{self.name} on {self.app_id}"
