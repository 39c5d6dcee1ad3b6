"""The operator's console for the configuration registry."""

from __future__ import annotations

import math

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.html import escape, format_html

from .admin_endpoints import RequestEndpointInline, endpoint_secrets_show
from .admin_guards import HomesKeptAdmin, MetaManagedAdmin, NumberGivenOnceAdmin
from .admin_pusher import PusherCredentialsAdmin  # noqa: F401  (registers the Pusher credentials page)
from .meta import meta_state_line
from .models import (
    OPEN_APP_MEANING,
    PUSH_OPEN_MEANING,
    ApiKey,
    ClientApp,
    Domain,
    DomainLink,
    OperatorKey,
    RequestEndpoint,
    UserDistribution,
    UserRange,
)
from .routing import DomainGraph, route_for_user
from .services import (
    api_key_create,
    api_key_revoke,
    distribution_coverage_check,
    distribution_standby_validate,
    distribution_validate,
    operator_key_revoke,
)


class DistributionForm(forms.ModelForm):
    class Meta:
        model = UserDistribution
        fields = ["app", "domain", "range_from", "range_to", "standby"]

    def clean(self):
        data = super().clean()
        distribution_standby_validate(domain=data.get("domain"), standby=data.get("standby"))
        app = data.get("app") or getattr(self.instance, "app", None)
        if app is not None and data.get("range_from") is not None and not self._skip_db_check:
            distribution_validate(
                app=app, range_from=data["range_from"], range_to=data.get("range_to"), exclude_id=self.instance.pk
            )
            # No user who has a home now may lose it: the app's other rows plus this one must cover
            # what they covered (and an app this row leaves must keep covering its users without it).
            others = [d.user_range for d in app.distributions.exclude(pk=self.instance.pk)]
            distribution_coverage_check(app=app, after=[*others, UserRange(data["range_from"], data.get("range_to"))])
            old_app = self.instance.app if self.instance.pk else None
            if old_app is not None and old_app.pk != app.pk:
                distribution_coverage_check(
                    app=old_app, after=[d.user_range for d in old_app.distributions.exclude(pk=self.instance.pk)])
        return data

    _skip_db_check = False


class DistributionFormSet(BaseInlineFormSet):
    """Checks the rows of the form against each other; the database holds only what stays."""

    def add_fields(self, form, index):
        super().add_fields(form, index)
        form._skip_db_check = True

    def clean(self):
        super().clean()
        if any(self.errors):
            return
        rows = []
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE") or data.get("range_from") is None:
                continue
            current = UserRange(data["range_from"], data.get("range_to"))
            for other in rows:
                if current.overlaps(other):
                    upper = "no upper end" if other.high is None else other.high
                    raise ValidationError(
                        f"Distribution {current.low}…{current.high if current.high is not None else ''} overlaps "
                        f"{other.low}…{upper}; a user can live in one domain only."
                    )
            rows.append(current)
        if self.instance.pk is not None:  # a new app's first distributions are free
            # Rows the page did not submit stay as they are.
            shown = [form.instance.pk for form in self.forms if form.instance.pk is not None]
            kept = [d.user_range for d in self.instance.distributions.exclude(pk__in=shown)]
            distribution_coverage_check(app=self.instance, after=[*kept, *rows])


class UserDistributionInline(admin.TabularInline):
    model = UserDistribution
    form = DistributionForm
    formset = DistributionFormSet
    fields = ["domain", "range_from", "range_to", "standby"]
    extra = 0


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    fields = ["prefix", "name", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False  # keys are made on the API key page, where the key is shown once


class ClientAppForm(forms.ModelForm):
    """The token secret is write-only: the form never shows it, and a blank field keeps it."""

    token_secret = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="HMAC-SHA256 secret for signed tokens. Never shown again; leave blank to keep the current one "
                  "(a new app has a random one: set the one your server signs with).",
    )

    class Meta:
        model = ClientApp
        fields = ["token_secret"]  # the admin adds the fieldsets' fields

    def clean_token_secret(self) -> str:
        # A new app's instance holds the generated default secret (ClientApp.token_secret).
        return self.cleaned_data.get("token_secret") or self.instance.token_secret


