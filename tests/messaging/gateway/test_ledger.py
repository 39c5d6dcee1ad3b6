"""A connection's delivery ledger (messaging.gateway.connection.ledger): what counts as delivered, and what
goes back to the mailbox. Plain synchronous code: no socket, no database."""

from __future__ import annotations

from messaging.gateway.connection.ledger import DeliveryLedger, Settled

CLAIM, NEW_CLAIM = 7001, 7002


def _push(ledger: DeliveryLedger, *deliveries: int, position: int | None, closing: bool = False,
          refused: tuple[int, ...] = ()) -> Settled:
    """A message.deliver event of `deliveries` (message id = delivery id + 1000); the socket takes
    every frame but those in `refused`."""
    for delivery_id in deliveries:
        if ledger.admit(delivery_id, delivery_id + 1000, CLAIM, closing=closing):
            if delivery_id in refused:
                ledger.not_written(delivery_id, CLAIM)
            else:
                ledger.wrote(delivery_id, delivery_id + 1000, CLAIM)
    return ledger.batch_end(position)


def test_a_linker_clients_delivery_counts_once_every_byte_of_its_batch_has_left_the_node():
    ledger = DeliveryLedger(acks=False, window=10)
    assert _push(ledger, 1, 2, position=500) == Settled()
    assert _push(ledger, 3, position=800) == Settled()
    assert ledger.flushed(499) == []
    assert ledger.flushed(500) == [1, 2]
    assert ledger.flushed(900) == [3]


def test_without_a_flush_report_a_written_delivery_counts_once_queued():
    ledger = DeliveryLedger(acks=False, window=10)
    assert _push(ledger, 1, 2, position=None) == Settled(delivered=[1, 2])


def test_a_delivery_written_before_is_not_written_again_and_is_confirmed_again_once_flushed():
    ledger = DeliveryLedger(acks=False, window=10)
    _push(ledger, 1, position=100)
    assert ledger.admit(1, 1001, NEW_CLAIM) is False
    assert ledger.batch_end(100) == Settled()  # still on its way out: its mark comes with the flush
    ledger.flushed(100)
    assert ledger.admit(1, 1001, NEW_CLAIM) is False
    assert ledger.batch_end(100) == Settled(delivered=[1])  # its first mark may have been lost


def test_a_frame_the_socket_did_not_take_goes_back_to_the_mailbox_under_its_claim():
    ledger = DeliveryLedger(acks=False, window=10)
    assert _push(ledger, 1, 2, position=100, refused=(2,)) == Settled(released=[(2, CLAIM)])
    assert ledger.flushed(100) == [1]


def test_a_closing_connection_writes_nothing_more_and_gives_pushes_back():
    ledger = DeliveryLedger(acks=False, window=10)
    assert _push(ledger, 1, 2, position=100, closing=True) == Settled(released=[(1, CLAIM), (2, CLAIM)])


def test_in_ack_mode_a_delivery_counts_when_acked_and_a_stray_ack_is_left_to_the_database():
    ledger = DeliveryLedger(acks=True, window=10)
    assert _push(ledger, 1, 2, position=100) == Settled()
    assert ledger.flushed(100) == []  # written is not delivered for an ACK-mode client
    assert ledger.acked([1001, 5555]) == ([1], [5555])
    assert ledger.admit(1, 1001, NEW_CLAIM) is False  # acknowledged: never written again


def test_the_ack_window_gives_back_what_does_not_fit():
    ledger = DeliveryLedger(acks=True, window=2)
    assert _push(ledger, 1, 2, 3, position=100) == Settled(released=[(3, CLAIM)])
    assert ledger.fetch_room(50) == 0


def test_a_delivery_in_flight_that_is_pushed_again_is_kept_under_its_new_claim():
    ledger = DeliveryLedger(acks=True, window=10)
    _push(ledger, 1, position=100)
    assert ledger.admit(1, 1001, NEW_CLAIM) is False
    assert ledger.close(100) == Settled(released=[(1, NEW_CLAIM)])


