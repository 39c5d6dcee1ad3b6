from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from config import health
from config.admin_login import admin_login
from messaging.metrics import metrics_view
from messaging.views import demo_client

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
]