@admin.register(ClientApp)
class ClientAppAdmin(MetaManagedAdmin):
    form = ClientAppForm
    list_display = ["app_name", "app_id", "master_user_id", "auth_mode", "retention_days", "max_delivery_attempts"]
    search_fields = ["app_name", "app_id", "master_user_id"]
    list_filter = ["auth_mode", "push_open"]
    inlines = [UserDistributionInline, RequestEndpointInline, ApiKeyInline]
    fieldsets = [
        (None, {"fields": ["app_name", "app_id", "master_user_id", "confirmation_enabled"]}),
        ("Authentication", {"fields": ["auth_mode", "auth_url", "auth_enabled", "auth_timeout_ms", "token_secret"]}),
        ("Limits", {"fields": ["max_content_bytes", "max_group_recipients", "rate_limit_per_second",
                               "rate_limit_burst", "deliveries_per_second", "deliveries_burst",
                               "max_connections_per_user", "api_rate_limit_per_second", "api_rate_limit_burst",
                               "retention_days", "max_delivery_attempts"]}),
        ("Security", {"fields": ["allowed_origins", "max_token_lifetime_seconds"]}),
        ("Channels", {"fields": ["public_channel_patterns", "client_subscriptions_allowed", "push_open"]}),
    ]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.clean = _client_app_clean(form.clean)
        return form

    def save_formset(self, request, form, formset, change):
        if formset.model is RequestEndpoint:
            super().save_formset(request, form, formset, change)
            return endpoint_secrets_show(self, request, formset)
        if formset.model is not UserDistribution:
            return super().save_formset(request, form, formset, change)
        # Rows removed go first: a neighbour widened over a removed row in the same save would
        # otherwise meet it in the overlap trigger (migration 0002).
        instances = formset.save(commit=False)
        for obj in formset.deleted_objects:
            obj.delete()
        for obj in instances:
            obj.save()
        formset.save_m2m()
        return None

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if obj.admits_anyone:
            self.message_user(request, f"{obj.app_name} has auth mode 'none': {OPEN_APP_MEANING}.", messages.WARNING)
        if obj.push_open:
            served = ("A production node never serves it." if getattr(settings, "PRODUCTION", False)
                      else "For development and demos only.")
            self.message_user(request, f"{obj.app_name} has push open mode: {PUSH_OPEN_MEANING}. {served}",
                              messages.WARNING)


def _client_app_clean(original):
    def clean(self):
        data = original(self)
        if data.get("auth_mode") == "auth_url" and not data.get("auth_url"):
            raise ValidationError({"auth_url": "The external auth URL mode needs an auth URL."})
        if data.get("auth_mode") == "signed_token" and not data.get("token_secret"):
            raise ValidationError({"token_secret": "Signed tokens need a token secret."})
        return data

    return clean


@admin.register(UserDistribution)
class UserDistributionAdmin(HomesKeptAdmin):
    """Deleting is refused, one row or a bulk selection, where it would leave a user without a home."""

    form = DistributionForm
    list_display = ["app", "domain", "range_from", "range_to", "standby"]
    list_filter = ["domain", "standby", "app"]
    list_select_related = ["app", "domain", "standby"]


class ApiKeyCreateForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["app", "name"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "app", "name", "created_at", "last_used_at", "state"]
    list_filter = ["app"]
    list_select_related = ["app"]
    search_fields = ["prefix", "name", "app__app_name"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = ApiKeyCreateForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["app", "name"]
        return ["app", "name", "prefix", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (["app"] if obj else [])

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw = api_key_create(app=form.cleaned_data["app"], name=form.cleaned_data["name"])
        obj.pk = key.pk
        self.message_user(
            request,
            format_html(
                "New API key for {}: <code id='new-api-key'>{}</code> — copy it now; it is shown only this once.",
                key.app.app_name, raw,
            ),
            messages.WARNING,
        )

    def log_addition(self, request, obj, message):
        return super().log_addition(request, ApiKey.objects.get(pk=obj.pk), message)

    @admin.display(description="state")
    def state(self, obj: ApiKey) -> str:
        return obj.state

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke(self, request, queryset):
        for key in queryset:
            api_key_revoke(api_key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")


@admin.register(OperatorKey)
class OperatorKeyAdmin(admin.ModelAdmin):
    """Listed and revocable here; created only with `manage.py operator_key create NAME` (a key that
    reaches every app is not handed out by a web form)."""

    list_display = ["prefix", "name", "created_at", "last_used_at", "state"]
    search_fields = ["prefix", "name"]
    fields = readonly_fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="state")
    def state(self, obj: OperatorKey) -> str:
        return obj.state

    @admin.action(description="Revoke selected operator keys", permissions=["change"])
    def revoke(self, request, queryset):
        for key in queryset:
            operator_key_revoke(operator_key=key)
        self.message_user(request, f"Revoked {queryset.count()} operator key(s).")


class DomainLinkForm(forms.ModelForm):
    """The link secret is write-only, like an app's token secret: never rendered into the page, a blank
    field keeps the current one (a new link's is generated)."""

    shared_secret = forms.CharField(
        required=False, strip=True, max_length=128, widget=forms.PasswordInput(render_value=False),
        help_text="Never shown; leave blank to keep the current one (a new link gets a random one).",
    )

    class Meta:
        model = DomainLink
        fields = ["n1", "n2", "weight", "enabled", "liveness_only", "shared_secret"]

    def clean_shared_secret(self) -> str:
        return self.cleaned_data.get("shared_secret") or self.instance.shared_secret

    def clean(self):
        data = super().clean()
        n1, n2 = data.get("n1"), data.get("n2")
        if n1 and n2:
            if n1 == n2:
                raise ValidationError("A link joins two different domains.")
            clash = DomainLink.objects.filter(n1__in=[n1, n2], n2__in=[n1, n2]).exclude(pk=self.instance.pk)
            if clash.exists():
                raise ValidationError(f"{n1} and {n2} are already linked.")
        return data


@admin.register(DomainLink)
class DomainLinkAdmin(MetaManagedAdmin):
    form = DomainLinkForm
    list_display = ["__str__", "weight", "enabled", "liveness_only"]
    list_editable = ["weight", "enabled"]
    list_select_related = ["n1", "n2"]


@admin.register(Domain)
class DomainAdmin(NumberGivenOnceAdmin, MetaManagedAdmin):
    list_display = ["name", "number", "url_list", "this_node"]
    search_fields = ["name"]
    change_list_template = "admin/apps_registry/domain/change_list.html"

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), "meta_state": meta_state_line()})

    @admin.display(description="urls")
    def url_list(self, obj: Domain) -> str:
        return ", ".join(obj.urls)

    @admin.display(description="this node's domain", boolean=True)
    def this_node(self, obj: Domain) -> bool:
        return obj.is_this_node

    def get_urls(self):
        return [
            path("graph/", self.admin_site.admin_view(self.graph_view), name="apps_registry_domain_graph"),
            *super().get_urls(),
        ]

    def graph_view(self, request: HttpRequest):
        graph = DomainGraph.load()
        user_id = request.GET.get("user_id", "").strip()
        source = request.GET.get("from") or settings.DOMAIN_NAME
        route = route_for_user(user_id, from_domain=source, graph=graph) if user_id else None
        context = {
            **self.admin_site.each_context(request),
            "title": "Domain graph",
            "opts": self.model._meta,
            "svg": domain_graph_svg(graph, route.path if route else None, this_domain=settings.DOMAIN_NAME),
            "user_id": user_id,
            "source": source,
            "domains": graph.domains,
            "route": route,
        }
        return TemplateResponse(request, "admin/apps_registry/domain/graph.html", context)


def domain_graph_svg(graph: DomainGraph, path_names: list[str] | None, *, this_domain: str) -> str:
    """Domains on a circle, links as lines (dashed when disabled), the route in orange."""
    size, radius = 520, 190
    names = graph.domains
    pos = {}
    for i, name in enumerate(names):
        angle = 2 * math.pi * i / max(len(names), 1) - math.pi / 2
        pos[name] = (size / 2 + radius * math.cos(angle), size / 2 + radius * math.sin(angle))
    on_path = set(zip(path_names or [], (path_names or [])[1:], strict=False))
    on_path |= {(b, a) for a, b in on_path}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" role="img" '
             f'aria-label="domain graph" id="domain-graph">']
    for link in DomainLink.objects.select_related("n1", "n2"):
        (x1, y1), (x2, y2) = pos[link.n1.name], pos[link.n2.name]
        hot = (link.n1.name, link.n2.name) in on_path
        colour = "#e67e22" if hot else ("#bbb" if not link.enabled else "#a9c" if link.liveness_only else "#7a8")
        dash = ' stroke-dasharray="6 5"' if not link.enabled else ' stroke-dasharray="2 4"' if link.liveness_only else ""
        width = 5 if hot else 2
        parts.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="{colour}" '
                     f'stroke-width="{width}"{dash} class="link{" on-route" if hot else ""}"/>')
        parts.append(f'<text x="{(x1 + x2) / 2:.0f}" y="{(y1 + y2) / 2 - 4:.0f}" font-size="12" fill="#555" '
                     f'text-anchor="middle">{"liveness" if link.liveness_only else link.weight}'
                     f'{"" if link.enabled else " (off)"}</text>')
    for name, (x, y) in pos.items():
        fill = "#417690" if name == this_domain else "#79aec8"
        ring = ' stroke="#e67e22" stroke-width="4"' if path_names and name in path_names else ""
        parts.append(f'<circle cx="{x:.0f}" cy="{y:.0f}" r="34" fill="{fill}"{ring}/>')
        parts.append(f'<text x="{x:.0f}" y="{y + 4:.0f}" font-size="12" fill="#fff" text-anchor="middle" '
                     f'class="domain">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)
