"""The consumer's XREADGROUP, read with a bound on what it holds of any entry.

Redis bounds an entry only by a command's size (client-query-buffer-limit, 1 GB by default; a field
by proto-max-bulk-len, 512 MB), and redis-py holds a whole reply in memory before it parses it: a
worker whose consumer read a writer's 64 MB entry grew by 260 MB at its peak (the reply, its parse,
the text decoded, the checks' copies). An entry of a gigabyte would take some four: more than a
worker has, and the worker that reclaimed the entry 30 s later would die the same way. So the
consumer reads on a connection of its own (EntryReader) and parses the reply here, as it arrives:

- an entry of at most QUEUE_INTAKE_ENTRY_MAX_BYTES (dead_letters.entry_size: its names and values,
  64 bytes a field) is kept whole;
- of a larger one only the copy a dead letter keeps is kept (an `Oversized`: its first
  QUEUE_DEAD_LETTER_BYTES); the rest is read off the socket in 64 KiB pieces and dropped.

What a consumer holds of one batch is then at most QUEUE_INTAKE_BATCH entries of
QUEUE_INTAKE_ENTRY_MAX_BYTES, and no more than the stream holds (its cap: gate.py). Redis itself
still builds the whole reply in its output buffer, as for any read: a huge entry costs Redis its
size once more while it is sent, and a writer can put one there only until the gate closes.

The connection speaks RESP2 and takes the intake's Redis URL (`redis://`, `rediss://` with
`ssl_cert_reqs` and `ssl_ca_certs`, `unix://`; user, password and database from the URL).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence

import redis
from django.conf import settings

from messaging.intake.stream.dead_letters import FIELD_COST, Oversized, fields_copy

CHUNK = 64 * 1024  # bytes taken from the socket at a time
LINE_MAX = 1024  # a RESP header line (`*3`, `$12`, `-ERR …`) longer than this is not Redis talking
ID_MAX = 64  # bytes of an entry id or a key kept (ids are at most 41 characters; keys are ours)

Entry = tuple[bytes, dict[bytes, bytes] | Oversized | None]  # (id, fields); None: deleted before it was read


def _error(line: bytes) -> redis.RedisError:
    text = line.decode(errors="replace")
    if text.startswith("NOPERM"):
        return redis.exceptions.NoPermissionError(text)
    if text.startswith(("NOAUTH", "WRONGPASS")):
        return redis.exceptions.AuthenticationError(text)
    return redis.exceptions.ResponseError(text)


def _packed(*args: object) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class EntryReader:
    """XREADGROUP on a connection of its own (connected at first use, again after any error),
    keeping of each entry at most what the module's docstring says."""

    def __init__(self, url: str, *, name: str = "sbq-reader", socket_timeout: float = 10.0,
                 connect_timeout: float = 5.0):
        self.url = url
        self.name = name  # the connection's name in Redis's CLIENT LIST
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._pos = 0

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock, self._buf, self._pos = None, bytearray(), 0

    def read(self, *, group: str, consumer: str, streams: Sequence[tuple[str, str]], count: int,
             block_ms: int | None = None) -> list[tuple[bytes, list[Entry]]]:
        """XREADGROUP GROUP group consumer COUNT count [BLOCK block_ms] STREAMS (key, id)…: per
        stream that answered, its key and its entries."""
        args: list[object] = ["XREADGROUP", "GROUP", group, consumer, "COUNT", count]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        args += ["STREAMS", *(key for key, _ in streams), *(entry_id for _, entry_id in streams)]
        try:
            self._send(_packed(*args))
            return self._streams()
        except redis.exceptions.ResponseError:
            if self._sock is not None and self._pos == len(self._buf):
                raise  # an error reply, read whole: the connection is still good
            self.close()
            raise
        except ValueError as exc:  # a length that is not a number: not Redis talking
            self.close()
            raise redis.exceptions.InvalidResponse(f"queue intake read: {exc}") from exc
        except (OSError, redis.RedisError) as exc:
            self.close()  # part of a reply may be unread: this connection is done
            if isinstance(exc, socket.timeout):
                raise redis.exceptions.TimeoutError("queue intake read timed out") from exc
            if isinstance(exc, OSError):
                raise redis.exceptions.ConnectionError(f"queue intake read: {exc}") from exc
            raise
        except BaseException:
            self.close()
            raise

    # --- the connection ---------------------------------------------------------------------

    def _connect(self) -> None:
        opts = redis.connection.parse_url(self.url)
        if "path" in opts:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout)
            sock.connect(opts["path"])
        else:
            sock = socket.create_connection((opts.get("host", "localhost"), opts.get("port", 6379)),
                                            timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if opts.get("connection_class") is redis.connection.SSLConnection:
                context = ssl.create_default_context(cafile=opts.get("ssl_ca_certs"))
                if opts.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
                    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=opts.get("host"))
        sock.settimeout(self.socket_timeout)
        self._sock, self._buf, self._pos = sock, bytearray(), 0
        try:
            if opts.get("password"):
                user = [opts["username"]] if opts.get("username") else []
                self._simple(_packed("AUTH", *user, opts["password"]))
            if opts.get("db"):
                self._simple(_packed("SELECT", opts["db"]))
            self._simple(_packed("CLIENT", "SETNAME", self.name))
        except BaseException:
            self.close()  # never a connection half made (on another database)
            raise

    def _send(self, data: bytes) -> None:
        if self._sock is None:
            self._connect()
        self._sock.sendall(data)

    def _simple(self, command: bytes) -> None:
        self._sock.sendall(command)
        line = self._line()
        if line[:1] == b"-":
            raise _error(line[1:])

    # --- the reply ----------------------------------------------------------------------------

    def _fill(self) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        chunk = self._sock.recv(CHUNK)
        if not chunk:
            raise redis.exceptions.ConnectionError("Redis closed the queue intake's read connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(b"\r\n", self._pos)
            if end >= 0:
                line = bytes(self._buf[self._pos:end])
                self._pos = end + 2
                return line
            if len(self._buf) - self._pos > LINE_MAX:
                raise redis.exceptions.InvalidResponse("queue intake read: a reply line with no end")
            self._fill()

    def _header(self, kind: bytes) -> int | None:
        """The length of the array or bulk string that starts here (None for a null one)."""
        line = self._line()
        if line[:1] == b"-":
            raise _error(line[1:])
        if line[:1] != kind:
            raise redis.exceptions.InvalidResponse(f"queue intake read: {kind!r} expected, got {line[:40]!r}")
        n = int(line[1:])
        return None if n < 0 else n

    def _bulk(self, keep: int, cut: int | None = None) -> tuple[bytes, int]:
        """The next bulk string, whole if it is at most `keep` bytes long, else its first `cut` bytes
        (`keep` by default); and its length. What is not kept is read and dropped."""
        length = self._header(b"$")
        if length is None:
            return b"", 0
        keep = length if length <= keep else max(0, min(keep if cut is None else cut, length))
        end = self._pos + length + 2
        if end <= len(self._buf):  # all here already: the usual case
            data = bytes(self._buf[self._pos:self._pos + keep])
            self._pos = end
            return data, length
        kept = bytearray()
        left = length + 2  # bytes of this string (and its CRLF) still to pass
        while left:
            if self._pos >= len(self._buf):
                self._buf.clear()
                self._pos = 0
                self._fill()
            take = min(len(self._buf) - self._pos, left)
            want = keep - len(kept)
            if want > 0:
                kept += self._buf[self._pos:self._pos + min(take, want)]
            self._pos += take
            left -= take
        return bytes(kept), length

    def _streams(self) -> list[tuple[bytes, list[Entry]]]:
        n = self._header(b"*")
        out = []
        for _ in range(n or 0):
            self._header(b"*")  # (key, entries)
            key, _ = self._bulk(ID_MAX)
            entries = []
            cap = settings.QUEUE_INTAKE_ENTRY_MAX_BYTES
            for _ in range(self._header(b"*") or 0):
                entry = self._entry_buffered(cap)
                if entry is None:  # not all here yet, or over the cap: string by string
                    self._header(b"*")  # (id, fields)
                    entry_id, _ = self._bulk(ID_MAX)
                    flat = self._header(b"*")
                    if flat is not None and flat % 2:
                        raise redis.exceptions.InvalidResponse("queue intake read: an entry of an odd field count")
                    entry = (entry_id, None if flat is None else self._fields(flat // 2))
                entries.append(entry)
            out.append((key, entries))
        return out

    def _entry_buffered(self, cap: int) -> tuple[bytes, dict[bytes, bytes]] | None:
        """The next entry, when the whole of it is in the buffer already and within the cap (most
        entries of a batch: a read brings 64 KiB at a time); None, having consumed nothing, otherwise.
        The parse of _header and _bulk without a call per string: a batch of small entries is read
        about three times faster."""
        buf, end, pos = self._buf, len(self._buf), self._pos
        if buf[pos:pos + 5] != b"*2\r\n$":  # (id, fields), the id first
            return None
        eol = buf.find(b"\r\n", pos + 5, pos + 32)
        if eol < 0:
            return None
        start = eol + 2
        stop = start + int(buf[pos + 5:eol])
        if not start <= stop <= start + ID_MAX or buf[stop + 2:stop + 3] != b"*":
            return None
        entry_id = bytes(buf[start:stop])
        eol = buf.find(b"\r\n", stop + 3, stop + 32)
        if eol < 0:
            return None
        strings = int(buf[stop + 3:eol])
        if strings <= 0 or strings % 2:
            return None  # no fields (deleted while pending): the string-by-string path says so
        pos = eol + 2
        size = FIELD_COST * (strings // 2)
        values = []
        for _ in range(strings):
            if buf[pos:pos + 1] != b"$":
                return None
            eol = buf.find(b"\r\n", pos + 1, pos + 32)
            if eol < 0:
                return None
            start = eol + 2
            stop = start + int(buf[pos + 1:eol])
            size += stop - start
            if stop < start or stop + 2 > end or size > cap:
                return None
            values.append(bytes(buf[start:stop]))
            pos = stop + 2
        self._pos = pos
        return entry_id, dict(zip(values[::2], values[1::2], strict=True))

    def _fields(self, pairs: int) -> dict[bytes, bytes] | Oversized:
        """An entry's `pairs` fields: whole while they fit QUEUE_INTAKE_ENTRY_MAX_BYTES; from the
        field that passes it, an Oversized (the copy a dead letter keeps; the rest read and dropped)."""
        cap = settings.QUEUE_INTAKE_ENTRY_MAX_BYTES
        fields: dict[bytes, bytes] = {}
        size = 0
        over: dict[bytes, bytes] | None = None  # the dead letter's copy, once past the cap
        letter = settings.QUEUE_DEAD_LETTER_BYTES
        for _ in range(pairs):
            # A string longer than the room left puts the entry over the cap: only a dead letter's worth of it is kept.
            room = 0 if over is not None else max(0, cap - size)
            name, name_len = self._bulk(room, cut=letter)
            value, value_len = self._bulk(room - len(name), cut=letter)
            size += name_len + value_len + FIELD_COST
            if over is None:
                fields[name] = value
                if size > cap:
                    over = fields_copy(fields, letter)
                    fields = {}
        return fields if over is None else Oversized(over, size, pairs)
