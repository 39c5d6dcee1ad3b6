"""`check --deploy` checks of the registered apps (ids switchboard.W01x): a tenant anyone may log in
to is named before a node goes on the internet. Only under --deploy: they read the database."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError

from .models import OPEN_APP_MEANING
from .selectors import app_names_admitting_anyone, app_names_with_auth_url_off


@register(Tags.security, deploy=True)
def check_open_apps(app_configs, **kwargs):
    try:
        open_apps, refusing_apps = app_names_admitting_anyone(), app_names_with_auth_url_off()
    except DatabaseError as exc:
        return [CheckWarning(f"The registered apps could not be checked ({type(exc).__name__}).",
                             hint="Run `manage.py migrate`, then `check --deploy` again.", id="switchboard.W012")]
    warnings = [
        CheckWarning(
            f"App {name} has auth mode 'none': {OPEN_APP_MEANING}.",
            hint="Choose signed tokens or an auth URL for it in the admin, unless it is a demo on purpose.",
            id="switchboard.W010",
        )
        for name in open_apps
    ]
    warnings += [
        CheckWarning(
            f"App {name} uses an external auth URL that is switched off: every login to it is refused.",
            hint="Enable its auth URL, or choose another auth mode.",
            id="switchboard.W011",
        )
        for name in refusing_apps
    ]
    return warnings


@register()
def check_meta_role(app_configs, **kwargs):
    """A domain told to pull its configuration without the secret that signs the pull: every pull fails."""
    if settings.META_URL and not settings.META_SECRET:
        return [CheckWarning(
            f"META_URL is set ({settings.META_URL}) but META_SECRET is empty: every configuration pull fails.",
            hint="Set META_SECRET to the secret the meta domain has, or unset META_URL.", id="switchboard.W013")]
    return []
