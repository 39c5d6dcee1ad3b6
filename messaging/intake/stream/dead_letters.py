"""An app's dead-letter stream `sbq:<APPNAME>:dead`, bounded in bytes.

A dead letter is what the operator needs to see why an entry was refused, not the entry itself:
its `entry` id, its `reason` ("<error code>: <detail>", cut to REASON_MAX bytes) and a copy of its
first fields (names and values, in order) of at most QUEUE_DEAD_LETTER_BYTES; when anything was cut
or left out, `truncated` says how much was kept ("kept 2 of 3000 fields, 4030 of 6144000 bytes").
So a dead letter holds at most LETTER_MAX_BYTES of Redis memory, whatever the entry held (an entry
of thousands of 2 KB fields once made each dead letter megabytes).

The stream keeps the newest dead_letters_maxlen() letters: QUEUE_DEAD_MAX_BYTES divided by the
most one letter can hold (655 at the defaults), trimmed exactly at each write, so it never holds
more than QUEUE_DEAD_MAX_BYTES. When it is full, the oldest dead letters are trimmed: their entries
were refused anyway (nothing that was accepted is lost), and the newest say best what the writer
does wrong now.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from django.conf import settings

from foundation.transport.queue_names import dead_key

REASON_MAX = 512  # bytes of the reason kept (a detail may quote the entry: an unknown field's name)
# What one field costs besides its name and value, in an entry's size and in a dead letter's budget:
# about what a consumer's Python spends on a field it keeps (two bytes objects and a dict slot; Redis
# spends a few bytes), so an entry of 200,000 empty fields counts as the 13 MB it costs a reader, and
# a dead letter of many empty fields is as bounded as one of a few long ones.
FIELD_COST = 64
# The letter's own fields (entry, reason, truncated) and Redis's overhead per entry and per node.
LETTER_OVERHEAD = 1024
RESERVED = (b"entry", b"reason", b"truncated")  # the letter's own fields: an entry's fields of these names are left out


@dataclass(frozen=True)
class Oversized:
    """An entry too large to read whole (intake.stream.reader): the copy of its first fields a dead
    letter keeps (fields_copy), and what it held: `size` bytes (entry_size) in `count` fields."""

    kept: dict[bytes, bytes]
    size: int
    count: int


def entry_size(fields: dict[bytes, bytes]) -> int:
    """An entry's size as the intake counts it: its names and values, and FIELD_COST per field."""
    return sum(len(k) + len(v) + FIELD_COST for k, v in fields.items())


def fields_copy(fields: dict[bytes, bytes], budget: int) -> dict[bytes, bytes]:
    """The first fields of `fields` whose cost (entry_size) fits `budget`; the first that does not
    fit is cut to what is left (its name and as much of its value as fit), the rest are left out."""
    kept: dict[bytes, bytes] = {}
    for name, value in fields.items():
        room = budget - FIELD_COST - len(name)
        if room < 0:
            break
        kept[name] = value[:room]
        budget -= FIELD_COST + len(name) + len(kept[name])
        if len(kept[name]) < len(value):
            break
    return kept


def letter_max_bytes() -> int:
    """The most Redis memory one dead letter takes: the copy, the letter's own fields, and a
    quarter more for the allocator's rounding (jemalloc's size classes)."""
    return (settings.QUEUE_DEAD_LETTER_BYTES + LETTER_OVERHEAD) * 5 // 4


def dead_letters_maxlen() -> int:
    """How many dead letters an app's stream keeps: as many of the largest as QUEUE_DEAD_MAX_BYTES holds."""
    return max(1, settings.QUEUE_DEAD_MAX_BYTES // letter_max_bytes())


def dead_letter_add(pipe: redis.client.Pipeline, app_name: str, entry_id: bytes,
                    raw: dict[bytes, bytes] | Oversized, reason: str) -> None:
    """Queue on `pipe` the dead letter of an entry (its fields as read, or an Oversized copy)."""
    if isinstance(raw, Oversized):
        size, count, source = raw.size, raw.count, raw.kept
    else:
        size, count, source = entry_size(raw), len(raw), raw
    fields = fields_copy({k: v for k, v in source.items() if k not in RESERVED}, settings.QUEUE_DEAD_LETTER_BYTES)
    kept_size = entry_size(fields)
    if len(fields) < count or kept_size < size:
        fields[b"truncated"] = f"kept {len(fields)} of {count} fields, {kept_size} of {size} bytes".encode()
    fields[b"entry"] = entry_id
    fields[b"reason"] = reason.encode()[:REASON_MAX]
    pipe.xadd(dead_key(app_name), fields, maxlen=dead_letters_maxlen(), approximate=False)
