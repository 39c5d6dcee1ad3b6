"""Who is online travels between domains: each domain tells its neighbours its own list and what it
heard of the others (never a neighbour's own list back to it), and a malformed list refuses the call."""

from __future__ import annotations

import pytest

from messaging.federation.presence_gossip import presence_gossip
from messaging.federation.wire.forward_payload import payload_parse
from messaging.federation.wire.transport import PeerRefused
from presence.remote import remote_apply, remote_lists

pytestmark = pytest.mark.django_db


def test_a_round_tells_each_neighbour_this_domains_list_and_what_it_heard_but_never_its_own(net):
    remote_apply(app_name="ANZ", domain="domain-03", version=5, users=["ANZ-3000001"], ttl=30)
    with net.at("domain-02"):
        assert presence_gossip() == {"domain-01": "ok", "domain-03": "ok"}
    told = {c.peer: {(i["domain"], tuple(i["users"])) for i in c.payload["presence"]}
            for c in net.calls if "presence" in c.payload}
    assert ("domain-03", ("ANZ-3000001",)) in told["domain-01"]
    assert {d for d, _ in told["domain-03"]} == {"domain-02"}  # not its own list back
    assert {d for d, _ in told["domain-01"]} == {"domain-02", "domain-03"}
    assert "domain-02" in {r.domain for r in remote_lists("ANZ")}  # domain-01 took domain-02's list


@pytest.mark.parametrize("item, reason", [
    ({"app": "ANZ", "domain": "domain-03", "version": -1, "users": []}, "version must be a whole number"),
    ({"app": "ANZ", "domain": "domain-03", "version": 1, "users": [7]}, "users must be a list"),
    ({"app": "ANZ", "domain": "", "version": 1, "users": []}, "app and domain must be names"),
])
def test_a_malformed_list_refuses_the_call_with_its_reason(net, item, reason):
    with pytest.raises(PeerRefused) as refused:
        payload_parse(sender="domain-02", payload={"presence": [item]})
    assert refused.value.status == 400 and reason in refused.value.reason
