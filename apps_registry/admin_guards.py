"""Admin pieces that keep the configuration whole: the meta role's warning on what a pull
overwrites, and the bulk delete that leaves no user without a home domain."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages
from django.shortcuts import redirect

from .services import distributions_delete, distributions_delete_refusal

META_MANAGED_WARNING = (
    "This domain takes its configuration from the meta domain ({url}): domains, links, apps and distributions "
    "are edited on the meta domain; local edits are overwritten by the next pull."
)


class MetaManagedAdmin(admin.ModelAdmin):
    """What the meta role owns on a domain that pulls it (settings.META_URL): every page says so."""

    def _meta_warning(self, request) -> None:
        if settings.META_URL and request.method == "GET":
            self.message_user(request, META_MANAGED_WARNING.format(url=settings.META_URL), messages.WARNING)

    def changelist_view(self, request, extra_context=None):
        self._meta_warning(request)
        return super().changelist_view(request, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        self._meta_warning(request)
        return super().changeform_view(request, object_id, form_url, extra_context)


def homes_kept(delete_selected):
    """The bulk delete action, refused (before its confirmation page too) where it would leave a
    user without a home."""

    def action(modeladmin, request, queryset):
        refusal = distributions_delete_refusal(distribution_ids=list(queryset.values_list("pk", flat=True)))
        if refusal:
            modeladmin.message_user(request, f"Nothing deleted: {refusal}", messages.ERROR)
            return None
        return delete_selected(modeladmin, request, queryset)

    return action


class HomesKeptAdmin(MetaManagedAdmin):
    """The distributions' admin: deleting is refused, one row or a bulk selection, where it would
    leave a user without a home domain."""

    def delete_view(self, request, object_id, extra_context=None):
        obj = self.get_object(request, object_id)
        refusal = obj and distributions_delete_refusal(distribution_ids=[obj.pk])
        if refusal:
            self.message_user(request, f"Not deleted: {refusal}", messages.ERROR)
            return redirect("admin:apps_registry_userdistribution_change", obj.pk)
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request, obj):
        distributions_delete(distribution_ids=[obj.pk])

    def delete_queryset(self, request, queryset):
        distributions_delete(distribution_ids=list(queryset.values_list("pk", flat=True)))

    def get_actions(self, request):
        actions = super().get_actions(request)
        if "delete_selected" in actions:
            func, name, description = actions["delete_selected"]
            actions["delete_selected"] = (homes_kept(func), name, description)
        return actions


class NumberGivenOnceAdmin:
    """A domain's number is given once: read-only once set (its messages already carry ids of its
    block, apps_registry.id_blocks)."""

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "number"] if obj is not None and obj.number is not None else fields
