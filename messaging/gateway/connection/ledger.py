"""One connection's delivery ledger: which stored messages it wrote, holds in flight, has not yet
flushed, and had acknowledged, and from that, which deliveries count as delivered and which go back
to the mailbox. Plain synchronous code, no I/O: the consumer writes frames and hands what the
ledger settles to the node's batchers.

What it guarantees the client:
- a delivery is written to it once, whether it comes by push or by fetch (`admit` refuses what it
  wrote or holds in flight; `skip_ids` keeps a fetch from fetching them again);
- so is a message: a second delivery row of a message it wrote or holds (its twin: a message that
  reached the mailbox by two ways around a takeover, messaging.federation) is not written, and takes
  the first one's fate: delivered with it, or back to the mailbox with it;
- a linker (non-ACK) client's delivery counts as delivered once its frame has left the node: the
  transport reports how many bytes have gone (`flushed`), and a batch of frames counts once every
  byte up to its end has. Without that report (no outgoing buffer) it counts once queued;
- an ACK-mode client's delivery counts once ACKed; at most `window` wait for their ACK at once,
  and a push beyond that goes back to the mailbox;
- whatever the connection held but its client never got (frames still queued on the node, or not
  ACKed) goes back to the mailbox under the claim it came with when the connection ends (`close`),
  no attempt counted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

WRITTEN_MEMORY = 5000  # recently written delivery ids kept (dedupe, and a fetch's skip list)


@dataclass
class Settled:
    """What the ledger decided: deliveries that now count as delivered, and (delivery id, claim)
    pairs that go back to the mailbox."""

    delivered: list[int] = field(default_factory=list)
    released: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Unflushed:
    position: int  # the connection's byte count once this batch's frames were queued
    delivery_ids: list[int]
    claims: list[tuple[int, int]]  # (delivery id, claim) of pushed rows: given back if never flushed


class DeliveryLedger:
    def __init__(self, *, acks: bool, window: int, memory: int = WRITTEN_MEMORY) -> None:
        self.acks = acks
        self.window = window
        self.memory = memory
        self.written: OrderedDict[int, None] = OrderedDict()  # written (and, in ACK mode, ACKed)
        self.inflight: dict[int, tuple[int, int | None]] = {}  # ACK mode: delivery id -> (message id, claim)
        self._inflight_by_message: dict[int, int] = {}
        self._written_messages: OrderedDict[int, int] = OrderedDict()  # message id -> its delivery written
        self._twins: dict[int, list[tuple[int, int | None]]] = {}  # delivery id -> twins (id, claim) awaiting it
        self._unflushed: deque[_Unflushed] = deque()
        self._unflushed_ids: set[int] = set()
        self._batch_ids: list[int] = []  # written in the batch under way (linker clients)
        self._batch_claims: list[tuple[int, int]] = []
        self._pending = Settled()

    # --- a batch of writes: a push event, or a fetch -------------------------------------------

    def admit(self, delivery_id: int, message_id: int, claim: int, *, closing: bool = False) -> bool:
        """A pushed delivery: True when its frame is to be written now. Otherwise the ledger settles
        it: held in flight already (re-claimed: it will be released under the new claim), written
        already (confirmed again once flushed: its first mark may have been lost), or no room (the
        connection is closing, or the ACK window is full): back to the mailbox."""
        if delivery_id in self.inflight:
            self.inflight[delivery_id] = (message_id, claim)
            return False
        if delivery_id in self.written:
            if delivery_id not in self._unflushed_ids:
                self._pending.delivered.append(delivery_id)
            return False
        if self.twin(delivery_id, message_id, claim):
            return False
        if closing or (self.acks and len(self.inflight) >= self.window):
            self._pending.released.append((delivery_id, claim))
            return False
        return True

    def twin(self, delivery_id: int, message_id: int, claim: int | None) -> bool:
        """Whether the message of this delivery is one the connection wrote or holds under another
        delivery: then it is not written again, and the ledger settles it with that one (delivered
        now if that one is, else when it is; back to the mailbox if that one goes back)."""
        first = self._inflight_by_message.get(message_id)
        if first is None:
            first = self._written_messages.get(message_id)
        if first is None or first == delivery_id:
            return False
        if first in self.inflight or first in self._unflushed_ids or first in self._batch_ids:
            self._twins.setdefault(first, []).append((delivery_id, claim))
        else:
            self._pending.delivered.append(delivery_id)
        return True

    def _with_twins(self, delivery_ids: list[int]) -> list[int]:
        """`delivery_ids` (now delivered) and the twins that waited on them."""
        if not self._twins:
            return delivery_ids
        twins = [t for d in delivery_ids for t, _ in self._twins.pop(d, ())]
        return [*delivery_ids, *twins] if twins else delivery_ids

    def wrote(self, delivery_id: int, message_id: int, claim: int | None) -> None:
        """The delivery's frame was queued on the socket (`claim`: None for a linker client's fetch,
        which claims nothing)."""
        if self.acks:
            self.inflight[delivery_id] = (message_id, claim)
            self._inflight_by_message[message_id] = delivery_id
            return
        self._written_messages[message_id] = delivery_id
        self._batch_ids.append(delivery_id)
        if claim is not None:
            self._batch_claims.append((delivery_id, claim))

    def not_written(self, delivery_id: int, claim: int | None) -> None:
        """The socket took nothing (closed, or cut off as a slow reader): back to the mailbox."""
        if claim is not None:
            self._pending.released.append((delivery_id, claim))

    def batch_end(self, position: int | None) -> Settled:
        """The batch is written; `position` is the connection's byte count now (None: the transport
        does not report flushes). What to confirm now and what to give back."""
        settled, self._pending = self._pending, Settled()
        ids, claims = self._batch_ids, self._batch_claims
        self._batch_ids, self._batch_claims = [], []
        if ids:
            self._remember(ids)
            if position is None:
                settled.delivered.extend(self._with_twins(ids))
            else:
                self._unflushed.append(_Unflushed(position, ids, claims))
                self._unflushed_ids.update(ids)
        return settled

    # --- what the transport and the client report ----------------------------------------------

    def flushed(self, position: int) -> list[int]:
        """The transport has written `position` bytes to the socket: the deliveries whose frames
        have all left the node now count as delivered."""
        done: list[int] = []
        while self._unflushed and self._unflushed[0].position <= position:
            done.extend(self._unflushed.popleft().delivery_ids)
        if done:
            self._unflushed_ids.difference_update(done)
        return self._with_twins(done)

    def acked(self, message_ids: Iterable[int]) -> tuple[list[int], list[int]]:
        """An ACK: (deliveries held in flight here, now delivered; message ids not in flight here,
        e.g. ACKed after a reconnect, which the caller looks up in the database)."""
        known, strays = [], []
        for message_id in message_ids:
            delivery_id = self._inflight_by_message.pop(message_id, None)
            if delivery_id is None:
                strays.append(message_id)
                continue
            self.inflight.pop(delivery_id, None)
            self._written_messages[message_id] = delivery_id
            known.append(delivery_id)
        self._remember(known)
        return self._with_twins(known), strays

    # --- fetches ---------------------------------------------------------------------------------

    def fetch_room(self, count: int) -> int:
        """How many of `count` requested messages a fetch may bring: in ACK mode, what is in flight
        is not fetched again, and the window bounds it."""
        return max(0, min(count, self.window - len(self.inflight))) if self.acks else count

    def skip_ids(self) -> list[int]:
        """Deliveries a fetch must neither send again nor count as missing."""
        return [*self.written, *self.inflight, *(t for twins in self._twins.values() for t, _ in twins)]

    # --- the end ---------------------------------------------------------------------------------

    def close(self, position: int | None) -> Settled:
        """The connection ended, having flushed `position` bytes: what left the node counts as
        delivered; everything else it held goes back to the mailbox under its claim."""
        delivered = self.flushed(position) if position is not None else []
        released = [c for entry in self._unflushed for c in entry.claims]
        released += [(d, claim) for d, (_, claim) in self.inflight.items() if claim is not None]
        # (the twins of what flushed went with it; those of what goes back go back too)
        released += [(t, claim) for twins in self._twins.values() for t, claim in twins if claim is not None]
        self._twins.clear()
        self._unflushed.clear()
        self._unflushed_ids.clear()
        self.inflight.clear()
        self._inflight_by_message.clear()
        return Settled(delivered=delivered, released=released)

    def _remember(self, delivery_ids: list[int]) -> None:
        for delivery_id in delivery_ids:
            self.written[delivery_id] = None
        while len(self.written) > self.memory:
            self.written.popitem(last=False)
        while len(self._written_messages) > self.memory:
            self._written_messages.popitem(last=False)
