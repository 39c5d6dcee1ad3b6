"""No user without a home: a change that would leave a user of an app without a home domain is
refused where it is made (the admin, its bulk delete and inlines, and config imports)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps_registry.config_io import ConfigError, config_import
from apps_registry.models import ClientApp, Domain, UserDistribution, UserRange
from apps_registry.services import coverage_gap, distribution_create, distributions_delete
from tests.apps_registry.test_admin import _app_form
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db


@pytest.fixture
def anz_ring():
    """ANZ as in the linker's meta example: 0-999999 on 01, 1000000-2999999 on 02, 3000000-5999999 on 03,
    6000000 and up on 04."""
    domains = [make_domain(f"domain-0{i}") for i in range(1, 5)]
    app = make_app("ANZ", domain=domains[0], range_from=0, range_to=999999)
    for domain, low, high in ((domains[1], 1000000, 2999999), (domains[2], 3000000, 5999999), (domains[3], 6000000, None)):
        distribution_create(app=app, domain=domain, range_from=low, range_to=high)
    return app


def _row(app: ClientApp, low: int) -> UserDistribution:
    return app.distributions.get(range_from=low)


def test_the_gap_is_the_first_users_who_lose_their_home():
    R = UserRange
    assert coverage_gap(before=[R(0, None)], after=[R(0, 999999), R(3000000, None)]) == R(1000000, 2999999)
    assert coverage_gap(before=[R(0, None)], after=[R(0, 999999)]) == R(1000000, None)
    assert coverage_gap(before=[R(0, 10), R(20, 30)], after=[R(0, 10), R(20, 25)]) == R(26, 30)
    assert coverage_gap(before=[R(0, None)], after=[R(0, 5), R(6, None)]) is None  # split, nobody lost
    assert coverage_gap(before=[], after=[]) is None  # nothing was covered: the first distributions are free


def test_deleting_a_distribution_that_homes_users_is_refused_naming_the_app_and_range(anz_ring):
    with pytest.raises(ValidationError, match="ANZ users 1000000-2999999 would have no home domain"):
        distributions_delete(distribution_ids=[_row(anz_ring, 1000000).pk])
    assert anz_ring.distributions.count() == 4


def test_a_distribution_moved_to_another_domain_keeps_its_users_homed(anz_ring, operator):
    row = _row(anz_ring, 1000000)
    response = operator.post(f"/admin/apps_registry/userdistribution/{row.pk}/change/", {
        "app": anz_ring.pk, "domain": Domain.objects.get(name="domain-03").pk, "range_from": 1000000,
        "range_to": 2999999})
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.domain.name == "domain-03"


def test_shrinking_a_distribution_in_the_admin_is_refused(anz_ring, operator):
    row = _row(anz_ring, 6000000)
    response = operator.post(f"/admin/apps_registry/userdistribution/{row.pk}/change/", {
        "app": anz_ring.pk, "domain": row.domain.pk, "range_from": 6000000, "range_to": 6999999})
    assert response.status_code == 200
    assert "ANZ users 7000000 and up would have no home domain" in response.content.decode()
    row.refresh_from_db()
    assert row.range_to is None


def test_deleting_a_distribution_in_the_admin_is_refused_before_the_confirmation(anz_ring, operator):
    row = _row(anz_ring, 3000000)
    response = operator.get(f"/admin/apps_registry/userdistribution/{row.pk}/delete/", follow=True)
    assert "Not deleted: ANZ users 3000000-5999999 would have no home domain" in response.content.decode()
    response = operator.post(f"/admin/apps_registry/userdistribution/{row.pk}/delete/", {"post": "yes"}, follow=True)
    assert "would have no home domain" in response.content.decode()
    assert UserDistribution.objects.filter(pk=row.pk).exists()


def test_the_bulk_delete_action_is_refused_when_it_would_leave_users_homeless(anz_ring, operator):
    ids = [_row(anz_ring, 0).pk, _row(anz_ring, 1000000).pk]
    for step in ({}, {"post": "yes"}):  # the confirmation page, and the confirmed deletion
        response = operator.post("/admin/apps_registry/userdistribution/", {
            "action": "delete_selected", "_selected_action": ids, **step}, follow=True)
        assert "Nothing deleted: ANZ users 0-999999 would have no home domain" in response.content.decode()
    assert anz_ring.distributions.count() == 4


def test_the_app_page_refuses_inline_edits_that_leave_users_homeless(anz_ring, operator):
    rows = list(anz_ring.distributions.order_by("range_from"))
    form = _app_form(app_name="ANZ", app_id="app-id-343", master_user_id="ANZ-123223",
                     **{"distributions-TOTAL_FORMS": 4, "distributions-INITIAL_FORMS": 4})
    for i, row in enumerate(rows):
        form.update({f"distributions-{i}-id": row.pk, f"distributions-{i}-app": anz_ring.pk,
                     f"distributions-{i}-domain": row.domain_id, f"distributions-{i}-range_from": row.range_from,
                     f"distributions-{i}-range_to": "" if row.range_to is None else row.range_to})
    form["distributions-1-DELETE"] = "on"
    response = operator.post(f"/admin/apps_registry/clientapp/{anz_ring.pk}/change/", form)
    assert response.status_code == 200
    assert "ANZ users 1000000-2999999 would have no home domain" in response.content.decode()
    assert anz_ring.distributions.count() == 4

    # Widening the neighbour over the deleted row keeps everyone homed: saved.
    form["distributions-0-range_to"] = 2999999
    response = operator.post(f"/admin/apps_registry/clientapp/{anz_ring.pk}/change/", form)
    assert response.status_code == 302
    assert sorted(anz_ring.distributions.values_list("range_from", "range_to")) == [
        (0, 2999999), (3000000, 5999999), (6000000, None)]


def test_an_apps_first_distributions_are_free(operator):
    make_domain("domain-01")
    response = operator.post("/admin/apps_registry/clientapp/add/", _app_form(**{
        "distributions-TOTAL_FORMS": 1, "distributions-0-domain": Domain.objects.get().pk,
        "distributions-0-range_from": 0, "distributions-0-range_to": 99}))
    assert response.status_code == 302
    assert ClientApp.objects.get(app_name="KIWI").distributions.count() == 1


def test_a_domain_that_homes_users_cannot_be_deleted_and_the_admin_says_which_users(anz_ring, operator):
    domain = Domain.objects.get(name="domain-02")
    response = operator.post(f"/admin/apps_registry/domain/{domain.pk}/delete/", {"post": "yes"})
    text = response.content.decode()
    assert "protected" in text and "ANZ 1000000–2999999 @ domain-02" in text
    assert Domain.objects.filter(pk=domain.pk).exists()


def test_an_import_that_shrinks_an_apps_coverage_is_refused_naming_the_app_and_range(anz_ring):
    smaller = """
