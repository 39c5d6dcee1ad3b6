"""Clients that behave as the protocol page's "good client" under load, for system tests that
restart or kill web nodes under them (tests/system/test_rolling_restart.py).

- `Peer`: one ACK-mode user, in a thread of its own, through the load balancer. It sends RELIABLE
  messages to other peers, each with a clientMessageId, ACKs every message as it arrives, and on any
  close it did not ask for reconnects with jitter, authenticates again, fetches what it missed and
  resends what never got a MESSAGE_ACCEPTED (same clientMessageId: stored once). It records what a
  user would see: what was accepted, every delivery (and whether it came again after its ACK), and
  every close code. With a `fast_rate` it also sends FAST messages (best effort, never stored: no
  clientMessageId, no MESSAGE_ACCEPTED, no ACK), counted apart from the RELIABLE ones.
- `Master`: the app's master user, reconnecting the same way; it keeps the view a master app
  would (ONLINE_USERS pages, then USER_CONNECTED / USER_DISCONNECTED in order) and a timed log of
  it, so a test can tell when a user left that view.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.wsclient import WsClient

FETCH_COUNT = 500
RECV_SLICE = 0.05


def reconnect_pause(rng: random.Random, attempt: int) -> float:
    """Jitter before a reconnect: a random 0.2-0.8 s, doubling after failed attempts (up to 4 s).
    Shorter than the protocol page's advice, to keep the test quick; spread out all the same."""
    return min(4.0, rng.uniform(0.2, 0.8) * (2 ** min(attempt, 3)))


def close_code(exc: ConnectionClosed) -> int:
    """The code the server closed with; 1006 when the connection dropped without a close frame."""
    return exc.rcvd.code if exc.rcvd is not None else 1006


@dataclass
class Sent:
    to: str
    content: str
    message_id: str | None = None  # from MESSAGE_ACCEPTED
    at: float = field(default_factory=time.monotonic)  # when it was first sent


@dataclass
class Record:
    sent: dict[str, Sent] = field(default_factory=dict)  # clientMessageId -> what and whether accepted
    deliveries: Counter = field(default_factory=Counter)  # message id -> MESSAGE frames received
    contents: dict[str, str] = field(default_factory=dict)  # message id -> content
    first_seen: dict[str, float] = field(default_factory=dict)  # content -> when it first arrived
    seen: set[str] = field(default_factory=set)  # every content received (ids differ per domain, contents do not)
    # What this client ACKed, by content where a message has one (a message keeps its content across
    # domains, not its id: a standby that takes a user over numbers its messages its own way).
    acked: set[str] = field(default_factory=set)
    after_ack: list[str] = field(default_factory=list)  # delivered again after their ACK had left
    acked_where: dict[str, tuple[float, str]] = field(default_factory=dict)  # key -> (when, URL) of its ACK
    # Each delivery again after an ACK: (key, when and where it was ACKed, when and where it came again).
    again: list[tuple[str, float, str, float, str]] = field(default_factory=list)
    close_codes: list[int] = field(default_factory=list)  # every close this client did not ask for
    problems: list[dict] = field(default_factory=list)  # INVALID_MESSAGE, GENERAL_ERROR, refusals
    left_missing: int | None = None  # the last FETCH_MISSING_MESSAGES_COMPLETE's count
    sessions: int = 0  # connections authenticated
    connected_at: list[float] = field(default_factory=list)
    redirects: list[str] = field(default_factory=list)  # where AUTH_CLIENT refusals sent it
    # Each time a connection was lost (not asked for): how long until it was authenticated again, anywhere.
    outages: list[float] = field(default_factory=list)
    outage_spans: list[tuple[float, float]] = field(default_factory=list)  # (lost, back): monotonic times
    # FAST messages (never stored, so in none of the above): each sent one's content, each received one's.
    fast_sent: list[str] = field(default_factory=list)
    fast_seen: list[str] = field(default_factory=list)


