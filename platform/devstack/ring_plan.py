"""What `make network` starts, as data: the four domains of the linker seed's meta example, their
ports, databases, Redis databases and environments, and the ring's configuration file.

Pure (no process, no connection): devstack.ring runs the plan, tests read it.

The configuration follows the seed's "Meta Server" example exactly (domains domain-01..04; links
01-02, 02-03, 03-04, 01-04; apps domain1..4 and ANZ with its user distributions), with this
machine's addresses: domain-0N serves `ws://127.0.0.1:<port>/ws` and, for the other domains' calls
and its admin, `http://127.0.0.1:<port>`. Each link carries a `sharedSecret` (the extension key of
the forwarding calls' signatures), generated once and kept in the file across runs.

ANZ stays open (`authEnabled: false`, auth mode none), as in the seed, for the demo: anyone may
log in as any ANZ user with any token (import_config says so when it imports it). It gets no
`tokenSecret`: an open app checks no token, so a secret would do nothing, and by the importer's
rules a `tokenSecret` without `authMode` switches an app to signed tokens, against the seed's
`authEnabled: false`. Whoever closes it does so in domain-01's admin (the meta), once for all.
Beyond the seed, ANZ's `news.*` channels are public and open to client subscriptions, so a publish
can be watched arriving on every domain, and each of its ranges has a `standby` (the next domain
round the ring: 01's users stand by on 02, 02's on 03, 03's on 04, 04's on 01), and the ring's two
diagonals (01-03, 02-04) are liveness-only links (`LIVENESS_LINKS`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import yaml

DOMAIN_COUNT = 4
LINKS = ((1, 2), (2, 3), (3, 4), (1, 4))  # the seed's domainLinks, in its order
# Beyond the seed: the ring's two diagonals as liveness-only links (DomainLink.liveness_only: the
# gossip, probes and the takeover witness, no message). Without them, two domains lost together that
# are not neighbours (01 and 03, or 02 and 04) leave each survivor with no neighbour to hear: it
# fences its own users, and nobody may witness the lost pair's takeovers, so logins wait for one of
# the pair to return (docs/architecture.md, "How long logins are refused").
LIVENESS_LINKS = ((1, 3), (2, 4))
ANZ_DISTRIBUTIONS = ((1, 0, 999999), (2, 1000000, 2999999), (3, 3000000, 5999999), (4, 6000000, None))
# Beyond the seed: each range's standby domain (the next one round the ring), which keeps a copy of
# its users' mailboxes and takes them over while their home is lost.
STANDBY = {1: 2, 2: 3, 3: 4, 4: 1}
META_DOMAIN = 1  # domain-01 is the meta: the others pull their configuration from it
# Every queue a domain's one worker serves: make run's routing worker and webhook worker in one
# (two cores, four domains), and inter-domain forwarding.
WORKER_QUEUES = "celery,routing,forwarding,webhooks"
WORKER_CONCURRENCY = 2
CONFIG_FILE = "ring.yaml"
DEFAULT_DATABASE_PREFIX = "switchboard_"


def domain_name(n: int) -> str:
    return f"domain-{n:02d}"


def domain_number(text: str) -> int:
    """1 from "domain-01", "01" or "1"; ValueError for anything else or a domain not in the ring."""
    digits = text.strip().removeprefix("domain-")
    if not digits.isdigit() or not 1 <= int(digits) <= DOMAIN_COUNT:
        raise ValueError(f"no domain {text!r} in the ring (domain-01 .. domain-{DOMAIN_COUNT:02d})")
    return int(digits)


def database_name(n: int, prefix: str = DEFAULT_DATABASE_PREFIX) -> str:
    """switchboard_domain_01; a test ring's prefix makes test_ring_domain_01."""
    return f"{prefix}domain_{n:02d}"


def url_with_path(url: str, path: str) -> str:
    """`url` (postgresql://… or redis://…) naming another database: /<path>, query kept."""
    return urlunparse(urlparse(url)._replace(path=f"/{path}"))


@dataclass(frozen=True)
class DomainPlan:
    number: int
    port: int
    database: str
    database_url: str
    redis_url: str
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's environment

    @property
    def name(self) -> str:
        return domain_name(self.number)

    @property
    def tag(self) -> str:
        """The log prefix's domain part: "01"."""
        return f"{self.number:02d}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"


def ring_ports(base_port: int) -> list[int]:
    """base+1 .. base+4: domain-0N on 800N with the default base 8000."""
    return [base_port + n for n in range(1, DOMAIN_COUNT + 1)]


