"""The queue intake (issue 29): an app's backend puts sends on a Redis stream of its own,
`sbq:<APPNAME>:in`, with a Redis ACL user that may XADD to that stream and nothing else; the routing
workers consume every app's stream with one consumer group and store each entry as a send.

- names.py: the keys, the ACL user's name, the intake's Redis client;
- models.py: QueueCredential, an app's ACL user (its password's SHA-256 only);
- credentials.py: create, rotate, revoke; the ACL users re-applied from Postgres (`queue_acl_sync`);
- gate.py: each stream measured, its writer's +xadd taken away past the cap and given back when drained;
- reader.py: XREADGROUP on a connection of its own, never holding an entry over QUEUE_INTAKE_ENTRY_MAX_BYTES;
- consume.py: a batch of entries within the app's rate limit checked, stored (idempotent by entry id),
  pushed (FAST, at most once) or dead-lettered, then acked;
- dead_letters.py: the dead-letter stream, bounded in bytes, and what a dead letter keeps of its entry;
- runner.py: the consumer thread of a routing worker (reads, XAUTOCLAIM, rate-limit pauses, backoff);
- stats.py: the counts kept in Redis by the workers and read by /metrics.
"""