class Peer(threading.Thread):
    def __init__(self, user: str, url: str, recipients: list[str], rate: float, *, fallbacks: tuple[str, ...] = (),
                 fast_rate: float = 0.0):
        """`fallbacks`: other domains' URLs, tried in turn while `url` cannot be reached at all (a
        domain that does not serve the user redirects it to the one that does). `fast_rate`: FAST
        messages per second, besides the RELIABLE ones (none by default)."""
        super().__init__(daemon=True, name=user)
        self.user, self.url, self.rate = user, url, rate
        self.fallbacks = list(fallbacks)
        self.recipients = [r for r in recipients if r != user]
        self.rng = random.Random(user)
        self.lock = threading.Lock()
        self.record = Record()
        self.sending = threading.Event()
        self.fetch_asked = threading.Event()
        self._leave = threading.Event()
        self.connected = threading.Event()
        self.left_at: float | None = None
        self.fast_rate = fast_rate
        self.fast_rng = random.Random(f"{user} fast")  # its own: the RELIABLE sends stay as they are without FAST
        self._counter = 0
        self._fast_counter = 0

    # --- asked by the test -------------------------------------------------------------------

    def leave(self) -> float:
        """Close normally and never come back; the moment the user left."""
        self._leave.set()
        self.join(15)
        assert self.left_at is not None, f"{self.user} did not leave"
        return self.left_at

    def fetch(self) -> None:
        """Fetch again (until leftMissingCount is 0), as a client does after a doubt."""
        with self.lock:
            self.record.left_missing = None
        self.fetch_asked.set()

    def unaccepted(self) -> list[str]:
        with self.lock:
            return [cmid for cmid, s in self.record.sent.items() if s.message_id is None]

    def accepted(self) -> dict[str, str]:
        """Message id -> recipient, of every message the server accepted from this peer."""
        with self.lock:
            return {s.message_id: s.to for s in self.record.sent.values() if s.message_id is not None}

    def received(self) -> set[str]:
        with self.lock:
            return set(self.record.deliveries)

    # --- the client ----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a bug of this client, or a frame it cannot read: the test fails on it
            self._problem({"crashed": repr(exc)})
            raise

    def _run(self) -> None:
        attempt, url, lost_at = 0, self.url, None
        redirected = False  # the last refusal was followed: the next one is not (no ping-pong)
        while not self._leave.is_set():
            try:
                client = WsClient(url)
            except (OSError, TimeoutError, InvalidHandshake) as exc:  # InvalidStatus: HAProxy's 503
                self._problem({"connect": repr(exc)})
                urls = [self.url, *self.fallbacks]
                attempt, url = attempt + 1, urls[(urls.index(url) + 1) % len(urls)] if url in urls else self.url
                time.sleep(reconnect_pause(self.rng, attempt))
                continue
            try:
                reply = client.auth(self.user, acks=True)
                if reply["data"]["isAuthenticated"] is True:
                    attempt, redirected = 0, False
                    if lost_at is not None:
                        self.record.outages.append(time.monotonic() - lost_at)
                        self.record.outage_spans.append((lost_at, time.monotonic()))
                    lost_at = None
                    self._session(client)
                    return  # left
                self._problem(reply)
                client.close()
                redirect = reply["data"].get("redirect")
                if redirect and redirect != url and not redirected:  # at once, as a client does (once)
                    self.record.redirects.append(redirect)
                    url, redirected = redirect, True
                    continue
                url, redirected = self.url, False
            except ConnectionClosed as exc:
                with self.lock:
                    self.record.close_codes.append(close_code(exc))
                url = self.url  # home first: it redirects where its users are served now
            except TimeoutError as exc:
                self._problem({"timeout": str(exc)[:300]})
                client.close()
            finally:
                if self.connected.is_set() and lost_at is None:
                    lost_at = time.monotonic()
                self.connected.clear()
            if self._leave.is_set():
                break
            attempt += 1
            time.sleep(reconnect_pause(self.rng, attempt))
        self.left_at = self.left_at or time.monotonic()  # not connected when told to leave

    def _session(self, client: WsClient) -> None:
        self.connected.set()
        self.record.sessions += 1
        self.record.connected_at.append(time.monotonic())
        client.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": FETCH_COUNT})
        for cmid in self.unaccepted():  # sent on a connection that closed before MESSAGE_ACCEPTED
            sent = self.record.sent[cmid]
            client.message(sent.to, sent.content, clientMessageId=cmid)
        next_send = next_fast = time.monotonic()
        while True:
            if self._leave.is_set():
                self.left_at = time.monotonic()
                client.close()
                return
            if self.fetch_asked.is_set():
                self.fetch_asked.clear()
                client.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": FETCH_COUNT})
            now = time.monotonic()
            if self.rate and self.sending.is_set() and now >= next_send:
                self._send_new(client)
                next_send = max(next_send + 1 / self.rate, now - 1.0)
            if self.fast_rate and self.sending.is_set() and now >= next_fast:
                self._send_fast(client)
                next_fast = max(next_fast + 1 / self.fast_rate, now - 1.0)
            try:
                frame = json.loads(client.ws.recv(timeout=RECV_SLICE))
            except TimeoutError:
                continue
            self._handle(client, frame)

    def _send_new(self, client: WsClient) -> None:
        self._counter += 1
        cmid = f"{self.user}-{self._counter}"
        to = self.rng.choice(self.recipients)
        sent = Sent(to=to, content=f"{self.user} to {to} #{self._counter}")
        with self.lock:
            self.record.sent[cmid] = sent  # before sending: a close while sending leaves it to resend
        client.message(to, sent.content, clientMessageId=cmid)

    def _send_fast(self, client: WsClient) -> None:
        """One FAST message: sent once, never again (nothing tells the sender whether it arrived)."""
        self._fast_counter += 1
        to = self.fast_rng.choice(self.recipients)
        content = f"{self.user} to {to} fast {self._fast_counter}"  # no " #": not a RELIABLE counter
        client.message(to, content, feature="FAST")
        with self.lock:
            self.record.fast_sent.append(content)

    def _handle(self, client: WsClient, frame: dict) -> None:
        kind, data = frame["type"], frame.get("data") or {}
        if kind == "MESSAGE" and data.get("id") is None and "content" in data:  # FAST: no id, nothing to ACK
            with self.lock:
                self.record.fast_seen.append(data["content"])
        elif kind == "MESSAGE_ACCEPTED":
            with self.lock:
                self.record.sent[data["clientMessageId"]].message_id = data["id"]
        elif kind in ("MESSAGE", "MESSAGE_CONFIRMATION") and "id" in data:
            message_id = data["id"]
            key = data.get("content") or message_id
            with self.lock:
                if key in self.record.acked:
                    self.record.after_ack.append(message_id)
                    self.record.again.append((key, *self.record.acked_where[key], time.monotonic(), client.url))
                self.record.deliveries[message_id] += 1
                self.record.contents[message_id] = data.get("content", "")
                self.record.first_seen.setdefault(data.get("content", ""), time.monotonic())
                self.record.seen.add(data.get("content", ""))
            client.send("ACK", {"ids": [message_id]})  # raises if the socket closed: not ACKed
            with self.lock:
                self.record.acked.add(key)
                self.record.acked_where.setdefault(key, (time.monotonic(), client.url))
        elif kind == "FETCH_MISSING_MESSAGES_COMPLETE":
            with self.lock:
                self.record.left_missing = data["leftMissingCount"]
            if data["leftMissingCount"] > 0:
                client.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": FETCH_COUNT})
        elif kind in ("INVALID_MESSAGE", "GENERAL_ERROR", "AUTH_REQUIRED"):
            self._problem(frame)

    def _problem(self, what: dict) -> None:
        with self.lock:
            self.record.problems.append(what)


