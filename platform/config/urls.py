from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps_registry.meta import EXPORT_PATH, config_export_view
from config import health
from config.admin_login import admin_login
from messaging.api.errors import not_found as api_not_found
from messaging.api.push_views import PushMessagesView
from messaging.api.urls import pooled
from messaging.gateway.demo import demo_client
from messaging.gateway.pusher import api_views as pusher_api
from messaging.gateway.scrape import metrics_view

admin.site.site_header = "Switchboard"
admin.site.site_title = "Switchboard console"
admin.site.index_title = "Operator console"

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/login/", admin_login, name="admin_login_throttled"),
    path("admin/", admin.site.urls),
    path("demo/", demo_client, name="demo"),
    # The meta role: this domain's configuration, to a caller signed with META_SECRET (apps_registry.meta).
    path(EXPORT_PATH.lstrip("/"), config_export_view, name="meta-config-export"),
    # The server API: the push seed's publish, /api/v1/, its OpenAPI schema and browsable docs.
    path("messages", pooled(PushMessagesView.as_view()), name="push-messages"),
    path("api/v1/", include("messaging.api.urls")),
    # Signed calls between domains (messaging.federation): forwarding, channel floods, link probes.
    path("internal/v1/", include("messaging.federation.wire.urls")),
    # The Pusher HTTP API (messaging.gateway.pusher.api_views), for the `pusher` server libraries.
    path("apps/<str:app_id>/events", pusher_api.events, name="pusher-events"),
    path("apps/<str:app_id>/batch_events", pusher_api.batch_events, name="pusher-batch-events"),
    path("apps/<str:app_id>/channels", pusher_api.channels, name="pusher-channels"),
    path("apps/<str:app_id>/channels/<str:name>", pusher_api.channel, name="pusher-channel"),
    path("apps/<str:app_id>/channels/<str:name>/users", pusher_api.channel_users, name="pusher-channel-users"),
    path("apps/<str:app_id>/users/<str:user_id>/terminate_connections", pusher_api.terminate_connections,
         name="pusher-terminate-connections"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    re_path(r"^api/", api_not_found, name="api-not-found-root"),
]

handler500 = "messaging.api.errors.server_error"