def test_a_fetch_skips_what_is_written_or_in_flight():
    linker = DeliveryLedger(acks=False, window=10)
    _push(linker, 1, 2, position=100)
    assert linker.skip_ids() == [1, 2] and linker.fetch_room(50) == 50
    acking = DeliveryLedger(acks=True, window=10)
    _push(acking, 3, position=100)
    assert acking.skip_ids() == [3] and acking.fetch_room(50) == 9


def test_a_linker_fetch_claims_nothing_so_a_frame_it_could_not_write_goes_nowhere():
    ledger = DeliveryLedger(acks=False, window=10)
    ledger.wrote(1, 1001, None)
    ledger.not_written(2, None)
    assert ledger.batch_end(100) == Settled()
    assert ledger.close(100) == Settled(delivered=[1])  # flushed by the end: delivered, nothing to release


def test_at_the_end_what_left_the_node_is_delivered_and_everything_else_goes_back():
    linker = DeliveryLedger(acks=False, window=10)
    _push(linker, 1, position=100)
    _push(linker, 2, position=200)
    assert linker.close(150) == Settled(delivered=[1], released=[(2, CLAIM)])
    acking = DeliveryLedger(acks=True, window=10)
    _push(acking, 3, 4, position=100)
    acking.acked([1003])
    assert acking.close(100) == Settled(delivered=[], released=[(4, CLAIM)])
    assert acking.close(100) == Settled()  # nothing is given back twice


def test_the_memory_of_written_deliveries_is_bounded_in_both_modes():
    linker = DeliveryLedger(acks=False, window=10, memory=3)
    _push(linker, 1, 2, 3, 4, 5, position=None)
    assert list(linker.written) == [3, 4, 5]
    acking = DeliveryLedger(acks=True, window=10, memory=3)
    _push(acking, 1, 2, 3, 4, 5, position=None)
    acking.acked([1001, 1002, 1003, 1004, 1005])
    assert list(acking.written) == [3, 4, 5]


def test_a_second_row_of_a_message_in_flight_is_not_written_and_is_delivered_with_the_first_ack():
    ledger = DeliveryLedger(acks=True, window=10)
    _push(ledger, 1, position=None)
    assert ledger.admit(2, 1001, NEW_CLAIM) is False  # delivery 2: the same message (1001) by another way
    assert ledger.batch_end(None) == Settled()
    assert 2 in ledger.skip_ids()  # a fetch neither brings it nor counts it as missing
    assert ledger.acked([1001]) == ([1, 2], [])


def test_a_second_row_of_a_message_already_acked_counts_as_delivered_at_once():
    ledger = DeliveryLedger(acks=True, window=10)
    _push(ledger, 1, position=None)
    ledger.acked([1001])
    assert ledger.twin(2, 1001, NEW_CLAIM) is True  # (what a fetch asks of each row it brings)
    assert ledger.batch_end(None) == Settled(delivered=[2])


def test_a_second_row_goes_back_to_the_mailbox_with_the_first_when_the_connection_ends_unacked():
    ledger = DeliveryLedger(acks=True, window=10)
    _push(ledger, 1, position=None)
    ledger.admit(2, 1001, NEW_CLAIM)
    assert ledger.close(None) == Settled(released=[(1, CLAIM), (2, NEW_CLAIM)])


def test_a_linker_clients_second_row_of_a_message_counts_once_the_first_has_left_the_node():
    ledger = DeliveryLedger(acks=False, window=10)
    ledger.admit(1, 1001, CLAIM)
    ledger.wrote(1, 1001, CLAIM)
    assert ledger.admit(2, 1001, NEW_CLAIM) is False  # in the same batch
    assert ledger.batch_end(100) == Settled()
    assert ledger.flushed(100) == [1, 2]
    assert ledger.admit(3, 1001, NEW_CLAIM) is False  # a third, after the first has left
    assert ledger.batch_end(100) == Settled(delivered=[3])
