"""Message id blocks (docs/architecture.md, "One id per message")."""

# A message has one id in every domain that holds it: each domain draws the ids of the messages
# stored there first from a block of its own, block N being the ids from N * 2**MESSAGE_ID_BLOCK_BITS
# up (its Domain.number; block 0 for a domain with none, as every id was before), and a copy of a
# message elsewhere keeps that id (messaging.core.store.carried_id_sql). The largest number keeps
# every id below 2**53, so a client that reads ids as JSON numbers (JavaScript's) reads them exactly.
MESSAGE_ID_BLOCK_BITS = 40
MESSAGE_ID_BLOCK_SIZE = 1 << 40  # (ids per block: 2**MESSAGE_ID_BLOCK_BITS)
DOMAIN_NUMBER_MAX = 8191  # (2**(53 - MESSAGE_ID_BLOCK_BITS) - 1)
