"""Admin pieces that keep the configuration whole: the meta role's warning on what a pull
overwrites, and the bulk delete that leaves no user without a home domain."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages

from .services import distributions_delete_refusal

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
