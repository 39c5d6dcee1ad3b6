"""The console's records that operators look at and act on (actions), but never add, edit or delete."""

from __future__ import annotations

from django.contrib.auth import get_permission_codename

# An action on read-only records declares `allowed_permissions = ACT`: only a user holding the
# model's change permission may run it (a view-only user sees no action, and a POST is refused).
ACT = ("act",)


class ReadOnlyAdminMixin:
    def has_act_permission(self, request) -> bool:
        """The model's own change permission, which has_change_permission (no editing here) hides."""
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
