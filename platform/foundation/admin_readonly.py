"""The console's records that operators look at and act on (actions), but never add, edit or delete."""

from __future__ import annotations


class ReadOnlyAdminMixin:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
