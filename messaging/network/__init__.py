"""The domain network: deliveries, confirmations and channel publishes forwarded hop by hop to the
domains where their recipients live (ARCHITECTURE.md "Cluster and domains", issue 18).

- `models`: each link's live health as this domain sees it; the channel publishes' flood queue.
- `transport`: the one door for calls to a neighbour and the check of calls from one (signed with
  the link's shared secret, foundation.signed_calls).
- `links`: where to send next (shortest path over enabled links that are up, around domains the
  item has already passed through) and the recording of each link's health.
"""
