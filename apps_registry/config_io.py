"""Configuration as code: the linker meta-server YAML (README.md, "Configuring apps and domains"), in and out.

Import is all-or-nothing (one transaction; the first bad entry is named and nothing is written)
and idempotent (natural keys: domain name, link pair, app name). What a file names, it owns:
an app's distributions are replaced by the file's list. What it does not name is left alone.

Extension keys beyond the linker format: `number` on domains (its block of message ids, unique in the
network and given once: an entry without it keeps the domain's, one that would change it is refused);
`weight`, `enabled`, `livenessOnly` (the link carries the network's liveness only, no message:
DomainLink.liveness_only) and `sharedSecret` on links;
`standby` on user distributions (the domain that keeps a copy of the range's mailboxes and takes
its users over while their home is lost: another known domain than `domainName`);
`tokenSecret`, `authMode`, `publicChannels`, `clientSubscriptions`, `pusher` (the app's Pusher
credentials, apps_registry.config_pusher), `pushOpen` (push open mode:
at most one app, ClientApp.push_open; an entry without it has it off) on apps, and `settings`: the
app's settings that protect its users (allowed origins, token lifetime, limits, attempts,
retention; APP_SETTINGS), written where they differ from the defaults. Importing an entry without
`settings` (or without one of them) keeps what the app has; the meta role's pull (`mirror`) sets
what the meta holds, defaults included, so a mirror never keeps a setting the meta has dropped.

No user is left without a home: a file that gives an app's distributions a smaller coverage than
the app has here is refused, naming the app and the first users who would lose their home domain
(`ANZ users 1000000-2999999 would have no home domain`). An app's first distributions are free.
The meta role's pull (apps_registry.meta, `mirror=True`) is the one exception: the meta domain
refused such a change where it was made, and a mirror converges on what the meta holds.

Auth modes: an entry's `authMode` wins; else `authEnabled: true` means the auth URL, a `tokenSecret`
means signed tokens, then the importer's `default_auth_mode` applies (`import_config --auth-mode`);
then an entry that says `authEnabled: false` gets what the linker gives it, no authentication
(`none`): the file says so in the linker's own words, so a linker network imports and works as it
did there, and the import names every such app (`ImportSummary.open_apps`; `check --deploy` warns
W010 about each). An entry that says nothing gets signed tokens (with the app's secret, or a
generated one the operator replaces). Exports write `authMode: none` for an open app.

Secrets stay out of exports unless asked for (`include_secrets`, which the meta role's signed
export uses): a file that travels to a repository or a ticket must not carry an app's token secret,
a link's shared secret (it signs the calls between the two domains) nor a request endpoint's webhook
secret. Importing a file without `tokenSecret` keeps the secret an existing app already has, one
without `sharedSecret` keeps an existing link's secret (a new link gets a random one), and one
without an endpoint's `webhookSecret` keeps the endpoint's (a new endpoint gets a random one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q

from foundation.names import domain_name_valid

from .config_endpoints import EndpointsImported, endpoints_export, endpoints_import
from .config_entries import ConfigError, entry_int, entry_required, validation_text
from .config_pusher import pusher_export, pusher_import
from .config_settings import settings_export, settings_import
from .models import (
    APP_NAME_RE,
    DOMAIN_NUMBER_MAX,
    AuthMode,
    ClientApp,
    Domain,
    DomainLink,
    UserDistribution,
    UserRange,
    new_token_secret,
)
from .selectors import user_id_parse
from .services import coverage_gap, distribution_validate, homeless_message


@dataclass
class ImportSummary:
    created: dict[str, int] = field(default_factory=lambda: {"domains": 0, "links": 0, "apps": 0, "distributions": 0,
                                                             "endpoints": 0})
    updated: dict[str, int] = field(default_factory=lambda: {"domains": 0, "links": 0, "apps": 0, "distributions": 0,
                                                             "endpoints": 0})
    # The webhook secrets of request endpoints created by this import, shown once: (app, endpoint, secret).
    endpoint_secrets: list[tuple[str, str, str]] = field(default_factory=list)
    open_apps: list[str] = field(default_factory=list)  # imported with auth mode none: anyone may log in
    push_open_app: str | None = None  # imported with push open mode: the push seed's bare requests are its

    def count(self, endpoints: EndpointsImported) -> None:
        self.created["endpoints"] += endpoints.created
        self.updated["endpoints"] += endpoints.updated
        self.endpoint_secrets.extend(endpoints.secrets)

    def __str__(self) -> str:
        parts = [f"{kind}: {self.created[kind]} created, {self.updated[kind]} updated" for kind in self.created]
        return "; ".join(parts)


def config_import(*, text: str, default_auth_mode: str | None = None, mirror: bool = False) -> ImportSummary:
    """Import a linker file; `default_auth_mode` is for apps whose entry implies no mode (see above).
    `mirror` (the meta role's pull) skips the no-user-without-a-home rule: see the module doc."""
    if default_auth_mode is not None and default_auth_mode not in AuthMode.values:
        raise ConfigError(f"the default auth mode must be one of {', '.join(AuthMode.values)}")
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError("the file must be a mapping with domains, domainLinks and clientApps")
    summary = ImportSummary()
    with transaction.atomic():
        domains = _import_domains(doc.get("domains") or [], summary)
        _import_links(doc.get("domainLinks") or [], domains, summary)
        _import_apps(doc.get("clientApps") or [], summary, default_auth_mode, mirror)
    return summary


def _import_domains(entries: list, summary: ImportSummary) -> dict[str, Domain]:
    by_name = {d.name: d for d in Domain.objects.all()}
    numbered = {d.number: d.name for d in by_name.values() if d.number is not None}
    for i, entry in enumerate(entries):
        where = f"domains[{i}]"
        name = str(entry_required(entry, "name", where))
        where = f"domains[{i}] ({name})"
        if not domain_name_valid(name):
            raise ConfigError(f"{where}: invalid domain name")
        urls = entry.get("urls") or []
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise ConfigError(f"{where}: 'urls' must be a list of strings")
        domain = by_name.get(name)
        number = _domain_number(entry, domain, where, numbered)
        if domain is None:
            by_name[name] = Domain.objects.create(name=name, urls=urls, number=number)
            summary.created["domains"] += 1
        elif domain.urls != urls or domain.number != number:
            domain.urls, domain.number = urls, number
            domain.save(update_fields=["urls", "number"])
            summary.updated["domains"] += 1
    # This domain's row written again, changed or not: its database moves its message id sequence
    # into the block on that write (messaging migration 0029's trigger), also when the row came with
    # the database itself (one copied from another domain's, a restore) and so was never written here.
    Domain.objects.filter(name=settings.DOMAIN_NAME, number__isnull=False).update(number=F("number"))
    return by_name


def _domain_number(entry: dict, domain: Domain | None, where: str, numbered: dict[int, str]) -> int | None:
    """The domain's number (Domain.number): the entry's, checked, or the one it has. `numbered`: which
    domain has each number, this file's entries so far included."""
    number = domain.number if domain is not None else None
    if entry.get("number") is None:
        return number
    given = entry["number"]
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= DOMAIN_NUMBER_MAX:
        raise ConfigError(f"{where}: 'number' must be a whole number from 1 to {DOMAIN_NUMBER_MAX}")
    if number is not None and given != number:
        raise ConfigError(f"{where}: its number is {number} and is never changed (its messages' ids are in that block)")
    name = str(entry["name"])
    if numbered.get(given, name) != name:
        raise ConfigError(f"{where}: number {given} is {numbered[given]}'s")
    numbered[given] = name
    return given


def _import_links(entries: list, domains: dict[str, Domain], summary: ImportSummary) -> None:
    for i, entry in enumerate(entries):
        where = f"domainLinks[{i}]"
        n1, n2 = str(entry_required(entry, "n1", where)), str(entry_required(entry, "n2", where))
        where = f"domainLinks[{i}] ({n1} - {n2})"
        for name in (n1, n2):
            if name not in domains:
                raise ConfigError(f"{where}: unknown domain '{name}' (list it under domains)")
        if n1 == n2:
            raise ConfigError(f"{where}: a link must join two different domains")
        weight = entry_int(entry.get("weight", 1), f"{where} weight")
        if weight < 1:
            raise ConfigError(f"{where}: weight must be 1 or more")
        enabled = bool(entry.get("enabled", True))
        liveness_only = entry.get("livenessOnly", False)
        if not isinstance(liveness_only, bool):
            raise ConfigError(f"{where}: livenessOnly must be true or false")
        secret = entry.get("sharedSecret") or None
        if secret is not None and (not isinstance(secret, str) or len(secret) > 128):
            raise ConfigError(f"{where}: sharedSecret must be a string of at most 128 characters")
        a, b = domains[n1], domains[n2]
        link = DomainLink.objects.filter(Q(n1=a, n2=b) | Q(n1=b, n2=a)).first()
        if link is None:
            DomainLink.objects.create(n1=a, n2=b, weight=weight, enabled=enabled, liveness_only=liveness_only,
                                      **({"shared_secret": secret} if secret else {}))
            summary.created["links"] += 1
        elif ((link.weight, link.enabled, link.liveness_only, link.shared_secret)
              != (weight, enabled, liveness_only, secret or link.shared_secret)):
            link.weight, link.enabled, link.liveness_only = weight, enabled, liveness_only
            link.shared_secret = secret or link.shared_secret
            link.save(update_fields=["weight", "enabled", "liveness_only", "shared_secret"])
            summary.updated["links"] += 1


def _implied_auth_mode(entry: dict, default: str | None = None) -> str:
    """The auth mode an app entry without `authMode` means (the module doc says why); exports write
    `authMode` exactly where an app's mode is not the one its entry implies."""
    if entry.get("authEnabled"):
        return AuthMode.AUTH_URL
    if entry.get("tokenSecret"):
        return AuthMode.SIGNED_TOKEN
    if default is not None:
        return default
    if entry.get("authEnabled") is False:
        return AuthMode.NONE  # the linker's "authentication disabled", said in the file
    return AuthMode.SIGNED_TOKEN


def _app_fields(entry: dict, where: str, default_auth_mode: str | None) -> dict[str, Any]:
    app_name = str(entry_required(entry, "appName", where))
    if not re.match(APP_NAME_RE, app_name):
        raise ConfigError(f"{where}: appName must be letters/digits (it is the user-id prefix)")
    master = str(entry_required(entry, "masterUserId", where))
    parsed = user_id_parse(master)
    if parsed is None or parsed.app_name != app_name:
        raise ConfigError(f"{where}: masterUserId '{master}' is not a user id of {app_name} ({app_name}-<digits>)")
    auth_url = entry.get("authUrl") or ""
    given_secret = entry.get("tokenSecret") or ""
    mode = entry.get("authMode")
    if mode is None:
        mode = _implied_auth_mode(entry, default_auth_mode)
    if mode not in AuthMode.values:
        raise ConfigError(f"{where}: authMode must be one of {', '.join(AuthMode.values)}")
    auth_enabled = bool(entry.get("authEnabled", mode == AuthMode.AUTH_URL))
    if mode == AuthMode.AUTH_URL and not auth_url:
        raise ConfigError(f"{where}: authEnabled is true but authUrl is missing")
    if mode == AuthMode.AUTH_URL and not auth_enabled:
        raise ConfigError(f"{where}: authMode auth_url with authEnabled false would refuse every login")
    existing = ClientApp.objects.filter(app_name=app_name).values_list("token_secret", flat=True).first()
    token_secret = given_secret or existing or new_token_secret()
    public = entry.get("publicChannels") or []
    if not isinstance(public, list) or not all(isinstance(p, str) for p in public):
        raise ConfigError(f"{where}: publicChannels must be a list of channel patterns")
    push_open = entry.get("pushOpen", False)
    if not isinstance(push_open, bool):
        raise ConfigError(f"{where}: pushOpen must be true or false")
    return {
        "app_name": app_name,
        "app_id": str(entry_required(entry, "appId", where)),
        "master_user_id": master,
        "auth_url": auth_url,
        "auth_enabled": auth_enabled,
        "auth_mode": mode,
        "token_secret": token_secret,
        "public_channel_patterns": public,
        "client_subscriptions_allowed": bool(entry.get("clientSubscriptions", False)),
        "push_open": push_open,
    }


def _push_open_make_room(entries: list, mirror: bool) -> int:
    """At most one app has push open mode (a constraint). Before any app is written, the apps the
    file names without it give it up; one it does not name keeps it, so a file giving it to another
    is refused (a mirror takes it from every app but the one the meta gives it to). Returns how
    many apps gave it up."""
    named = {str(e.get("appName")): e.get("pushOpen") is True for e in entries if isinstance(e, dict)}
    wanted = [name for name, on in named.items() if on]
    if len(wanted) > 1:
        raise ConfigError(f"clientApps: pushOpen is true for {' and '.join(wanted)}; at most one app may have it")
    others = ClientApp.objects.filter(push_open=True).exclude(app_name__in=wanted)
    if wanted and not mirror and (kept := others.exclude(app_name__in=list(named)).first()) is not None:
        raise ConfigError(f"clientApps ({wanted[0]}): pushOpen: app {kept.app_name} has push open mode here and the "
                          "file does not name it; at most one app may (switch it off there first)")
    return others.filter(**({} if mirror else {"app_name__in": list(named)})).update(push_open=False)


def _import_apps(entries: list, summary: ImportSummary, default_auth_mode: str | None, mirror: bool) -> None:
    seen_ids: dict[str, str] = {}
    summary.updated["apps"] += _push_open_make_room(entries, mirror)
    for i, entry in enumerate(entries):
        where = f"clientApps[{i}]"
        fields = _app_fields(entry, where, default_auth_mode)
        where = f"clientApps[{i}] ({fields['app_name']})"
        fields.update(settings_import(entry, where, mirror=mirror))
        if fields["app_id"] in seen_ids:
            raise ConfigError(f"{where}: appId '{fields['app_id']}' is also used by {seen_ids[fields['app_id']]}")
        seen_ids[fields["app_id"]] = fields["app_name"]
        other = ClientApp.objects.filter(app_id=fields["app_id"]).exclude(app_name=fields["app_name"]).first()
        if other is not None:
            raise ConfigError(f"{where}: appId '{fields['app_id']}' already belongs to app {other.app_name}")
        app = ClientApp.objects.filter(app_name=fields["app_name"]).first()
        if app is None:
            app = ClientApp.objects.create(**fields)
            summary.created["apps"] += 1
        elif any(getattr(app, k) != v for k, v in fields.items()):
            for k, v in fields.items():
                setattr(app, k, v)
            app.save()
            summary.updated["apps"] += 1
        if app.auth_mode == AuthMode.NONE:
            summary.open_apps.append(app.app_name)
        if app.push_open:
            summary.push_open_app = app.app_name
        _import_distributions(app, entry.get("userDistributions") or [], where, summary, mirror)
        if "pusher" in entry and pusher_import(app, entry["pusher"], where, mirror=mirror):
            summary.updated["apps"] += 1
        if "endpoints" in entry:  # (absent: the app's endpoints are left as they are)
            summary.count(endpoints_import(app, entry.get("endpoints") or [], where))


def _import_distributions(app: ClientApp, entries: list, where: str, summary: ImportSummary, mirror: bool) -> None:
    wanted = []
    for j, dist in enumerate(entries):
        dwhere = f"{where} userDistributions[{j}]"
        domain_name = str(entry_required(dist, "domainName", dwhere))
        domain = Domain.objects.filter(name=domain_name).first()
        if domain is None:
            raise ConfigError(f"{dwhere}: unknown domain '{domain_name}'")
        range_from = entry_int(dist.get("from", 0), f"{dwhere} from")
        range_to = None if dist.get("to") is None else entry_int(dist["to"], f"{dwhere} to")
        standby = None
        if dist.get("standby") is not None:
            standby = Domain.objects.filter(name=str(dist["standby"])).first()
            if standby is None:
                raise ConfigError(f"{dwhere}: unknown standby domain '{dist['standby']}'")
            if standby.pk == domain.pk:
                raise ConfigError(f"{dwhere}: the standby must be another domain than the home ({domain.name})")
        wanted.append((domain.pk, range_from, range_to, standby.pk if standby else None, domain, standby, dwhere))
    current = sorted(app.distributions.values_list("domain_id", "range_from", "range_to", "standby_id"),
                     key=_distribution_order)
    if current == sorted((w[:4] for w in wanted), key=_distribution_order):
        return
    if not mirror:
        gap = coverage_gap(before=[UserRange(low, high) for _, low, high, _ in current],
                           after=[UserRange(low, high) for _, low, high, *_ in wanted])
        if gap is not None:
            raise ConfigError(f"{where}: {homeless_message(app.app_name, gap)} (the file's userDistributions "
                              "must cover every user the app's distributions cover here)")
    app.distributions.all().delete()
    for _, range_from, range_to, _, domain, standby, dwhere in wanted:
        try:
            distribution_validate(app=app, range_from=range_from, range_to=range_to)
        except ValidationError as exc:
            raise ConfigError(f"{dwhere}: {validation_text(exc)}") from None
        UserDistribution.objects.create(app=app, domain=domain, range_from=range_from, range_to=range_to,
                                        standby=standby)
        summary.created["distributions"] += 1


def _distribution_order(row: tuple) -> tuple:
    """(domain id, from, to, standby id) in an order None can take part in."""
    return tuple(-1 if v is None else v for v in row)


def config_export(*, include_secrets: bool = False) -> str:
    doc: dict[str, Any] = {
        "domains": [{"name": d.name, "urls": list(d.urls), **({"number": d.number} if d.number is not None else {})}
                    for d in Domain.objects.order_by("name")],
        "domainLinks": [],
        "clientApps": [],
    }
    for link in DomainLink.objects.select_related("n1", "n2").order_by("pk"):  # file order survives
        item: dict[str, Any] = {"n1": link.n1.name, "n2": link.n2.name}
        if link.weight != 1:
            item["weight"] = link.weight
        if not link.enabled:
            item["enabled"] = False
        if link.liveness_only:
            item["livenessOnly"] = True
        if include_secrets:
            item["sharedSecret"] = link.shared_secret
        doc["domainLinks"].append(item)
    apps = ClientApp.objects.select_related("pusher").prefetch_related("distributions__domain", "distributions__standby",
                                              "request_endpoints").order_by("app_name")
    for app in apps:
        item = {"appName": app.app_name, "appId": app.app_id, "masterUserId": app.master_user_id}
        if app.auth_url:
            item["authUrl"] = app.auth_url
        item["authEnabled"] = app.auth_enabled
        exported_secret = app.token_secret if include_secrets else ""
        if exported_secret:
            item["tokenSecret"] = exported_secret
        if app.auth_mode != _implied_auth_mode(item):
            item["authMode"] = app.auth_mode  # e.g. signed tokens whose secret stays out of the file
        if app.public_channel_patterns:
            item["publicChannels"] = list(app.public_channel_patterns)
        if app.client_subscriptions_allowed:
            item["clientSubscriptions"] = True
        if app.push_open:
            item["pushOpen"] = True
        if app_settings := settings_export(app):
            item["settings"] = app_settings
        dists = []
        for d in sorted(app.distributions.all(), key=lambda d: d.range_from):
            entry: dict[str, Any] = {"domainName": d.domain.name, "from": d.range_from}
            if d.range_to is not None:
                entry["to"] = d.range_to
            if d.standby is not None:
                entry["standby"] = d.standby.name
            dists.append(entry)
        if dists:
            item["userDistributions"] = dists
        if pusher := pusher_export(app, include_secrets=include_secrets):
            item["pusher"] = pusher
        if endpoints := endpoints_export(app, include_secrets=include_secrets):
            item["endpoints"] = endpoints
        doc["clientApps"].append(item)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
