"""The one-database network of domains (tests/network.py): fixtures `net` (a line, 01 - 02 - 03)
and `net_ring` (the seed's ring)."""

from __future__ import annotations

from tests.network import net, net_ring  # noqa: F401  (fixtures)
