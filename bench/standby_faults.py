"""The wider faults of `python -m bench.network_faults --standby --wider` (issue 46, item 8): besides
one whole domain lost at a time (bench.network_faults.Faults._domain_lost, kind `lost`), each of
these at least once a run (the run goes on past `--minutes` until each has happened as meant, a
kind at most three times: `fault_kinds_as_meant`), in a random order, then at random among all five:

- `meta_stopped`: the meta domain (domain-01) stopped, not killed, for FAILOVER_SECONDS + 5-20 s:
  its standby takes its users over, and the others go on with the configuration they pulled from it
  (each one's count of domains, apps and user distributions is compared before and during).
- `pair`: two domains that are not neighbours lost together (each stopped or killed at random), for
  as long, and started again together. The pairs are those of devstack.ring_plan where the two are not linked, neither is the
  other's standby and neither's standby is lost with it (`pairs_apart`): with the ring's LINKS and
  STANDBY, 01 with 03 and 02 with 04. Whether a standby can take either over is the product's
  answer, recorded, not assumed: in a four-domain ring each survivor then has lost both its
  neighbours, so no third domain can witness a takeover (takeover.liveness.witnesses_agree asks a
  neighbour) and each survivor is cut off and stops admitting its own users (takeover.fence); one
  that is back first can witness the other's takeover (`taken_over` is watched until both are). The
  probes' login refusals during a pair fault are counted apart (`login_refused_in_pair_faults_seconds`).
- `handback_kill_home` and `handback_kill_holder`: a domain (any) lost for as long (stopped or
  killed) and taken over by its standby; started again; as soon as the standby is handing its users
  back (its Takeover row held, with `returning_since`), after a random 0-3 s (HAND_BACK_GRACE_SECONDS
  is 3 s), the home, or the holder, is killed with SIGKILL (devstack.ring.kill_domain), kept down
  3-8 s, started again, and the run waits for the hand-back (and, the holder killed, for its own
  users to be at home) at most 180 s. Whether the hand-back was still under way at the kill is
  recorded (`killed_while_returning`), with the holder's row just after.
- `holder_lost_holding`: a domain (any) lost (stopped or killed) and taken over by its standby; then
  the holder killed with SIGKILL while it holds them, and kept down; the home started again. With the
  holder silent, its link down and a third domain agreeing, each for FAILOVER_SECONDS, the home takes
  its users back without it (messaging.federation.takeover.reclaim): `reclaimed_after` is how long
  after the home was ready its own row said so (at most 60 s, RECLAIM_WAIT). Then the holder is
  started again, and the run waits until it has finished its hand-back and has its own users back
  from its own standby (which took them over meanwhile). Login refusals from the holder's kill until
  the home has its users back are counted apart (`login_refused_in_holder_lost_seconds`): the home
  and its standby both lost, nobody may serve those users until the home is back and has heard the
  holder silent for FAILOVER_SECONDS. For the same reason an ACK the holder read for one of the
  home's users before it was killed is counted apart when the message comes again
  (`again_after_an_ack_at_a_holder_killed_while_its_home_was_away`): the holder's changes go home by
  its feed, which waits while the home is away, so that ACK was on the killed holder alone when the
  home took its users back; it comes home when the holder is back and finishes its hand-back.

Each fault is logged in the run's `faults` with its `kind`; every SIGKILL joins the run's `kills` (an
ACK the killed domain read in the copy lag before may be lost, as for `lost`). The ring's crash watch
runs meanwhile, as under `make network` (`CrashWatch`): a process that exits by itself is started
again and listed in `crashes` (a domain's web node that segfaulted was otherwise lost unnoticed for
the rest of a run), and the run fails on any.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import combinations

import psycopg

from devstack.ring_plan import DOMAIN_COUNT, LINKS, META_DOMAIN, STANDBY

KINDS = ("meta_stopped", "pair", "handback_kill_home", "handback_kill_holder", "holder_lost_holding")
HAND_BACK_GRACE = 3.0  # seconds: the ring's HAND_BACK_GRACE_SECONDS (its default)
TAKEN_WAIT = 60.0  # seconds a lost domain is kept away at most, waiting for its standby to take it over
BACK_WAIT = 180.0  # seconds the run waits for a hand-back
RECLAIM_WAIT = 60.0  # seconds a holder is kept down at most, waiting for the home to take its users back
TRIES = 3  # a kind that did not happen as meant (no takeover) is tried again, at most this often a run
CONFIG_SQL = ("select (select count(*) from apps_registry_domain), (select count(*) from apps_registry_clientapp),"
              " (select count(*) from apps_registry_userdistribution)")
RETURNING_SQL = ("select t.held, t.returning_since is not null from apps_registry_takeover t"
                 " join apps_registry_domain d on d.id = t.home_id join apps_registry_domain h on h.id = t.holder_id"
                 " where d.name = %s and h.name = %s")
RECLAIMED_SQL = ("select count(*) from apps_registry_takeover t join apps_registry_domain d on d.id = t.home_id"
                 " join apps_registry_domain h on h.id = t.holder_id"
                 " where d.name = %s and h.name = %s and not t.held and t.returned_at > %s")


def pairs_apart() -> list[tuple[int, int]]:
    """Two domains that may be lost together and still each have its standby: not linked, neither
    the other's standby, neither's standby lost with it."""
    linked = {frozenset(link) for link in LINKS}
    return [(a, b) for a, b in combinations(range(1, DOMAIN_COUNT + 1), 2)
            if frozenset((a, b)) not in linked and STANDBY[a] not in (a, b) and STANDBY[b] not in (a, b)]


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def name(n: int) -> str:
    return f"domain-0{n}"


def split_spans(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> tuple[list, list]:
    """(spans outside every window, spans overlapping one): login refusals apart during pair faults."""
    inside = [s for s in spans if any(s[0] < end and s[1] > began for began, end in windows)]
    return [s for s in spans if s not in inside], inside


class WiderFaults:
    def __init__(self, faults, failover: float) -> None:  # faults: bench.network_faults.Faults
        self.f, self.ring, self.rng, self.failover = faults, faults.ring, faults.rng, failover
        self.todo = list(KINDS)
        self.tries: dict[str, int] = {}
        self.done: set[str] = set()  # the kinds that happened as meant (taken over; killed in a hand-back)
        self.rng.shuffle(self.todo)
        self.pair_windows: list[tuple[float, float]] = []  # (began, ended): monotonic
        self.holder_lost_windows: list[tuple[float, float]] = []  # (holder killed, home has its users back)
        # (holder, home, the home lost, the holder killed): monotonic; an ACK of one of the home's users
        # read at the holder meanwhile waited in the holder's feed home, which the home, away, never took
        self.holder_lost_feeds: list[tuple[str, str, float, float]] = []
        self.watch = CrashWatch(self.ring)
        self.watch.start()

    def covered(self) -> bool:
        return not self.todo  # (a kind tried TRIES times without happening as meant is given up: see `done`)

    def one(self) -> None:
        kind = self.todo.pop(0) if self.todo else self.rng.choice(["lost", *KINDS])
        self.tries[kind] = self.tries.get(kind, 0) + 1
        if kind == "lost":
            self.f._domain_lost()
            return
        done = (self._meta_stopped() if kind == "meta_stopped" else self._pair() if kind == "pair"
                else self._holder_lost_holding() if kind == "holder_lost_holding"
                else self._handback_kill(victim_is_home=kind == "handback_kill_home"))
        if not done and kind not in self.todo and self.tries[kind] < TRIES and kind not in self.done:
            self.todo.append(kind)  # not taken over (or the hand-back not seen): again, later
        if done:
            self.done.add(kind)

    # --- helpers ---------------------------------------------------------------------------------

    def _hold(self) -> float:
        return self.rng.uniform(self.failover + 5, self.failover + 20)

    def _lose(self, n: int, crash: bool) -> None:
        if crash:
            self.f.kill_noted(n)
        (self.ring.kill_domain if crash else self.ring.stop_domain)(n)

    def _away(self, domains: list[int], hold: float, began: float, *,
              until_taken: bool = False) -> dict[int, float | None]:
        """Keep `domains` away for `hold` s from `began`, as they were being lost (`until_taken`: longer,
        until each is taken over, at most TAKEN_WAIT); when each was taken over (seconds after
        `began`: a stopped domain's web node drains a few seconds first), None if it was not."""
        taken: dict[int, float | None] = dict.fromkeys(domains)
        while True:
            for n in domains:
                if taken[n] is None and self.f._held(n):
                    taken[n] = round(time.monotonic() - began, 1)
            waited = time.monotonic() - began
            if waited >= hold and (not until_taken or all(t is not None for t in taken.values())
                                   or waited >= TAKEN_WAIT):
                return taken
            time.sleep(0.5)

    def _home_again(self, domains: list[int], timeout: float = BACK_WAIT) -> bool:
        return _until(lambda: not any(self.f._held(n) for n in domains), timeout)

    def _config(self, n: int) -> tuple:
        with psycopg.connect(self.ring.database_url(n), autocommit=True) as conn:
            return conn.execute(CONFIG_SQL).fetchone()

    def _returning(self, n: int) -> tuple[bool, bool] | None:
        """(held, being handed back) of n's Takeover row at its standby; None: no row."""
        with psycopg.connect(self.ring.database_url(STANDBY[n]), autocommit=True) as conn:
            return conn.execute(RETURNING_SQL, [name(n), name(STANDBY[n])]).fetchone()

    def _record(self, kind: str, what: str, began: float, **fields) -> None:
        say(f"  {what}: {fields}")
        self.f.log.append({"kind": kind, "fault": what, "began": round(began, 1), **fields,
                           "seconds": round(time.monotonic() - began, 1)})

    # --- the faults ------------------------------------------------------------------------------

    def _meta_stopped(self) -> bool:
        n, hold, others = META_DOMAIN, self._hold(), [m for m in self.ring.domains() if m != META_DOMAIN]
        before = {m: self._config(m) for m in others}
        began = time.monotonic()
        say(f"fault (meta_stopped): {name(n)}, the meta, stopped for {hold:.0f} s")
        self._lose(n, crash=False)
        taken = self._away([n], hold, began)[n]
        during = {m: self._config(m) for m in others}
        self.ring.start_domain(n)
        back = self._home_again([n])
        self._record("meta_stopped", f"{name(n)} (meta) stopped {hold:.0f} s", began, back=round(began + hold, 1),
                     taken_over=taken is not None, taken_after=taken, handed_back=back if taken is not None else None,
                     config_kept=all(before[m] == during[m] for m in others),
                     config={name(m): [list(before[m]), list(during[m])] for m in others})
        return taken is not None

    def _pair(self) -> bool:
        pair, hold = list(self.rng.choice(pairs_apart())), self._hold()
        crash = {n: self.rng.random() < 0.5 for n in pair}
        how = {n: "killed" if crash[n] else "stopped" for n in pair}
        what = " and ".join(f"{name(n)} {how[n]}" for n in pair) + f" {hold:.0f} s"
        began = time.monotonic()
        say(f"fault (pair): {what}")
        for n in pair:
            self._lose(n, crash[n])
        taken = self._away(pair, hold, began)
        starters = [_Starter(self.ring, n) for n in pair]  # together: one's start must not keep the other away
        while any(s.is_alive() for s in starters):  # a takeover may come once one is back to witness it
            for n in pair:
                if taken[n] is None and self.f._held(n):
                    taken[n] = round(time.monotonic() - began, 1)
            time.sleep(0.5)
        back = self._home_again(pair)
        self.pair_windows.append((began, time.monotonic()))
        self._record("pair", what, began, domains=[name(n) for n in pair], back=round(began + hold, 1),
                     errors=[e for s in starters for e in s.errors],
                     taken_over={name(n): taken[n] is not None for n in pair},
                     taken_after={name(n): taken[n] for n in pair},
                     handed_back=back if any(t is not None for t in taken.values()) else None)
        return True

    def _taken_over(self, kind: str, untaken: str) -> tuple[int, int, float, dict] | None:
        """The opening of a fault that needs a home held: a home lost (killed or stopped) until its
        standby takes it over. (home, holder, when it began, the record's fields so far); None when
        it was not taken over (then it is started again, and the fault recorded as `untaken`)."""
        n, crash, hold = self.rng.randint(1, DOMAIN_COUNT), self.rng.random() < 0.5, self._hold()
        holder = STANDBY[n]
        began = time.monotonic()
        say(f"fault ({kind}): {name(n)} {'killed' if crash else 'stopped'} until taken over by {name(holder)}")
        self._lose(n, crash)
        taken = self._away([n], hold, began, until_taken=True)[n]
        fields: dict = {"home": name(n), "holder": name(holder), "lost": "killed" if crash else "stopped",
                        "taken_over": taken is not None, "taken_after": taken}
        if taken is None:
            self.ring.start_domain(n)
            self._record(kind, f"{name(n)} lost, not taken over: {untaken}", began, **fields)
            return None
        return n, holder, began, fields

    def _handback_kill(self, *, victim_is_home: bool) -> bool:
        kind = "handback_kill_home" if victim_is_home else "handback_kill_holder"
        opened = self._taken_over(kind, "no hand-back to kill in")
        if opened is None:
            return False
        n, holder, began, fields = opened
        victim = n if victim_is_home else holder
        fields["victim"] = name(victim)
        starting = _Starter(self.ring, n)  # start_domain waits until n is ready: the hand-back may begin first
        hand_back = _until(lambda: (self._returning(n) or (False, False)) != (True, False), BACK_WAIT, step=0.1)
        state = self._returning(n)
        fields["returning_seen_after"] = round(time.monotonic() - began, 1)
        if not hand_back or state is None or not state[1]:  # never seen handing back (or already done)
            starting.join()
            fields.update(killed_while_returning=False, handed_back=self._home_again([n]),
                          note="the hand-back was not seen under way: no kill")
            self._record(kind, f"{name(n)} taken over and back, no kill", began, **fields)
            return False
        time.sleep(self.rng.uniform(0, HAND_BACK_GRACE))
        state = self._returning(n)
        down = self.rng.uniform(3, 8)
        say(f"  {name(n)} being handed back by {name(holder)}: {name(victim)} killed (SIGKILL) for {down:.0f} s")
        self._lose(victim, crash=True)
        fields.update(killed_while_returning=bool(state and state[0] and state[1]),
                      killed_at=round(time.monotonic() - began, 1), down=round(down, 1),
                      row_after_kill=dict(zip(("held", "returning"), self._returning(n) or (), strict=False)))
        time.sleep(down)
        starting.join()
        self.ring.start_domain(victim)
        fields["handed_back"] = self._home_again([n] if victim_is_home else [n, holder])
        fields["errors"] = starting.errors
        self._record(kind, f"{name(n)} taken over, {name(victim)} killed {down:.0f} s during the hand-back", began,
                     **fields)
        return True


    def _holder_lost_holding(self) -> bool:
        kind = "holder_lost_holding"
        opened = self._taken_over(kind, "no holder to lose")
        if opened is None:
            return False
        n, holder, began, fields = opened
        say(f"  {name(n)} held by {name(holder)}: {name(holder)} killed (SIGKILL) while holding, {name(n)} started")
        killed_wall = self._clock(n)
        self._lose(holder, crash=True)
        fields["holder_killed_at"] = round(time.monotonic() - began, 1)
        self.holder_lost_feeds.append((name(holder), name(n), began, began + fields["holder_killed_at"]))
        starting = _Starter(self.ring, n)
        starting.join(timeout=BACK_WAIT)  # until n is ready
        ready = time.monotonic()
        reclaimed = _until(lambda: self._reclaimed(n, killed_wall), RECLAIM_WAIT)
        self.holder_lost_windows.append((began + fields["holder_killed_at"], time.monotonic()))
        fields["reclaimed_after"] = round(time.monotonic() - ready, 1) if reclaimed else None
        self.ring.start_domain(holder)
        fields["handed_back"] = self._home_again([n, holder])
        fields["errors"] = starting.errors
        self._record(kind, f"{name(n)} taken over, {name(holder)} killed while holding, "
                           f"{'taken back' if reclaimed else 'not taken back'} by {name(n)}", began, **fields)
        return reclaimed

    def _clock(self, n: int):
        """The database clock of n's ring (one server for the ring): the time a row's returned_at is
        compared with."""
        with psycopg.connect(self.ring.database_url(STANDBY[n]), autocommit=True) as conn:
            return conn.execute("select now()").fetchone()[0]

    def _reclaimed(self, n: int, since) -> bool:
        """Whether n says it has its users back from its standby, by a record written after `since`."""
        try:
            with psycopg.connect(self.ring.database_url(n), autocommit=True) as conn:
                return bool(conn.execute(RECLAIMED_SQL, [name(n), name(STANDBY[n]), since]).fetchone()[0])
        except psycopg.OperationalError:
            return False


class _Starter(threading.Thread):
    """ring.start_domain(n) on a thread of its own: it waits until n is ready, and n may be killed
    meanwhile (then it raises, or waits until n is started again: recorded, not raised)."""

    def __init__(self, ring, n: int) -> None:
        super().__init__(daemon=True, name=f"start-{n}")
        self.ring, self.n, self.errors = ring, n, []
        self.start()

    def run(self) -> None:
        try:
            self.ring.start_domain(self.n)
        except Exception as exc:  # noqa: BLE001  (RingError: killed as it started)
            self.errors.append(repr(exc)[:300])

    def join(self, timeout: float | None = 5.0) -> None:
        super().join(timeout)


class CrashWatch(threading.Thread):
    """The crash watch `make network` runs (devstack.ring.Ring.restart_crashed, every half second): a
    process of a running domain that exited on its own (a segfault, say) is started again, and
    recorded (`crashes`), instead of leaving that domain lost unnoticed for the rest of the run."""

    def __init__(self, ring) -> None:
        super().__init__(daemon=True, name="crash-watch")
        self.ring, self.stopping, self.crashes = ring, threading.Event(), []
        self.seen: set[int] = set()  # pids recorded

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            with self.ring.lock:  # (a domain stopped or killed on purpose is in ring.stopped first)
                for n, children in self.ring.children.items():
                    for child in children:
                        proc = child.proc
                        if (n not in self.ring.stopped and proc is not None and proc.poll() is not None
                                and proc.pid not in self.seen):
                            self.seen.add(proc.pid)
                            self.crashes.append({"process": child.name, "exit": proc.returncode,
                                                 "at": round(time.monotonic(), 1)})
                            say(f"  {child.name} exited by itself ({proc.returncode}): started again")
                self.ring.restart_crashed()


def _until(done: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


# --- what the run reports of them ------------------------------------------------------------------

ERROR_FRAMES = ("INVALID_MESSAGE", "GENERAL_ERROR")


def fast_report(peers) -> dict:
    """FAST messages sent and received (never stored: in no RELIABLE check), and the error frames any
    user got (tests.loadclients.Peer's problems), FAST or not."""
    sent, seen, errors = set(), [], []
    for peer in peers:
        with peer.lock:
            sent.update(peer.record.fast_sent)
            seen += peer.record.fast_seen
            errors += [p for p in peer.record.problems if isinstance(p, dict) and p.get("type") in ERROR_FRAMES]
    return {"fast_sent": len(sent), "fast_received": len(set(seen)),
            "fast_received_twice": len(seen) - len(set(seen)),
            "fast_received_never_sent": len(set(seen) - sent),
            "error_frames": len(errors), "error_frames_detail": errors[:20]}


def acks_in_a_holder_lost(faults, again: list[dict], homes: dict[str, str], began: float) -> list[dict]:
    """The deliveries again after an ACK (bench.network_faults's `again_after_ack_detail`, times from
    `began`) whose ACK a holder read for a user of the home it held while that home was away, before
    the holder was killed (holder_lost_holding): the holder's changes go home by its feed, which waits
    while the home is away, so the ACK was nowhere but on the killed holder when the home took its
    users back (it comes home when the holder is back and finishes its hand-back). `homes`: user ->
    home domain."""
    if faults.more is None:
        return []
    out = []
    for a in again:
        recipient = a["message"].split(" to ", 1)[1].split(" #", 1)[0]
        for holder, home, lost, killed in faults.more.holder_lost_feeds:
            if a["acked_at"] == holder and homes.get(recipient) == home and lost - began <= a["acked"] <= killed - began:
                out.append(a)
                break
    return out


def wider_report(faults, spans: list[tuple[float, float]]) -> tuple[dict, list[tuple[float, float]]]:
    """The wider run's own fields, and the login refusals its 15 s check reads (those outside a pair
    fault: no domain can take the lost ones over, bench.standby_faults's docstring says why)."""
    kinds: dict[str, int] = {}
    for fault in faults.log:
        kinds[fault.get("kind", "?")] = kinds.get(fault.get("kind", "?"), 0) + 1
    fields = {"fault_kinds": kinds,
              "still_held": sum(f.get("handed_back") is False for f in faults.log)}
    if faults.more is None:
        return fields, spans
    faults.more.watch.stopping.set()
    fields["fault_kinds_as_meant"] = sorted(faults.more.done)  # taken over; killed while handed back
    fields["fault_kinds_never_as_meant"] = sorted(set(KINDS) - faults.more.done)
    fields["crashes"] = faults.more.watch.crashes
    # holder_lost_holding: how long after the home was ready it had its users back (None: not in RECLAIM_WAIT)
    fields["reclaimed_after_seconds"] = [f.get("reclaimed_after") for f in faults.log
                                         if f.get("kind") == "holder_lost_holding" and f.get("taken_over")]
    outside, inside = split_spans(spans, faults.more.pair_windows)
    # Both the home and its holder lost: nobody may serve those users until the home, back, takes them
    # back (FAILOVER_SECONDS after it hears the holder silent), counted apart like a pair's.
    outside, holder_lost = split_spans(outside, faults.more.holder_lost_windows)
    fields["login_refused_in_holder_lost_seconds"] = round(max((b - a for a, b in holder_lost), default=0.0), 1)
    fields["login_refused_in_pair_faults_seconds"] = round(max((b - a for a, b in inside), default=0.0), 1)
    fields["pair_faults"] = [{"from": round(a, 1), "to": round(b, 1)} for a, b in faults.more.pair_windows]
    return fields, outside
