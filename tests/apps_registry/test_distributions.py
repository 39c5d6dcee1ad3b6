from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from apps_registry.models import UserDistribution
from apps_registry.services import distribution_create
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db


def test_an_overlapping_distribution_is_rejected_with_the_clash_named():
    app = make_app(range_from=0, range_to=999)
    with pytest.raises(ValidationError, match=r"overlap the distribution 0…999 on domain-01"):
        distribution_create(app=app, domain=make_domain("domain-02"), range_from=500, range_to=1500)


def test_an_open_ended_range_overlaps_everything_above_it():
    app = make_app(range_from=1000, range_to=None)
    with pytest.raises(ValidationError):
        distribution_create(app=app, domain=make_domain("domain-02"), range_from=10**12, range_to=10**12)


def test_adjacent_ranges_and_other_apps_do_not_clash():
    app = make_app(range_from=0, range_to=999)
    distribution_create(app=app, domain=make_domain("domain-02"), range_from=1000, range_to=None)
    other = make_app(app_name="BNZ", app_id="bnz", master="BNZ-1", range_from=0, range_to=None)
    assert UserDistribution.objects.filter(app__in=[app, other]).count() == 3


def test_the_database_itself_refuses_an_overlap_that_skips_the_service():
    app = make_app(range_from=0, range_to=999)
    with pytest.raises(IntegrityError, match="overlaps"), transaction.atomic():
        UserDistribution.objects.create(app=app, domain=make_domain(), range_from=999, range_to=2000)


def test_to_below_from_is_rejected():
    app = make_app(range_from=0, range_to=9)
    with pytest.raises(ValidationError, match="must not be below"):
        distribution_create(app=app, domain=make_domain(), range_from=100, range_to=50)


def test_the_app_snapshot_cache_stays_bounded_when_clients_try_made_up_app_names(monkeypatch):
    from apps_registry import selectors

    monkeypatch.setattr(selectors, "SNAPSHOT_CACHE_SIZE", 50)
    selectors.app_snapshots_clear()
    for n in range(500):
        assert selectors.app_snapshot(f"NOPE{n}") is None
    assert len(selectors._snapshots) == 50
