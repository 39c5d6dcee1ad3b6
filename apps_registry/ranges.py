"""A range of an app's users (a user distribution's `from`…`to`): the one definition of the range
rule, used by the models, the import, the admin and the snapshots (apps_registry.models re-exports it)."""

from __future__ import annotations

from typing import NamedTuple

from django.db.models import Q


class UserRange(NamedTuple):
    """Users `<app>-<low>` … `<app>-<high>` inclusive; `high` None means no upper end.

    The one definition of the range rule (the overlap trigger in migration 0002 is its SQL twin):
    two ranges share a user iff each starts at or before the other ends. Containment is overlap
    with a one-user range.
    """

    low: int
    high: int | None

    def overlaps(self, other: UserRange) -> bool:
        return (other.high is None or self.low <= other.high) and (self.high is None or other.low <= self.high)

    def contains(self, number: int) -> bool:
        return self.overlaps(UserRange(number, number))

    def overlapping_q(self) -> Q:
        """The same rule as a filter on UserDistribution rows."""
        q = Q(range_to__isnull=True) | Q(range_to__gte=self.low)
        if self.high is not None:
            q &= Q(range_from__lte=self.high)
        return q
