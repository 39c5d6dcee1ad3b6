"""A hand-back holds off only the feed to the home it hands back to (migration messaging 0030,
messaging.federation.standby.feed_turn): before, it locked the whole feed table across its
call to the home, and every store whose deliveries fed any standby waited for that call."""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from messaging.federation.models import StandbyFeed
from messaging.federation.standby.feed_turn import feed_in_turn

pytestmark = pytest.mark.django_db(transaction=True)


def _feed_row(standby: str) -> None:
    """A change joins the feed to `standby`, in a transaction that waits at most half a second for a turn."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL lock_timeout = '500ms'")
        StandbyFeed.objects.create(standby=standby, delivery_id=1, new=True, created_at=timezone.now())


def test_while_a_hand_back_holds_the_feed_to_its_home_only_changes_fed_there_wait():
    taken, release = threading.Event(), threading.Event()

    def hand_back() -> None:
        try:
            with transaction.atomic():
                feed_in_turn("domain-03")
                taken.set()
                release.wait(10)
        finally:
            connection.close()

    handing_back = threading.Thread(target=hand_back)
    handing_back.start()
    try:
        assert taken.wait(10)
        _feed_row("domain-01")  # another standby's feed goes on
        with pytest.raises(OperationalError, match="lock timeout"):
            _feed_row("domain-03")
    finally:
        release.set()
        handing_back.join()
    _feed_row("domain-03")  # its turn is free again
    assert sorted(StandbyFeed.objects.values_list("standby", flat=True)) == ["domain-01", "domain-03"]