domains: [{name: domain-01}, {name: domain-02}, {name: domain-03}, {name: domain-04}]
clientApps:
  - appName: ANZ
    appId: app-id-343
    masterUserId: ANZ-123223
    authMode: none
    userDistributions:
      - {domainName: domain-01, from: 0, to: 999999}
      - {domainName: domain-03, from: 3000000}
"""
    with pytest.raises(ConfigError, match=r"clientApps\[0\] \(ANZ\): ANZ users 1000000-2999999 would have no home"):
        config_import(text=smaller)
    assert anz_ring.distributions.count() == 4  # nothing half-imported


def test_an_import_may_move_users_between_domains_and_give_a_new_app_any_coverage(anz_ring):
    config_import(text="""
domains: [{name: domain-01}, {name: domain-02}]
clientApps:
  - appName: ANZ
    appId: app-id-343
    masterUserId: ANZ-123223
    authMode: none
    userDistributions:
      - {domainName: domain-02, from: 0, to: 2999999}
      - {domainName: domain-01, from: 3000000}
  - {appName: NEW, appId: new-app, masterUserId: NEW-1, authMode: none,
     userDistributions: [{domainName: domain-01, from: 0, to: 9}]}
""")
    assert sorted(anz_ring.distributions.values_list("range_from", "domain__name")) == [
        (0, "domain-02"), (3000000, "domain-01")]
    assert ClientApp.objects.get(app_name="NEW").distributions.count() == 1


def test_a_distributions_standby_is_set_in_the_admin_and_may_not_be_its_home(anz_ring, operator):
    row = _row(anz_ring, 3000000)
    url = f"/admin/apps_registry/userdistribution/{row.pk}/change/"
    fields = {"app": anz_ring.pk, "domain": row.domain.pk, "range_from": 3000000, "range_to": 5999999}
    refused = operator.post(url, {**fields, "standby": row.domain.pk})
    assert refused.status_code == 200
    assert "The standby must be another domain than the home (domain-03)" in refused.content.decode()
    assert operator.post(url, {**fields, "standby": Domain.objects.get(name="domain-04").pk}).status_code == 302
    row.refresh_from_db()
    assert row.standby.name == "domain-04"
    assert "domain-04" in operator.get("/admin/apps_registry/userdistribution/").content.decode()
