"""A few named personas for tests: the ANZ tenant of the linker seed and its users."""

from __future__ import annotations

from apps_registry.models import AuthMode, ClientApp, Domain
from apps_registry.services import distribution_create


def make_domain(name: str = "domain-01", **extra) -> Domain:
    return Domain.objects.get_or_create(name=name, defaults={"urls": [f"ws://{name}.example:8000/ws"], **extra})[0]


def make_app(app_name: str = "ANZ", app_id: str = "app-id-343", master: str = "ANZ-123223",
             domain: Domain | None = None, range_from: int = 0, range_to: int | None = None, **fields) -> ClientApp:
    fields.setdefault("auth_mode", AuthMode.NONE)  # the seed's tenants are open; a new app is not by default
    app = ClientApp.objects.create(app_name=app_name, app_id=app_id, master_user_id=master, **fields)
    distribution_create(app=app, domain=domain or make_domain(), range_from=range_from, range_to=range_to)
    return app
