"""The domain network: deliveries, confirmations and channel publishes forwarded hop by hop to the
domains where their recipients live (docs/architecture.md; docs/protocol.md, "Between domains").

- `models`: each link's live health as this domain sees it; the channel publishes' flood queue.
- `transport`: the one door for calls to a neighbour and the check of calls from one (signed with
  the link's shared secret, foundation.signed_calls).
- `links`: where to send next (shortest path over enabled links that are up, around domains the
  item has already passed through) and the recording of each link's health.
- `outbox`, `flood_sender`, `receipts`: a link's three senders (its deliveries, its channel
  publishes, its receipts), each on the outbound skeleton (foundation.outbound).
- `queue`, `receipt_queue`: what is queued on which link, and the sweep that moves queues off links
  that are down.
- `fast_forward`: FAST messages for users homed elsewhere, carried once, hop by hop, never stored
  (not on the skeleton: nothing waits, nothing is retried).
"""
