"""Load test of the server REST API: sends per second and their latency.

    python -m bench.rest --url http://127.0.0.1:8000 --key KEY --feature RELIABLE --concurrency 32 --duration 20

`--concurrency` clients (one keep-alive HTTP/1.1 connection each) send back to back for
`--duration` seconds (the first `--warmup` seconds left out of the figures): each a `POST
/api/v1/messages` to one user of `--app-name` (cycling over `--users` users from `--user-base`)
with a `--payload`-character content and an Idempotency-Key of its own, or with `--channel NAME` a
`POST /api/v1/channels/NAME/messages`, or with `--batch N` a `POST /api/v1/messages/batch` of N
such messages (each with an idempotencyKey; sends then count messages, latency is the call's).
Latency is the request's round trip. Any answer but
200/201 counts as an error, by status (429 means the app's API rate limit, not the server's
capacity: raise the app's `api_rate_limit_per_second` / `api_rate_limit_burst` for a benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from bench.model import percentile


@dataclass
class RestConfig:
    url: str
    key: str
    feature: str = "RELIABLE"
    concurrency: int = 32
    duration: float = 20.0
    warmup: float = 2.0
    app_name: str = "ANZ"
    user_base: int = 600000
    users: int = 200
    payload: int = 1000
    channel: str | None = None
    batch: int = 0  # messages per POST /api/v1/messages/batch; 0: one message per POST /api/v1/messages


@dataclass
class RestResult:
    config: RestConfig
    sends: int = 0  # successful, after the warmup
    sends_per_second: float = 0.0
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


def _request(config: RestConfig, n: int, content: str) -> tuple[str, dict]:
    if config.channel:
        return f"/api/v1/channels/{config.channel}/messages", {"content": content}
    to = f"{config.app_name}-{config.user_base + n % config.users}"
    return "/api/v1/messages", {"to": to, "content": content, "feature": config.feature}


class KeepAlive:
    """One keep-alive HTTP/1.1 connection, the load generator's: far less CPU per request than a
    general client (on a machine the server shares, the generator's CPU is taken from the server)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{self.host}:{self.port}", **headers}.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(f"POST {path} HTTP/1.1\r\n{self.head}{extra}Content-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        try:
            status_line = await self.reader.readline()
            if not status_line:
                raise ConnectionError("closed by the server")
            length = 0
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            return int(status_line.split()[1]), await self.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.writer.close()
            self.writer = None
            raise

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _sender(config: RestConfig, index: int, start: float, end: float, latencies: list[float],
                  errors: Counter, counted_from: float) -> None:
    client = KeepAlive(config.url, {"Authorization": f"Bearer {config.key}"})
    n = index
    try:
        while time.monotonic() < end:
            if config.batch:
                messages = [{**_request(config, n + i * config.concurrency, f"{index}.{n}.{i}|".ljust(config.payload, "x"))[1],
                             "idempotencyKey": uuid.uuid4().hex} for i in range(config.batch)]
                path, body = "/api/v1/messages/batch", {"messages": messages}
                n += config.concurrency * config.batch
            else:
                path, body = _request(config, n, f"{index}.{n}|".ljust(config.payload, "x"))
                n += config.concurrency
            sent = time.monotonic()
            refused = 0
            try:
                code, answer = await client.post(path, body, {"Idempotency-Key": uuid.uuid4().hex})
                status = str(code) if code not in (200, 201) else None
                if status is None and config.batch:
                    refused = sum("error" in r for r in json.loads(answer)["results"])
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                status = type(exc).__name__
            done = time.monotonic()
            if sent < counted_from or sent < start:
                continue
            if status is None:
                latencies.extend([(done - sent) * 1000] * ((config.batch or 1) - refused))
                if refused:
                    errors["refused in a batch"] += refused
            else:
                errors[status] += 1
    finally:
        client.close()


async def run(config: RestConfig) -> RestResult:
    start = time.monotonic()
    counted_from, end = start + config.warmup, start + config.duration
    latencies: list[float] = []
    errors: Counter = Counter()
    await asyncio.gather(*(_sender(config, i, start, end, latencies, errors, counted_from)
                           for i in range(config.concurrency)))
    window = max(1e-9, end - counted_from)
    ordered = sorted(latencies)
    return RestResult(config=config, sends=len(ordered), sends_per_second=round(len(ordered) / window, 1),
                      latency_ms={f"p{p}": None if not ordered else round(percentile(ordered, p), 2)
                                  for p in (50, 90, 95, 99)} | {"max": round(ordered[-1], 2) if ordered else None},
                      errors=dict(errors))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", required=True, help="an API key of the app (manage.py apikey create ANZ)")
    parser.add_argument("--feature", choices=["RELIABLE", "FAST"], default="RELIABLE")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of sending, the warmup included")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--app-name", default="ANZ")
    parser.add_argument("--user-base", type=int, default=600000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--payload", type=int, default=1000)
    parser.add_argument("--channel", help="publish on this channel instead of sending to users")
    parser.add_argument("--batch", type=int, default=0, help="messages per POST /api/v1/messages/batch (0: single sends)")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args(argv)
    config = RestConfig(url=args.url, key=args.key, feature=args.feature, concurrency=args.concurrency,
                        duration=args.duration, warmup=args.warmup, app_name=args.app_name, user_base=args.user_base,
                        users=args.users, payload=args.payload, channel=args.channel, batch=args.batch)
    result = asyncio.run(run(config))
    what = f"channel {config.channel}" if config.channel else config.feature + (f" in batches of {config.batch}"
                                                                                   if config.batch else "")
    print(f"{what}: {result.sends} sends in {config.duration - config.warmup:.0f} s = {result.sends_per_second}/s "
          f"with {config.concurrency} concurrent; latency ms {result.latency_ms}; errors {result.errors or 'none'}")
    if args.json:
        data = asdict(result)
        data["config"]["key"] = config.key.partition(".")[0] + ".…"  # the prefix only: files get shared
        with open(args.json, "w") as fh:
            json.dump(data, fh, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
