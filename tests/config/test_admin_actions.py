"""Every console action that changes something needs more than view permission: a view-only staff
user sees no action and a POST of one changes nothing."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from apps_registry.models import ApiKey
from apps_registry.services import api_key_create
from messaging.core.store import message_send
from messaging.models import Delivery, LinkHealth, WebhookDelivery
from messaging.webhooks.services import WebhookNotice, webhook_endpoint_create, webhooks_record
from presence.models import Node, Session
from tests.factories import make_app

pytestmark = pytest.mark.django_db

# (changelist, action, model permission suffixes)
ACTIONS = [
    ("/admin/apps_registry/apikey/", "revoke", "apikey"),
    ("/admin/messaging/deadletter/", "requeue", "deadletter"),
    ("/admin/messaging/deadletter/", "discard", "deadletter"),
    ("/admin/presence/session/", "disconnect", "session"),
    ("/admin/messaging/webhookendpoint/", "send_test_event", "webhookendpoint"),
    ("/admin/messaging/webhookdelivery/", "requeue", "webhookdelivery"),
    ("/admin/messaging/linkhealth/", "probe_now", "linkhealth"),
]


def staff(client, *codenames: str):
    user = User.objects.create_user("viewer", password="pw-viewer-12345", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


@pytest.fixture
def records():
    """One of each record an action works on: an API key, dead letters, a live session, a webhook
    endpoint with a dead delivery."""
    app = make_app()
    api_key_create(app=app, name="crm")
    message_send(app_id=app.pk, sender="ANZ-1", recipients=["ANZ-2", "ANZ-3"], content="hi", kind="group")
    Delivery.objects.update(state="dead", attempts=10, dead_at=timezone.now())
    now = timezone.now()
    node = Node.objects.create(node_id="web-1", domain="domain-01", started_at=now, heartbeat_at=now)
    Session.objects.create(app=app, user_id="ANZ-7", node=node, channel_name="specific.x!y", connected_at=now,
                           last_seen_at=now)
    webhook_endpoint_create(app_id=app.pk, url="https://anz.example.com/hooks")
    webhooks_record(notices=[WebhookNotice(app.pk, "user.connected", {"userId": "ANZ-7"})])
    WebhookDelivery.objects.update(state="dead", attempts=8, dead_at=timezone.now())
    LinkHealth.objects.create(peer="domain-02", up=False, down_since=now, last_failure_at=now, failures=1)
    return app


def state_of_everything() -> list:
    return [list(ApiKey.objects.values_list("revoked_at", flat=True)),
            sorted(Delivery.objects.values_list("state", flat=True)),
            list(Session.objects.values_list("disconnected_at", flat=True)),
            sorted(WebhookDelivery.objects.values_list("state", flat=True)),
            WebhookDelivery.objects.count(), list(LinkHealth.objects.values_list("up", "failures", "updated_at"))]


def test_a_view_only_staff_user_sees_no_action_and_a_posted_one_changes_nothing(client, records):
    viewer = staff(client, *{f"view_{model}" for _, _, model in ACTIONS})
    before = state_of_everything()
    for changelist, action, model in ACTIONS:
        listing = viewer.get(changelist)
        assert listing.status_code == 200
        assert f'value="{action}"' not in listing.content.decode(), f"{model} offers {action} to a viewer"
        ids = list(admin.site._registry[listing.context["cl"].model].get_queryset(listing.wsgi_request)
                   .values_list("pk", flat=True))
        assert ids, f"nothing to act on in {changelist}"
        viewer.post(changelist, {"action": action, "_selected_action": ids})
    assert state_of_everything() == before


def test_a_staff_user_with_change_permission_may_act_on_read_only_records(client, records):
    operator = staff(client, "view_deadletter", "change_deadletter")
    listing = operator.get("/admin/messaging/deadletter/").content.decode()
    assert 'value="discard"' in listing
    ids = list(Delivery.objects.values_list("pk", flat=True))
    operator.post("/admin/messaging/deadletter/", {"action": "discard", "_selected_action": ids})
    assert set(Delivery.objects.values_list("state", flat=True)) == {"expired"}


def test_every_action_in_the_console_declares_a_permission_beyond_view():
    for model_admin in admin.site._registry.values():
        for name in [*(model_admin.actions or []), *(name for name, _ in admin.site.actions)]:
            func, _, _ = model_admin.get_action(name)
            permissions = set(getattr(func, "allowed_permissions", ()))
            assert permissions - {"view"}, f"{type(model_admin).__name__}.{name} needs only view permission"
