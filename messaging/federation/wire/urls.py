from __future__ import annotations

from django.urls import path

from foundation.asyncdb import pooled
from messaging.federation.wire import views

urlpatterns = [
    path("forward", pooled(views.forward), name="network-forward"),
    path("publishes", pooled(views.publishes), name="network-publishes"),
    path("ping", pooled(views.ping), name="network-ping"),
    path("standby", pooled(views.standby_copies), name="network-standby"),
    path("witness", pooled(views.witness), name="network-witness"),
]
