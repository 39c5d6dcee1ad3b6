"""The domain network under ordinary faults: ACK-mode users on all four domains of a ring sending
RELIABLE messages to users homed on the other domains, while domains stop and start, web nodes are
killed and links are disabled and enabled, at random, for `--minutes`.

    python -m bench.network_faults [--minutes 5] [--users 3] [--rate 1.5] [--seed 7] [--json FILE]
    python -m bench.network_faults --standby [--failover 10] ...   # issue 27: domains lost and taken over
    python -m bench.network_faults --standby --wider [--fast-rate 1.5] ...   # issue 46, item 8: and more

The ring (devstack.ring) runs on databases of its own (`switchboard_faults_ring_*`, on the Postgres
server `make run` uses, dropped after) and a Redis server of its own. The users are the protocol
page's good clients (tests.loadclients.Peer: ACK every message, reconnect with jitter, fetch what
was missed, resend what was not accepted, with the same clientMessageId); each connects to its home
domain. One fault at a time, healed before the next: a domain (02, 03 or 04) stopped for 8-20 s; a
domain's web node killed (SIGKILL) and started again by the ring's crash watch; a link disabled on
the meta domain for 8-20 s. `--wider` adds the meta domain (01) to the domains stopped, and two
domains that are not neighbours (01 and 03, or 02 and 04) stopped together, which cuts the other
two off from each other meanwhile. At the end the sending stops, everything is healed, and the run waits for
the network to settle. It answers (exit 1 if any fails):

- every message the server accepted was delivered to its recipient (by its content: ids differ
  per domain);
- no message is dead on any domain;
- none was delivered again after the recipient's ACK had left it (in the killed web node's socket
  buffer an ACK can die with it: counted apart, as the rolling-restart test does; with `--standby`,
  so is an ACK read by a home in the copy lag before it was killed with SIGKILL (COPY_LAG_ALLOWED,
  or the lag read from its feed just before the kill when that was longer: an overloaded machine
  lags more; each kill's lag is in the run's `kills`), which its standby may never have been told
  of: what the issue allows a home lost without warning to lose);
- in every recipient's mailbox at its home, each sender's messages stand in the order they were
  sent (by the sender's counter in the content; with `--standby`, a message stored at its home in
  that copy lag before the home was killed is counted apart, bench.fault_order: its
  standby may never have had it, and the sender's next messages from there went first), and each
  message stands there once;
- every user's standby domain (make network's ring gives every range one) holds a live copy of
  the user's mailbox as it is at home (seq, content, state), once the copies have caught up.

`--standby` (issue 27) loses whole domains instead, one at a time, at random: stopped or killed with
SIGKILL for 5-40 s (the ring's FAILOVER_SECONDS is `--failover`, 10 s, so many are taken over by
their standby), each back and handed back before the next. The users follow redirects and, while
their home cannot be reached at all, try the other domains in turn (any of them redirects to the
domain that serves them); the run reports the longest time a user could not log in anywhere.

`--standby --wider` (issue 46, item 8) adds, each at least once a run (it goes on past `--minutes`
until each has happened), the faults of bench.standby_faults: the meta domain stopped and taken over
(`meta_stopped`), two domains that are not neighbours lost together (`pair`), and a domain killed
with SIGKILL while a hand-back is under way, the home (`handback_kill_home`) or its holder
(`handback_kill_holder`); each fault in `faults` has its `kind`. The first user of each domain also
sends FAST messages (`--fast-rate` a second, never stored): counted apart (`fast_sent`,
`fast_received`), in none of the RELIABLE checks; the run fails if any user got an error frame
(INVALID_MESSAGE, GENERAL_ERROR: `error_frames`) or a hand-back did not end (`still_held`) or a
process crashed (`crashes`: the ring's crash watch runs, as under `make network`). Logins refused
during a `pair` fault, where no domain can take the lost ones over, are counted apart
(`login_refused_in_pair_faults_seconds`) from the 15 s check.

It also reports how long the network took to settle and each accepted message's time from its
first send to its first arrival (p50, p99, max, how many over 10 s and 30 s): a message held at
its home for an earlier one from its origin (messaging.federation.order) shows there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from bench.fault_order import copy_lag_now, kill_window, order_in_kill_window, twice_in_a_mailbox
from bench.network import ring_ports
from bench.platform_proc import platform_env, private_redis
from bench.standby_faults import WiderFaults, acks_in_a_holder_lost, fast_report, wider_report
from devstack.ring import Ring
from devstack.ring_plan import DOMAIN_COUNT, STANDBY
from tests.loadclients import Peer
from tests.wsclient import WsClient

HOMES = {1: 10, 2: 1_000_010, 3: 3_000_010, 4: 6_000_010}  # the first user number used on each domain
FAULT_ENV = {"DEBUG": "false", "DRAIN_SECONDS": "1", "DRAIN_GRACE_SECONDS": "3", "FORWARD_SWEEP_SECONDS": "1",
             "LINK_PROBE_SECONDS": "1", "LINK_DOWN_AFTER_SECONDS": "3", "META_PULL_SECONDS": "2",
             "PRESENCE_HEARTBEAT_SECONDS": "1", "PRESENCE_NODE_TIMEOUT": "4"}
LINK_SQL = """update apps_registry_domainlink l set enabled = %s from apps_registry_domain d1, apps_registry_domain d2
               where l.n1_id = d1.id and l.n2_id = d2.id
                 and ((d1.name = %s and d2.name = %s) or (d1.name = %s and d2.name = %s))"""
RING_LINKS = [(1, 2), (2, 3), (3, 4), (1, 4)]
LOGIN_REFUSED_ALLOWED = 15.0  # seconds: issue 46, item 3 (--standby)
COPY_LAG_ALLOWED = 2.0
KILL_HOLD_MIN = 5.0  # seconds: the shortest a --standby fault keeps a domain away  # seconds: issue 27's copy target, the window a home killed without warning may lose


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Faults:
    def __init__(self, ring: Ring, rng: random.Random, *, wider: bool = False, standby: bool = False,
                 failover: float = 10.0):
        self.ring, self.rng, self.wider, self.standby = ring, rng, wider, standby
        self.log: list[dict] = []
        # (monotonic time, domain, its copy lag then: bench.fault_order.copy_lag_now) of each SIGKILL
        self.kills: list[tuple[float, str, float]] = []
        self.more = WiderFaults(self, failover) if standby and wider else None  # issue 46, item 8

    def covered(self) -> bool:
        """Whether every fault kind of the run has happened (--standby --wider: each at least once)."""
        return self.more is None or self.more.covered()

    def _name(self, n: int) -> str:
        return f"domain-0{n}"

    def one(self) -> None:
        if self.more is not None:
            return self.more.one()
        if self.standby:
            return self._domain_lost()
        kind = self.rng.choice(["stop", "stop", "two", "kill", "link"] if self.wider else ["stop", "kill", "link"])
        began = time.monotonic()
        if kind in ("stop", "two"):
            # One domain (02, 03 or 04; --wider: the meta, domain-01, too, the others keeping the
            # configuration they pulled), or (--wider) two that are not neighbours (01 and 03, or 02
            # and 04: the other two are cut off from each other meanwhile, and what they send each
            # other waits).
            if kind == "two":
                stopped = list(self.rng.choice([(1, 3), (2, 4)]))
            else:
                stopped = [self.rng.choice([1, 2, 3, 4] if self.wider else [2, 3, 4])]
            hold = self.rng.uniform(8, 20)
            names = " and ".join(self._name(n) for n in stopped)
            say(f"fault: {names} stopped for {hold:.0f} s")
            for n in stopped:
                self.ring.stop_domain(n)
            time.sleep(hold)
            for n in stopped:
                self.ring.start_domain(n)
            what = f"{names} stopped {hold:.0f} s"
        elif kind == "kill":
            n = self.rng.randint(1, DOMAIN_COUNT)
            web = self.ring.children[n][0]
            say(f"fault: the web node of {self._name(n)} killed")
            web.proc.kill()
            web.proc.wait(10)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not web.running():
                self.ring.restart_crashed()  # its crash watch: started again after a second
                time.sleep(0.5)
            if not web.running():
                raise SystemExit(f"the web node of {self._name(n)} did not come back")
            what = f"{self._name(n)} web node killed"
        else:
            a, b = self.rng.choice(RING_LINKS)
            hold = self.rng.uniform(8, 20)
            say(f"fault: link {self._name(a)} - {self._name(b)} disabled for {hold:.0f} s")
            self._link(a, b, False)
            time.sleep(hold)
            self._link(a, b, True)
            what = f"link {a}-{b} disabled {hold:.0f} s"
        self.log.append({"fault": what, "seconds": round(time.monotonic() - began, 1)})

    def kill_noted(self, n: int) -> None:
        """Note a SIGKILL about to be sent to domain n, with its copy lag (--standby) just before."""
        lag = copy_lag_now(self.ring, n, f"domain-0{STANDBY[n]}") if self.standby else 0.0
        self.kills.append((time.monotonic(), self._name(n), lag))

    def _domain_lost(self) -> None:
        """--standby: one whole domain (any) stopped, or its processes killed with SIGKILL, for 5-40 s;
        then, once it is back, wait until its standby has handed its users back (at most 90 s), so
        that a home and its holder are never both away (never two neighbours at once)."""
        n, crash, hold = self.rng.randint(1, DOMAIN_COUNT), self.rng.random() < 0.5, self.rng.uniform(5, 40)
        began = time.monotonic()
        say(f"fault: {self._name(n)} {'killed (SIGKILL)' if crash else 'stopped'} for {hold:.0f} s")
        if crash:
            self.kill_noted(n)
        (self.ring.kill_domain if crash else self.ring.stop_domain)(n)
        time.sleep(hold)
        taken = self._held(n)
        self.ring.start_domain(n)
        deadline = time.monotonic() + 90
        while self._held(n) and time.monotonic() < deadline:
            time.sleep(0.5)
        back = not self._held(n)
        say(f"  {self._name(n)} back; {'taken over, ' if taken else ''}"
            f"{'at home' if back else 'STILL HELD'} after {time.monotonic() - began:.0f} s")
        self.log.append({"kind": "lost", "fault": f"{self._name(n)} {'killed' if crash else 'stopped'} {hold:.0f} s",
                         "began": round(began, 1), "back": round(began + hold, 1),
                         "taken_over": taken, "handed_back": back if taken else None,
                         "seconds": round(time.monotonic() - began, 1)})

    def _held(self, n: int) -> bool:
        """Whether domain n's users are held by its standby, as the standby says (its own row: one per
        home and holder)."""
        with psycopg.connect(self.ring.database_url(STANDBY[n]), autocommit=True) as conn:
            return bool(conn.execute("select count(*) from apps_registry_takeover t join apps_registry_domain d"
                                     " on d.id = t.home_id join apps_registry_domain h on h.id = t.holder_id"
                                     " where d.name = %s and h.name = %s and t.held",
                                     [self._name(n), self._name(STANDBY[n])]).fetchone()[0])

    def _link(self, a: str | int, b: str | int, enabled: bool) -> None:
        with psycopg.connect(self.ring.database_url(1), autocommit=True) as conn:
            conn.execute(LINK_SQL, (enabled, self._name(a), self._name(b), self._name(b), self._name(a)))


class LoginProbe(threading.Thread):
    """A user of one home (sending nothing) logging in every PROBE_SECONDS: at its home, following a
    redirect, else at every other domain in turn; records each stretch in which no try succeeded.
    What the platform allowed, apart from how long a client waits between its tries (a Peer's
    pause grows to 4 s)."""

    PROBE_SECONDS = 0.5

    def __init__(self, user: str, urls: list[str]) -> None:
        super().__init__(daemon=True, name=f"probe-{user}")
        self.user, self.urls = user, urls
        self.stopping = threading.Event()
        self.spans: list[tuple[float, float]] = []  # (first failed try, next good one)

    def _login(self) -> bool:
        tried: set[str] = set()
        for url in self.urls:
            while url and url not in tried:
                tried.add(url)
                try:
                    client = WsClient(url)
                except Exception:  # noqa: BLE001  (down, or a 503 at the handshake)
                    break
                try:
                    reply = client.auth(self.user)
                except Exception:  # noqa: BLE001  (closed, or no answer)
                    break
                finally:
                    client.close()
                if reply["data"]["isAuthenticated"] is True:
                    return True
                url = reply["data"].get("redirect")
        return False

    def run(self) -> None:
        failing_since = None
        while not self.stopping.is_set():
            started = time.monotonic()
            if self._login():
                if failing_since is not None:
                    self.spans.append((failing_since, started))
                failing_since = None
            elif failing_since is None:
                failing_since = started
            self.stopping.wait(max(0.0, self.PROBE_SECONDS - (time.monotonic() - started)))


def _outages(peers: list[Peer]) -> list[dict]:
    """Every time a user could not log in anywhere for over 2 s: who, when (monotonic times, as the
    faults' `began` and `back`), how long; the longest first."""
    spans = [{"user": p.user, "lost": round(lost, 1), "back": round(back, 1), "seconds": round(back - lost, 1)}
             for p in peers for lost, back in p.record.outage_spans if back - lost > 2]
    return sorted(spans, key=lambda s: -s["seconds"])


def _users(per_domain: int) -> dict[int, list[str]]:
    return {n: [f"ANZ-{HOMES[n] + i}" for i in range(per_domain)] for n in HOMES}


def _settle(peers: list[Peer], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _missing(peers) and all(not p.unaccepted() for p in peers):
            return
        for peer in peers:
            peer.fetch()
        time.sleep(2)


def _missing(peers: list[Peer]) -> dict[str, list[str]]:
    by_user = {p.user: p for p in peers}
    received = {p.user: set(p.record.seen) for p in peers}
    missing: dict[str, list[str]] = {}
    for peer in peers:
        with peer.lock:
            accepted = [(s.to, s.content) for s in peer.record.sent.values() if s.message_id is not None]
        for to, content in accepted:
            if to in by_user and content not in received[to]:
                missing.setdefault(to, []).append(content)
    return missing


def _latency(peers: list[Peer]) -> dict:
    """How long accepted messages took from their first send to their first arrival (seconds):
    what a message held at its home for an earlier one costs shows here."""
    seen = {}
    for peer in peers:
        with peer.lock:
            seen.update(peer.record.first_seen)
    waits = []
    for peer in peers:
        with peer.lock:
            waits += [seen[s.content] - s.at for s in peer.record.sent.values()
                      if s.message_id is not None and s.content in seen]
    if not waits:
        return {}
    waits.sort()
    at = lambda q: round(waits[min(len(waits) - 1, int(q * len(waits)))], 2)  # noqa: E731
    return {"p50": at(0.5), "p99": at(0.99), "max": round(waits[-1], 2),
            "over_10_s": sum(w > 10 for w in waits), "over_30_s": sum(w > 30 for w in waits)}


def _copy_mismatch(ring: Ring, users: dict[int, list[str]], timeout: float = 60,
                   detail: dict | None = None) -> dict[str, int]:
    """Per domain: how many rows of its users' mailboxes the standby's live copy does not hold as
    they are at home (content and state, in mailbox order: after a takeover the home and the standby
    number the messages each their own way), once every feed has drained (at most `timeout`).
    `detail`, if given, takes the rows only one side has (at most 20 a domain).

    A copy that differs is looked at again once the feeds have drained again, until it agrees or
    `timeout` is over: after a backlog the users are still reading (and acknowledging) what came
    late as the check runs, and a state changed at home after the feeds were found empty is on its
    way to the standby, not lost (session 24: 764 rows differed at the check, none minutes later)."""
    deadline = time.monotonic() + timeout
    while True:
        _feeds_drained(ring, deadline)
        wrong = _copies_differing(ring, users, detail)
        if not wrong or time.monotonic() >= deadline:
            return wrong
        time.sleep(2)


def _feeds_drained(ring: Ring, deadline: float) -> None:
    while time.monotonic() < deadline:
        waiting = 0
        for n in ring.domains():
            with psycopg.connect(ring.database_url(n), autocommit=True) as conn:
                waiting += conn.execute("select count(*) from messaging_standbyfeed").fetchone()[0]
        if not waiting:
            return
        time.sleep(1)


def _copies_differing(ring: Ring, users: dict[int, list[str]], detail: dict | None) -> dict[str, int]:
    wrong = {}
    if detail is not None:
        detail.clear()
    for n in ring.domains():
        home_sql = ("select d.recipient, m.content, d.state from messaging_delivery d join messaging_message m"
                    " on m.id = d.message_id where d.recipient = any(%s) and d.forward_to = ''"
                    " order by d.recipient, d.seq")
        copy_sql = ("select recipient, content, state from messaging_standbycopy where home = %s"
                    " and recipient = any(%s) order by recipient, seq")
        with psycopg.connect(ring.database_url(n), autocommit=True) as conn:
            home = conn.execute(home_sql, [users[n]]).fetchall()
        with psycopg.connect(ring.database_url(STANDBY[n]), autocommit=True) as conn:
            copy = conn.execute(copy_sql, [f"domain-0{n}", users[n]]).fetchall()
        if home != copy:
            name = f"domain-0{n} on domain-0{STANDBY[n]}"
            wrong[name] = len(set(home) ^ set(copy)) or -1  # -1: order only
            if detail is not None:
                detail[name] = {"home_only": sorted(set(home) - set(copy))[:20],
                                "copy_only": sorted(set(copy) - set(home))[:20]}
    return wrong


def _out_of_order(ring: Ring, users: dict[int, list[str]],
                  detail: dict | None = None) -> dict[str, list[tuple[int, int]]]:
    """Per "sender to recipient": the pairs (earlier, later) of the sender's counters that stand the
    other way round in the recipient's mailbox at its home domain (mailbox order: seq). `detail`, if
    given, takes each such pair's mailbox rows (seq, counter, origin, origin_seq, stored at), to look into."""
    wrong: dict[str, list[tuple[int, int]]] = {}
    for n in ring.domains():
        with psycopg.connect(ring.database_url(n), autocommit=True) as conn:
            rows = conn.execute(
                "select d.recipient, m.content, d.seq, m.origin_domain, d.origin_seq,"
                " to_char(d.created_at, 'HH24:MI:SS.MS') from messaging_delivery d"
                " join messaging_message m on m.id = d.message_id"
                " where d.recipient = any(%s) and d.forward_to = '' order by d.recipient, d.seq",  # the mailbox
                [users[n]]).fetchall()
        last: dict[str, int] = {}
        mine: dict[str, list] = {}
        for _recipient, content, *row in rows:
            sender, _, counter = content.rpartition(" #")
            if not counter.isdigit():
                continue
            key = f"{sender} (mailbox at domain-0{n})"
            mine.setdefault(key, []).append((row[0], int(counter), *row[1:]))
            if last.get(key, 0) > int(counter):
                wrong.setdefault(key, []).append((last[key], int(counter)))
            last[key] = max(last.get(key, 0), int(counter))
        if detail is not None:
            for key in wrong:
                if key in mine:
                    detail[key] = mine[key]
    return wrong


def _again_detail(peers: list[Peer], ring: Ring, began: float) -> list[dict]:
    """Each delivery again after an ACK: when (seconds into the run) and on which domain it was ACKed
    and came again."""
    where = {ring.ws_url(n): f"domain-0{n}" for n in ring.domains()}
    out = []
    for peer in peers:
        with peer.lock:
            for key, acked, acked_url, again, again_url in peer.record.again:
                out.append({"message": key, "acked": round(acked - began, 1), "acked_at": where.get(acked_url, acked_url),
                            "again": round(again - began, 1), "again_at": where.get(again_url, again_url)})
    return sorted(out, key=lambda a: a["again"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--users", type=int, default=3, help="senders per domain")
    parser.add_argument("--rate", type=float, default=1.5, help="messages per second per user")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--log-dir", type=Path)
    parser.add_argument("--wider", action="store_true",
                        help="also stop the meta domain, and two domains that are not neighbours at once; with"
                             " --standby: bench.standby_faults's faults (and a hand-back's holder or home killed),"
                             " and FAST traffic")
    parser.add_argument("--standby", action="store_true",
                        help="issue 27: whole domains stopped or killed at random, one at a time, long enough for"
                             " their standby to take their users over (FAILOVER_SECONDS --failover)")
    parser.add_argument("--failover", type=float, default=10.0, help="--standby: FAILOVER_SECONDS of the ring")
    parser.add_argument("--fast-rate", type=float, default=None,
                        help="--standby --wider: FAST messages a second sent by the first user of each domain"
                             " (default --rate)")
    parser.add_argument("--keep", action="store_true", help="keep the ring's databases afterwards, to look into")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    fast_rate = (args.rate if args.fast_rate is None else args.fast_rate) if args.standby and args.wider else 0.0
    env = platform_env()
    fault_env = {**FAULT_ENV, **({"FAILOVER_SECONDS": str(args.failover), "TAKEOVER_WATCH_SECONDS": "1"}
                                 if args.standby else {})}
    with tempfile.TemporaryDirectory(prefix="faults-ring-") as tmp, private_redis(Path(tmp)) as redis_url:
        ports = ring_ports()
        ring = Ring(Path(tmp) / "ring", env["DATABASE_URL"], redis_url, ports=ports,
                    database_prefix="switchboard_faults_ring_", env_overrides=fault_env,
                    log_dir=args.log_dir or Path(tmp) / "logs", base_env=env)
        try:
            say(f"starting the ring on ports {ports} ...")
            ring.reset()  # fresh databases: a --keep run's would dedupe this run's clientMessageIds against its own
            ring.start()
            users = _users(args.users)
            everyone = [u for us in users.values() for u in us]
            peers = []
            for n, mine in users.items():
                others = [u for u in everyone if u not in mine]
                fallbacks = tuple(ring.ws_url(m) for m in ring.domains() if m != n)  # where a lost home's users try
                peers += [Peer(u, ring.ws_url(n), others, args.rate, fallbacks=fallbacks,
                               fast_rate=fast_rate if i == 0 else 0.0) for i, u in enumerate(mine)]
            for peer in peers:
                peer.start()
            probes = [LoginProbe(f"ANZ-{HOMES[n] + 90}", [ring.ws_url(n), *(ring.ws_url(m) for m in ring.domains()
                                                                          if m != n)]) for n in ring.domains()]
            for probe in probes:
                probe.start()
            deadline = time.monotonic() + 60
            while not all(p.connected.is_set() for p in peers) and time.monotonic() < deadline:
                time.sleep(0.2)
            for peer in peers:
                peer.sending.set()
            say(f"{len(peers)} users sending {args.rate}/s each for {args.minutes} minutes, with faults")
            began = time.monotonic()
            faults = Faults(ring, rng, wider=args.wider, standby=args.standby, failover=args.failover)
            end = time.monotonic() + args.minutes * 60
            while time.monotonic() < end or not faults.covered():
                time.sleep(rng.uniform(3, 8))
                if time.monotonic() < end - 10 or not faults.covered():
                    faults.one()
            for peer in peers:
                peer.sending.clear()
            for probe in probes:
                probe.stopping.set()
            say("sending stopped; waiting for the network to settle")
            settle_started = time.monotonic()
            _settle(peers, timeout=180)
            settled = round(time.monotonic() - settle_started, 1)
            accepted = sum(len(p.accepted()) for p in peers)
            missing = _missing(peers)
            if missing:
                say(f"missing, by recipient: { {u: len(v) for u, v in missing.items()} }")
                say(f"missing, a few: {[c for v in missing.values() for c in v][:10]}")
            dead = {}
            for n in ring.domains():
                with psycopg.connect(ring.database_url(n), autocommit=True) as conn:
                    dead[f"domain-0{n}"] = conn.execute("select count(*) from messaging_delivery where state = 'dead'"
                                                        ).fetchone()[0]
            order_detail: dict = {}
            wrong_order = _out_of_order(ring, users, order_detail)
            if wrong_order:
                say(f"out of order: {wrong_order}")
            copy_detail: dict = {}
            copy_wrong = _copy_mismatch(ring, users, detail=copy_detail)
            if copy_wrong:
                say(f"standby copies that differ from the home's mailbox: {copy_wrong}")
            again_detail = _again_detail(peers, ring, began)
            kills = [(t - began, name, lag) for t, name, lag in faults.kills]
            # An ACK its home read in the last copy lag before it was killed without warning may not
            # have reached the standby: the one loss the issue allows (its copy target, 2 s). Apart,
            # too, an ACK the client sent as (or just after) the domain was killed, which it never
            # read (a killed domain stays down KILL_HOLD_MIN seconds at least).
            in_lag = [a for a in again_detail if any(kill[1] == a["acked_at"]
                                                     and -KILL_HOLD_MIN <= kill[0] - a["acked"]
                                                     <= kill_window(kill, COPY_LAG_ALLOWED) for kill in kills)]
            homes = {u: f"domain-0{n}" for n, us in users.items() for u in us}
            at_a_lost_holder = [a for a in acks_in_a_holder_lost(faults, again_detail, homes, began) if a not in in_lag]
            again_after_ack = len(again_detail) - len(in_lag) - len(at_a_lost_holder)
            # The same window for order: a message stored at a home as it was killed, past its copy.
            order_apart = order_in_kill_window(ring, wrong_order, faults.kills, COPY_LAG_ALLOWED)
            twice = twice_in_a_mailbox(ring, users)
            spans = [(a, b) for p in probes for a, b in p.spans]
            wider, checked_spans = wider_report(faults, spans)  # with --standby --wider: refusals in a pair fault apart
            result = {
                "minutes": args.minutes, "users": len(peers), "rate_per_user": args.rate, "seed": args.seed,
                "wider": args.wider,
                "faults": faults.log, "accepted": accepted, "unaccepted": sum(len(p.unaccepted()) for p in peers),
                "missing": sum(len(v) for v in missing.values()), "dead": dead,
                "delivered_again_after_ack": again_after_ack,
                "again_after_an_ack_in_the_copy_lag_before_a_kill": len(in_lag),
                "again_after_an_ack_at_a_holder_killed_while_its_home_was_away": len(at_a_lost_holder),
                "out_of_order": sum(len(v) for v in wrong_order.values()) - len(order_apart),
                "out_of_order_in_the_copy_lag_before_a_kill": len(order_apart),
                "out_of_order_in_the_copy_lag_detail": order_apart,
                "twice_in_a_mailbox": twice,
                "standby_copy_differs": copy_wrong,
                "standby_copy_detail": copy_detail,
                "closes": sum(len(p.record.close_codes) for p in peers),
                "settled_seconds": settled, "latency_seconds": _latency(peers),
                "standby": args.standby, "failover_seconds": args.failover if args.standby else None,
                # Each time a user's connection was lost: how long until it was logged in again, anywhere.
                "longest_outage_seconds": round(max((o for p in peers for o in p.record.outages), default=0.0), 1),
                "outages_over_30_s": sum(o > 30 for p in peers for o in p.record.outages),
                "outages": _outages(peers),
                # The same, tried every 0.5 s by a user of each home that sends nothing (LoginProbe).
                "longest_login_refused_seconds": round(max((b - a for a, b in checked_spans), default=0.0), 1),
                "login_refused": sorted(({"user": p.user, "from": round(a, 1), "to": round(b, 1),
                                          "seconds": round(b - a, 1)} for p in probes for a, b in p.spans),
                                        key=lambda s: -s["seconds"]),
                "redirects": sum(len(p.record.redirects) for p in peers),
                "again_after_ack_detail": again_detail,
                "kills": [{"domain": name, "at": round(k, 1), "copy_lag": round(lag, 1)} for k, name, lag in kills],
                "out_of_order_detail": order_detail,
                "began": round(began, 1),
                **wider, "fast_rate": fast_rate, **fast_report(peers),
                "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
            }
            for peer in peers:
                threading.Thread(target=peer.leave, daemon=True).start()
        finally:
            ring.stop()
            if not args.keep:
                ring.reset()
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_detail")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = (result["missing"] == 0 and not any(dead.values()) and result["unaccepted"] == 0
          and result["out_of_order"] == 0 and not copy_wrong and result["delivered_again_after_ack"] == 0
          and not twice
          and (not args.standby or result["longest_login_refused_seconds"] <= LOGIN_REFUSED_ALLOWED)
          and (faults.more is None or (result["error_frames"] == 0 and result["still_held"] == 0
                                       and not result["crashes"])))
    say(("PASS: " if ok else "FAIL: ") + f"{result['missing']} missing, dead {dead}, {result['unaccepted']} never"
        f" accepted, {result['out_of_order']} out of order (and {len(order_apart)} stored as their home was"
        f" killed), {sum(twice.values())} twice in a mailbox, standby copies differing {copy_wrong},"
        f" {result['delivered_again_after_ack']} delivered again after an ACK; logins refused everywhere for at most"
        f" {result['longest_login_refused_seconds']} s (tried every {LoginProbe.PROBE_SECONDS} s), the users' longest"
        f" time without a login {result['longest_outage_seconds']} s (with their own pauses between tries)"
        + (f"; faults {result['fault_kinds']}, {len(result['crashes'])} crashes, {result['still_held']} never handed back, FAST sent"
           f" {result['fast_sent']} received {result['fast_received']}, {result['error_frames']} error frames, logins"
           f" refused during pair faults at most {result['login_refused_in_pair_faults_seconds']} s"
           if faults.more is not None else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
