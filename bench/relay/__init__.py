"""The benchmark baseline: a hand-built Channels relay with no persistence (see bench/README.md)."""
