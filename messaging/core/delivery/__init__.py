"""The delivery state machine: pending -> sent -> delivered, with retrying / dead / expired.

One room per thing that happens to a delivery (docs/architecture.md, "A RELIABLE message"):

- `claims`: a routing task (or an ACK-mode fetch) claims what it pushes; what it then does with a
  claim it holds (park for an offline recipient, release what never reached a reader);
- `delivered`: written or ACKed: delivered, and the MESSAGE_CONFIRMATIONs asked for;
- `retry`: a push that failed or was never confirmed: an attempt counted, retried with backoff;
- `dead_letters`: attempts used up: dead, announced; an operator's re-queue and discard;
- `dead_nodes`: what was in flight to the connections of a node presence declared dead;
- `fetch`: a recipient's missing messages, in mailbox order;
- `expiry`: retention ends what was never delivered;
- `sql`: the states as SQL, and the row lock every transition takes first.

Every transition is one conditional statement whose WHERE clause names the states it may leave
(and, for a claimed row, the claim it acts for), so two actors racing (a worker claiming while a
fetch delivers, a duplicate task after a worker crash, a late park after a re-claim) cannot move a
row backwards: the loser's statement simply matches nothing. What the row's timer and `attempts`
mean is written in messaging.models.
"""
