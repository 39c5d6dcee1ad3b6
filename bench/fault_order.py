"""What the fault run's order check finds, sorted (bench.network_faults): the messages that stand
after a later one of their sender because their home was killed with SIGKILL as it stored them,
and every mailbox row that holds a message a second time.

A message stored at a home in the copy lag before the home was killed (COPY_LAG_ALLOWED, the issue's
target, or the lag measured at the kill when it was longer: `copy_lag_now`) may never have
reached its standby's copy of the home's outgoing queue (the copy target of issue 27, the window in
which a home lost without warning may lose an ACK). The standby that takes the sender over knows
nothing of it: the sender's next messages, sent from there, go first, and the message goes on only
when its home is back. Such pairs are counted apart, as an ACK read in that window is; every other
pair is a fault of the platform.
"""

from __future__ import annotations

import time

import psycopg


def late_message(key: str, counter: int) -> str:
    """The content of the message a pair of `_out_of_order`'s names (its key, the late counter)."""
    return f"{key.rsplit(' (mailbox at ', 1)[0]} #{counter}"


def _stored_first(ring, content: str) -> tuple[str, float] | None:
    """(domain, wall time) where the message with `content` was stored first (its origin)."""
    for n in ring.domains():
        with psycopg.connect(ring.database_url(n), autocommit=True) as conn:
            row = conn.execute("select extract(epoch from created_at) from messaging_message"
                               " where content = %s and origin_domain = ''", [content]).fetchone()
        if row is not None:
            return f"domain-0{n}", float(row[0])
    return None


def copy_lag_now(ring, n: int, standby: str) -> float:
    """How far domain n's live copy to its standby is behind now: the age of the oldest change of
    its feed to `standby` not yet taken there (0: none). Read just before a SIGKILL: what the domain
    stored or read in that window may reach the standby only when it is back (a feed home from a
    holder, waiting while the home is away, is not counted: it is not the copy)."""
    with psycopg.connect(ring.database_url(n), autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("select extract(epoch from clock_timestamp() - min(created_at)) from messaging_standbyfeed"
                           " where standby = %s", [standby]).fetchone()
    return max(0.0, float(row[0] or 0.0))


def kill_window(kill: tuple[float, str, float], allowed: float) -> float:
    """The copy lag a kill is allowed: the issue's target (`allowed`), or the lag measured as the
    domain was killed (and the second after, as the reading was taken), whichever is longer."""
    return max(allowed, kill[2] + 1.0)


def order_in_kill_window(ring, wrong: dict[str, list[tuple[int, int]]], kills: list[tuple[float, str, float]],
                         copy_lag: float) -> list[dict]:
    """The out-of-order pairs whose late message was stored at a home within the copy lag before
    that home was killed (`kill_window`), or in the second its processes took to die. `kills`:
    (monotonic time, domain, copy lag measured then) of every SIGKILL."""
    to_wall = time.time() - time.monotonic()
    apart = []
    for key, pairs in wrong.items():
        for later, late in pairs:
            content = late_message(key, late)
            stored = _stored_first(ring, content)
            if stored is None:
                continue
            domain, at = stored
            for kill in kills:
                k, name, _ = kill
                if name == domain and -1.0 <= (k + to_wall) - at <= kill_window(kill, copy_lag):
                    apart.append({"pair": [later, late], "message": content, "stored_at": domain,
                                  "seconds_before_the_kill": round((k + to_wall) - at, 2)})
                    break
    return apart


def twice_in_a_mailbox(ring, users: dict[int, list[str]]) -> dict[str, int]:
    """Per home: mailbox rows (not records of passing a message on) of a message its recipient's
    mailbox already holds. Each message is in a mailbox once."""
    twice = {}
    for n in ring.domains():
        with psycopg.connect(ring.database_url(n), autocommit=True) as conn:
            extra = conn.execute("select coalesce(sum(c - 1), 0) from (select count(*) c from messaging_delivery"
                                 " where forward_to = '' and recipient = any(%s) group by message_id, recipient) x",
                                 [users[n]]).fetchone()[0]
        if extra:
            twice[f"domain-0{n}"] = int(extra)
    return twice
