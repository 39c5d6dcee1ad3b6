"""A message has one id in every domain that holds it (issue 46, item 1): each domain draws the ids
of the messages stored there first from the block of its number (apps_registry Domain.number), and
every copy of a message elsewhere keeps that id: forwarded on the way to its recipient, merged into
a standby's mailboxes when it takes its home's users over, and merged back home after the hand-back.

On the one-database network (tests/network.py), domains are given their numbers as make network
gives them (each schema's table has a sequence of its own, as each domain has its own database);
domain-01 is left out (its table is the test database's own, whose sequence other tests may move).
"""

from __future__ import annotations

import pytest

from apps_registry.config_io import config_export, config_import
from apps_registry.models import MESSAGE_ID_BLOCK_BITS, Domain
from messaging.federation.standby.mailbox_merge import Copied, mailbox_merge
from messaging.federation.takeover.take import hand_back, take_over
from messaging.models import Message
from tests.messaging.federation.test_takeover import copy_now, lost
from tests.network import Network

pytestmark = pytest.mark.django_db

ALICE, BOB, CAROL, ERIN, DAVE = "ANZ-17", "ANZ-1000003", "ANZ-3000007", "ANZ-3000008", "ANZ-6000001"
FAR = CAROL  # homed on domain-03


def block(message_id: int) -> int:
    return message_id >> MESSAGE_ID_BLOCK_BITS


def numbered(net: Network, numbers: tuple[int, ...] = (2, 3, 4)) -> Network:
    """domain-0N given number N the way an operator gives it: its row in the registry written while
    its own database is in use (the YAML import, the meta pull or the admin do it so)."""
    for n in numbers:
        domain = f"domain-0{n}"
        with net.at(domain):
            Domain.objects.filter(name=domain).update(number=n)
    return net


def ids_by_content(net: Network, domain: str) -> dict[str, int]:
    with net.at(domain):
        return dict(Message.objects.values_list("content", "id"))


def test_a_domain_given_its_number_draws_its_message_ids_from_its_block_and_never_goes_back(net):
    numbered(net)
    first = net.send(BOB, ALICE, "one", at="domain-02")
    assert first == 2 << MESSAGE_ID_BLOCK_BITS
    with net.at("domain-02"):
        Domain.objects.filter(name="domain-02").update(number=2)  # written again (every meta pull may)
    assert net.send(BOB, ALICE, "two", at="domain-02") == first + 1
    # Another domain's row changes nothing here.
    with net.at("domain-03"):
        assert net.send(ERIN, CAROL, "three", at="domain-03") == 3 << MESSAGE_ID_BLOCK_BITS


def test_a_message_from_a_numbered_domain_has_its_id_in_every_domain_on_its_way(net):
    numbered(net)
    sent = net.send(BOB, [ALICE, FAR], "to both sides", at="domain-02")
    net.pump()
    assert block(sent) == 2
    # Forwarded to domain-01 (no number) and domain-03 (number 3): the recipients see the sender's id.
    assert net.copy("domain-01", sent, origin="domain-02").id == sent
    assert net.copy("domain-03", sent, origin="domain-02").id == sent
    assert net.row("domain-03", sent, FAR).state == "pending"  # in FAR's mailbox by that id
    # And the receipts find their way back by it: delivered at home is delivered at the origin.
    net.deliver(FAR, at="domain-03")
    net.pump()
    assert net.row("domain-02", sent, FAR).state == "delivered"


def test_a_message_from_a_domain_without_a_number_gets_an_id_of_its_own_elsewhere_as_before(net):
    numbered(net, (3, 4))
    sent = net.send(BOB, FAR, "from block 0", at="domain-02")
    net.pump()
    assert block(sent) == 0
    copy = net.copy("domain-03", sent, origin="domain-02")
    assert copy.id != sent and block(copy.id) == 3


def test_a_message_keeps_its_id_at_the_standby_that_takes_its_user_over_and_at_home_after_the_hand_back(
        standby_ring):
    net = numbered(standby_ring, (3, 4))
    before = {"before from 02": net.send(BOB, CAROL, "before from 02", at="domain-02"),
              "before from 03": net.send(ERIN, CAROL, "before from 03", at="domain-03")}
    net.pump()
    assert block(before["before from 03"]) == 3
    copy_now(net)
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    held = ids_by_content(net, "domain-04")
    assert held["before from 03"] == before["before from 03"]  # stored at home first: its home's id
    during = net.send(DAVE, CAROL, "during from 04", at="domain-04")  # stored first at the holder
    assert block(during) == 4
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"
    net.pump()
    home = ids_by_content(net, "domain-03")
    assert home["during from 04"] == during
    assert home["before from 03"] == before["before from 03"]
    # From domain-02 (no number, block 0): an id of its own in each domain, as before.
    assert block(before["before from 02"]) == 0
    assert block(home["before from 02"]) == 3 and block(held["before from 02"]) == 4


def test_a_copy_whose_id_is_in_this_domains_block_or_taken_here_gets_an_id_of_its_own(standby_ring):
    net = numbered(standby_ring)
    mine = net.send(DAVE, CAROL, "stored here first", at="domain-04")
    message = {"sender": ALICE, "kind": "direct", "content": "", "reference": "", "confirmation_requested": False}
    copies = [  # two domains given one number by mistake, and an id another message here has
        Copied(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-09", origin_message_id=mine + 1000,
               state="pending", message={**message, "content": "same block"}),
        Copied(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-08", origin_message_id=mine,
               state="pending", message={**message, "content": "same id"}),
    ]
    with net.at("domain-04"):
        assert mailbox_merge(copies).appended == 2
        stored = dict(Message.objects.values_list("content", "id"))
    assert stored["stored here first"] == mine
    assert stored["same block"] != mine + 1000 and stored["same id"] != mine
    assert block(stored["same block"]) == block(stored["same id"]) == 4


def test_a_database_that_came_with_its_domains_number_moves_its_ids_into_the_block_at_the_next_import(net):
    # The row was written elsewhere (make network copies domain-01's prepared database for the others;
    # a restore does the same): this database never saw it written.
    with net.at("domain-01"):
        Domain.objects.filter(name="domain-02").update(number=2)
    assert block(net.send(BOB, ALICE, "before the import", at="domain-02")) == 0
    with net.at("domain-02"):
        config_import(text=config_export(include_secrets=True))
    assert block(net.send(BOB, ALICE, "after the import", at="domain-02")) == 2
