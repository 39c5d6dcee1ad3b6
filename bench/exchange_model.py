"""The event stream of bench/exchange.py and its own model of the rules (independent of the engine):
which lines each connected user must receive, in order."""

from __future__ import annotations

import random

# Kinds by share: F 20%, U 15%, P 35%, S 25%, B 5% (U only of an existing follow).
_KINDS = "F" * 20 + "U" * 15 + "P" * 35 + "S" * 25 + "B" * 5


def events_generate(n: int, users: int, seed: int) -> list[bytes]:
    """n event lines, seq 1..n in order (index i is seq i+1); about one in ten ends with \\r\\n."""
    rnd = random.Random(seed)
    follows: list[tuple[int, int]] = []
    index: dict[tuple[int, int], int] = {}
    lines: list[bytes] = []
    for seq in range(1, n + 1):
        kind = rnd.choice(_KINDS)
        if kind == "U" and not follows:
            kind = "F"
        a, b = rnd.randint(1, users), rnd.randint(1, users)
        if kind == "F":
            if (a, b) not in index:
                index[(a, b)] = len(follows)
                follows.append((a, b))
            body = f"{seq}|F|{a}|{b}"
        elif kind == "U":
            i = rnd.randrange(len(follows))
            a, b = follows[i]
            last = follows.pop()
            if i < len(follows):
                follows[i] = last
                index[last] = i
            del index[(a, b)]
            body = f"{seq}|U|{a}|{b}"
        elif kind == "P":
            body = f"{seq}|P|{a}|{b}"
        elif kind == "S":
            body = f"{seq}|S|{a}"
        else:
            body = f"{seq}|B"
        lines.append(body.encode() + (b"\r\n" if rnd.random() < 0.1 else b"\n"))
    return lines


def wire_bytes(lines: list[bytes], seed: int) -> bytes:
    """What the source sends: the stream shuffled within batches of 100."""
    rnd = random.Random(seed + 1)
    out = []
    for start in range(0, len(lines), 100):
        chunk = lines[start:start + 100]
        rnd.shuffle(chunk)
        out += chunk
    return b"".join(out)


def clients_choose(users: int, clients: int, seed: int) -> list[int]:
    return sorted(random.Random(seed + 2).sample(range(1, users + 1), clients))


def expected_lines(lines: list[bytes], connected: set[int]) -> dict[int, list[bytes]]:
    """Each connected user's lines by the rules (every client connected before the first event)."""
    followers: dict[int, set[int]] = {}
    out: dict[int, list[bytes]] = {uid: [] for uid in connected}
    everyone = list(out.values())
    for raw in lines:
        f = raw.rstrip(b"\r\n").split(b"|")
        kind = f[1]
        if kind == b"F":
            a, b = int(f[2]), int(f[3])
            followers.setdefault(b, set()).add(a)
            if b in connected:
                out[b].append(raw)
        elif kind == b"U":
            followers.get(int(f[3]), set()).discard(int(f[2]))
        elif kind == b"P":
            b = int(f[3])
            if b in connected:
                out[b].append(raw)
        elif kind == b"S":
            for uid in followers.get(int(f[2]), ()):
                if uid in connected:
                    out[uid].append(raw)
        else:
            for lst in everyone:
                lst.append(raw)
    return out
