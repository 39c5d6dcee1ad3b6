"""Redis pub/sub ignores the database number: the names a process publishes and subscribes on carry
its database (foundation.transport.redis_clients.pubsub_namespace), so domains sharing one Redis
server (`make network`, the test ring beside the suite) never hear each other's channel publishes."""

from __future__ import annotations

from messaging.channels import registry


def test_a_channels_fanout_name_carries_the_redis_database(settings):
    settings.REDIS_URL = "redis://:pw@127.0.0.1:6379/7"
    assert registry.fanout_key(5, "news") == "/7.sb:ch:5:news"
    assert registry.fanout_parse("/7.sb:ch:5:news.sport") == (5, "news.sport")


def test_a_publish_of_another_database_is_not_read_as_a_channel_publish(settings):
    settings.REDIS_URL = "redis://127.0.0.1:6379/8"
    assert registry.fanout_key(5, "news") == "/8.sb:ch:5:news"
    assert registry.fanout_parse("/7.sb:ch:5:news") is None
    settings.REDIS_URL = "redis://127.0.0.1:6379"  # no number: database 0
    assert registry.fanout_key(5, "news") == "/0.sb:ch:5:news"