class Master(threading.Thread):
    """The master user's view, kept across its own reconnects; `log` holds (time, view) after
    every snapshot and every notice, in order."""

    def __init__(self, user: str, url: str):
        super().__init__(daemon=True, name=user)
        self.user, self.url = user, url
        self.rng = random.Random(user)
        self.lock = threading.Lock()
        self.online: set[str] = set()
        self.log: list[tuple[float, frozenset[str]]] = []
        self.close_codes: list[int] = []
        self.snapshots = 0
        self.problems: list[str] = []
        self.notices: list[tuple[float, str, str | None]] = []  # (when, type, user) as they came
        self._done = threading.Event()

    def view(self) -> set[str]:
        with self.lock:
            return set(self.online)

    def stop(self) -> None:
        self._done.set()
        self.join(15)

    def run(self) -> None:
        attempt = 0
        while not self._done.is_set():
            try:
                with WsClient(self.url) as client:
                    reply = client.auth(self.user)
                    if reply["data"]["isAuthenticated"] is True:
                        attempt = 0
                        self._follow(client)
                        return
                    self.problems.append(f"refused: {reply}")
            except ConnectionClosed as exc:
                self.close_codes.append(close_code(exc))
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                self.problems.append(repr(exc))
            except Exception as exc:
                self.problems.append(f"crashed: {exc!r}")
                raise
            attempt += 1
            time.sleep(reconnect_pause(self.rng, attempt))

    def _follow(self, client: WsClient) -> None:
        pages = [client.recv()]
        while pages[-1]["type"] == "ONLINE_USERS" and pages[-1]["data"]["page"] < pages[-1]["data"]["pages"]:
            pages.append(client.recv())
        if {p["type"] for p in pages} != {"ONLINE_USERS"}:
            raise AssertionError(f"no snapshot after AUTH_CLIENT_REPLY: {pages}")
        self._apply(set().union(*(p["data"]["users"] for p in pages)))
        self.snapshots += 1
        while not self._done.is_set():
            try:
                frame = json.loads(client.ws.recv(timeout=0.2))
            except TimeoutError:
                continue
            user = frame.get("data", {}).get("userId")
            self.notices.append((time.monotonic(), frame["type"], user))
            if frame["type"] == "USER_CONNECTED":
                self._apply(self.view() | {user})
            elif frame["type"] == "USER_DISCONNECTED":
                self._apply(self.view() - {user})

    def _apply(self, online: set[str]) -> None:
        with self.lock:
            self.online = online
            self.log.append((time.monotonic(), frozenset(online)))

    def gone_since(self, user: str) -> float | None:
        """Since when the view has lacked `user` for good (None while the view still lists it)."""
        with self.lock:
            since = None
            for at, online in self.log:
                if user in online:
                    since = None
                elif since is None:
                    since = at
            return since
