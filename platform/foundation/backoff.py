"""The one retry wait of the platform: `Backoff`, base x 2^(failures-1) up to a cap, less a jitter.

Every wait before a retry is one: a link's retry time and a delivery's next attempt (as SQL too,
for statements that schedule the retry themselves), a webhook call's, a task's own retry, a
reconnect, a commit tried again. A wait that does not grow is a Backoff whose cap is its base.

Pure Python (random and a dataclass). The client package (clients/python), which imports nothing of
the server, keeps a copy of `seconds` (switchboard_client.backoff; tests/clients/test_python_package.py
checks the two wait alike). tests/config/test_side_doors.py finds an exponential wait written
anywhere else in the product.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """The wait before the next try after `failures` failures in a row: base x 2^(failures-1),
    at most `cap`, times a random factor in [1 - jitter, 1] so that what failed together (a
    recipient's backlog, a neighbour's queue) does not come back all at once. jitter 0: exact."""

    base: float
    cap: float
    jitter: float = 0.5

    def seconds(self, failures: int) -> float:
        wait = min(self.cap, self.base * 2 ** min(max(failures - 1, 0), 62))
        return wait * (1 - self.jitter * random.random())

    def sql(self, failures: str) -> str:
        """The same wait as an SQL interval, for statements that schedule the retry themselves;
        `failures` is an SQL expression (`d.attempts + 1`)."""
        base, cap, jitter = float(self.base), float(self.cap), float(self.jitter)
        return (f"make_interval(secs => least({cap!r}::float8, {base!r}::float8"
                f" * power(2::float8, least(greatest(({failures}) - 1, 0), 62)))"
                f" * (1 - {jitter!r}::float8 * random()))")
