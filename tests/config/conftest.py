"""The one-database network of domains (tests/network.py), for readiness in a network."""

from tests.network import net, net_ring  # noqa: F401  (fixtures)
