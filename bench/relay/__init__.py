"""The benchmark baselines: a hand-built Channels relay with no persistence, over the core or the pub/sub
channel layer (see bench/README.md)."""