def domain_plans(*, postgres_url: str, redis_url: str, ports: list[int], meta_secret: str,
                 admin_password: str = "", database_prefix: str = DEFAULT_DATABASE_PREFIX,
                 redis_db_base: int = 0, env_overrides: dict[str, str] | None = None,
                 lake_root: Path | None = None) -> list[DomainPlan]:
    """One plan per domain: its own database on `postgres_url`'s server, Redis database
    redis_db_base + N on `redis_url`'s, its analytics lake under `lake_root` (domain-0N: four
    domains exporting into one lake raced over its runs' files, and wrote into the checkout's own
    var/lake), and the environment its processes run with."""
    if len(ports) != DOMAIN_COUNT:
        raise ValueError(f"the ring needs {DOMAIN_COUNT} ports, got {len(ports)}")
    meta_url = f"http://127.0.0.1:{ports[META_DOMAIN - 1]}"
    plans = []
    for n, port in enumerate(ports, 1):
        database = database_name(n, database_prefix)
        database_url = url_with_path(postgres_url, database)
        domain_redis = url_with_path(redis_url, str(redis_db_base + n))
        env = {
            "DOMAIN_NAME": domain_name(n),
            "DATABASE_URL": database_url,
            "REDIS_URL": domain_redis,
            "PORT": str(port),
            "NODE_ID": f"{domain_name(n)}-web",
            "WORKER_CONCURRENCY": str(WORKER_CONCURRENCY),
        }
        if lake_root is not None:
            env["ANALYTICS_LAKE"] = str(lake_root / domain_name(n))
        if admin_password:
            env["ADMIN_PASSWORD"] = admin_password
        env["META_SECRET"] = meta_secret  # the meta signs its export with it, the others their pulls
        if n != META_DOMAIN:
            env["META_URL"] = meta_url
        env.update(env_overrides or {})
        plans.append(DomainPlan(number=n, port=port, database=database, database_url=database_url,
                                redis_url=domain_redis, env=env))
    return plans


# --- the configuration file ------------------------------------------------------------------------


def link_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def link_secrets_read(path: Path) -> dict[tuple[str, str], str]:
    """The links' shared secrets of an existing ring file (none when there is no file yet)."""
    if not path.exists():
        return {}
    doc = yaml.safe_load(path.read_text()) or {}
    return {link_key(str(e["n1"]), str(e["n2"])): str(e["sharedSecret"])
            for e in doc.get("domainLinks") or [] if isinstance(e, dict) and e.get("sharedSecret")}


def ring_config(ports: list[int], link_secrets: dict[tuple[str, str], str]) -> dict:
    """The seed's meta example on this machine's ports; a link with no secret in `link_secrets`
    gets a new one (and `link_secrets` gains it)."""
    # Beyond the seed: domain-0N's number is N (its block of message ids, apps_registry Domain.number).
    domains = [{"name": domain_name(n), "urls": [f"ws://127.0.0.1:{port}/ws", f"http://127.0.0.1:{port}"],
                "number": n} for n, port in enumerate(ports, 1)]
    links = []
    for (a, b), liveness in [*((pair, False) for pair in LINKS), *((pair, True) for pair in LIVENESS_LINKS)]:
        secret = link_secrets.setdefault(link_key(domain_name(a), domain_name(b)), secrets.token_urlsafe(32))
        links.append({"n1": domain_name(a), "n2": domain_name(b), **({"livenessOnly": True} if liveness else {}),
                      "sharedSecret": secret})
    apps: list[dict] = [{"appName": f"domain{n}", "appId": f"domain{n}", "masterUserId": f"domain{n}-1",
                         "authEnabled": False} for n in range(1, DOMAIN_COUNT + 1)]
    distributions = []
    for n, low, high in ANZ_DISTRIBUTIONS:
        entry: dict = {"domainName": domain_name(n), "from": low}
        if high is not None:
            entry["to"] = high
        entry["standby"] = domain_name(STANDBY[n])
        distributions.append(entry)
    apps.append({"appName": "ANZ", "appId": "app-id-343", "masterUserId": "ANZ-123223",
                 "authUrl": "http://localhost:4200/auth", "authEnabled": False, "userDistributions": distributions,
                 # Beyond the seed: `news.*` channels anyone may read, and /ws clients may SUBSCRIBE, so a
                 # publish on one domain can be watched arriving on all four.
                 "publicChannels": ["news.*"], "clientSubscriptions": True})
    return {"domains": domains, "domainLinks": links, "clientApps": apps}


HEADER = ("# The four-domain ring of `make network` (devstack.ring_plan): the linker seed's meta example on\n"
          "# this machine. Written once and kept: the links' sharedSecrets must stay the same across runs.\n"
          "# Every domain imports it at start; domain-01 is the meta, edit the network in its admin.\n")


def _domain_urls(path: Path) -> list:
    doc = yaml.safe_load(path.read_text()) or {}
    return [(d.get("name"), d.get("urls"), d.get("number")) for d in doc.get("domains") or [] if isinstance(d, dict)]


def _link_pairs(path: Path) -> set[tuple[str, str, bool]]:
    doc = yaml.safe_load(path.read_text()) or {}
    return {(*link_key(str(e.get("n1")), str(e.get("n2"))), bool(e.get("livenessOnly", False)))
            for e in doc.get("domainLinks") or [] if isinstance(e, dict)}


def ring_config_write(path: Path, ports: list[int]) -> Path:
    """Write the ring file if it is missing, names other ports or domain numbers, or lacks a link of
    the plan (a file from before the liveness-only links; the links' secrets of the old file kept);
    an existing file for these ports with every link is left as it is, edits included."""
    config = ring_config(ports, link_secrets_read(path))
    planned = {(*link_key(e["n1"], e["n2"]), e.get("livenessOnly", False)) for e in config["domainLinks"]}
    if (path.exists() and _domain_urls(path) == [(d["name"], d["urls"], d["number"]) for d in config["domains"]]
            and planned <= _link_pairs(path)):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(HEADER + yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
