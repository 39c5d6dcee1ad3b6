"""The client's retry wait: base x 2^(failures-1) up to a cap, less a jitter.

A copy of the platform's foundation.backoff.Backoff (its `seconds`), so that this package imports
nothing of the server: tests/clients/test_python_package.py checks that the two wait alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """The wait before the next try after `failures` failures in a row: base x 2^(failures-1), at
    most `cap`, times a random factor in [1 - jitter, 1]. jitter 0: exact."""

    base: float
    cap: float
    jitter: float = 0.5

    def seconds(self, failures: int) -> float:
        wait = min(self.cap, self.base * 2 ** min(max(failures - 1, 0), 62))
        return wait * (1 - self.jitter * random.random())
