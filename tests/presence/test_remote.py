"""What a domain holds of the other domains' online users: a newer list replaces an older one
(whatever way each came), says who arrived and who left, and dies with its time to live."""

from __future__ import annotations

import time

from presence.remote import remote_apply, remote_heard_of, remote_lists, remote_online_sync


def test_a_newer_list_replaces_the_older_and_says_who_arrived_and_who_left(redis_client):
    first = remote_apply(app_name="RM0", domain="domain-03", version=10, users=["ANZ-3000001", "ANZ-3000002"], ttl=30)
    assert (first.applied, first.arrived, first.left) == (True, ["ANZ-3000001", "ANZ-3000002"], [])
    second = remote_apply(app_name="RM0", domain="domain-03", version=11, users=["ANZ-3000002", "ANZ-3000003"], ttl=30)
    assert (second.arrived, second.left) == (["ANZ-3000003"], ["ANZ-3000001"])
    assert remote_online_sync("RM0", "domain-03", "ANZ-3000003") and not remote_online_sync("RM0", "domain-03", "ANZ-3000001")


def test_an_older_list_heard_by_a_longer_way_changes_nothing(redis_client):
    remote_apply(app_name="RM1", domain="domain-03", version=20, users=["ANZ-3000001"], ttl=30)
    late = remote_apply(app_name="RM1", domain="domain-03", version=19, users=[], ttl=30)
    assert late.applied is False
    assert [(r.domain, r.version, r.users) for r in remote_lists("RM1")] == [("domain-03", 20, ["ANZ-3000001"])]


def test_a_domain_not_heard_of_for_its_time_to_live_has_nobody_online(redis_client):
    remote_apply(app_name="RM2", domain="domain-04", version=1, users=["ANZ-6000001"], ttl=1)
    remote_apply(app_name="RM2", domain="domain-02", version=1, users=[], ttl=30)  # heard of: nobody online
    assert remote_heard_of("RM2", "domain-02") and not remote_online_sync("RM2", "domain-02", "ANZ-1000001")
    time.sleep(1.2)
    assert not remote_heard_of("RM2", "domain-04")
    assert not remote_online_sync("RM2", "domain-04", "ANZ-6000001")
    assert [r.domain for r in remote_lists("RM2")] == ["domain-02"]
