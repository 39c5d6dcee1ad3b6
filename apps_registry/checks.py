"""`check --deploy` checks of the registered apps and the domain network (ids switchboard.W01x): a
tenant anyone may log in to, and a network whose calls travel in the clear or are signed with a
short secret, are named before a node goes on the internet; an app with push open mode (anyone may
publish on its public channels without a key) is an error in production (switchboard.E033: the
image's `check --deploy --fail-level ERROR` refuses to start the node) and named elsewhere
(W033). Only under --deploy: they read the database."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError

from .models import OPEN_APP_MEANING, PUSH_OPEN_MEANING, Domain, DomainLink, UserDistribution
from .selectors import app_names_admitting_anyone, app_names_push_open, app_names_with_auth_url_off, domain_call_url

# What a shared secret must have at least: 32 bytes (HMAC-SHA256's own size; the generated ones have 43).
MIN_SECRET_BYTES = 32
LOOPBACK = ("localhost", "127.0.0.1", "::1")


@register(Tags.security, deploy=True)
def check_open_apps(app_configs, **kwargs):
    try:
        open_apps, refusing_apps = app_names_admitting_anyone(), app_names_with_auth_url_off()
    except DatabaseError as exc:
        return [CheckWarning(f"The registered apps could not be checked ({type(exc).__name__}).",
                             hint="Run `manage.py migrate`, then `check --deploy` again.", id="switchboard.W012")]
    warnings = [
        CheckWarning(
            f"App {name} has auth mode 'none': {OPEN_APP_MEANING}.",
            hint="Choose signed tokens or an auth URL for it in the admin, unless it is a demo on purpose.",
            id="switchboard.W010",
        )
        for name in open_apps
    ]
    warnings += [
        CheckWarning(
            f"App {name} uses an external auth URL that is switched off: every login to it is refused.",
            hint="Enable its auth URL, or choose another auth mode.",
            id="switchboard.W011",
        )
        for name in refusing_apps
    ]
    return warnings


@register(Tags.security, deploy=True)
def check_push_open_app(app_configs, **kwargs):
    """Push open mode is for development and demos: a production node never serves it, and refuses
    to start while an app has it (an operator would otherwise believe the seed's clients work there)."""
    try:
        names = app_names_push_open()
    except DatabaseError:
        return []  # check_open_apps already says the database could not be read
    production = getattr(settings, "PRODUCTION", False)
    kind, check_id = (Error, "switchboard.E033") if production else (CheckWarning, "switchboard.W033")
    where = ("Production never serves it: its bare requests are refused (401)." if production
             else "Fine for development and demos, never for a public node.")
    return [kind(f"App {name} has push open mode: {PUSH_OPEN_MEANING}. {where}",
                 hint="Switch push open mode off for it in the admin (or drop `pushOpen` from its configuration "
                      "entry); clients then publish with an API key and read with ?app= or a token.",
                 id=check_id)
            for name in names]


@register()
def check_meta_role(app_configs, **kwargs):
    """A domain told to pull its configuration without the secret that signs the pull: every pull fails."""
    if settings.META_URL and not settings.META_SECRET:
        return [CheckWarning(
            f"META_URL is set ({settings.META_URL}) but META_SECRET is empty: every configuration pull fails.",
            hint="Set META_SECRET to the secret the meta domain has, or unset META_URL.", id="switchboard.W013")]
    return []


def _in_the_clear(url: str) -> bool:
    """An http:// (or ws://) URL to another machine: what travels there can be read and altered on the way."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return parts.scheme in ("http", "ws") and not (host in LOOPBACK or host.startswith("127."))


@register(Tags.security, deploy=True)
def check_network_transport(app_configs, **kwargs):
    """The meta pull and the calls to neighbours carry every secret of the configuration and every
    forwarded message: over TLS, signed with secrets of at least MIN_SECRET_BYTES."""
    warnings = []
    if settings.META_URL and _in_the_clear(settings.META_URL):
        warnings.append(CheckWarning(
            f"META_URL ({settings.META_URL}) is not https: the configuration it pulls, with every secret, travels "
            "in the clear.", hint="Use an https:// URL for the meta domain (an internal listener behind TLS).",
            id="switchboard.W014"))
    if settings.META_SECRET and len(settings.META_SECRET.encode()) < MIN_SECRET_BYTES:
        warnings.append(CheckWarning(
            f"META_SECRET is shorter than {MIN_SECRET_BYTES} bytes.",
            hint="Use a long random secret, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
            id="switchboard.W015"))
    here = settings.DOMAIN_NAME
    try:
        links = list(DomainLink.objects.select_related("n1", "n2").filter(enabled=True))
    except DatabaseError:
        return warnings  # check_open_apps already says the database could not be read
    for link in links:
        if here not in (link.n1.name, link.n2.name):
            continue
        peer = link.n2 if link.n1.name == here else link.n1
        url = domain_call_url(peer.urls)
        if url and _in_the_clear(url):
            warnings.append(CheckWarning(
                f"Calls to neighbour {peer.name} go to {url}, not https: forwarded messages travel in the clear.",
                hint=f"List an https:// URL first for {peer.name} (its internal listener behind TLS).",
                id="switchboard.W016"))
        if len(link.shared_secret.encode()) < MIN_SECRET_BYTES:
            warnings.append(CheckWarning(
                f"The link {link.n1.name} - {link.n2.name} has a shared secret shorter than {MIN_SECRET_BYTES} bytes.",
                hint="Give it a long random secret in the admin or the configuration file (both ends).",
                id="switchboard.W017"))
    return warnings


@register(Tags.database, deploy=True)
def check_standbys_reachable(app_configs, **kwargs):
    """The live copy of a range's mailboxes goes to its standby over the link between the two
    (messaging.federation.standby.copy): a standby that is not an enabled neighbour of its home never gets
    it, and the copy waits at the home, growing."""
    here = settings.DOMAIN_NAME
    try:
        standbys = set(UserDistribution.objects.filter(domain__name=here, standby__isnull=False)
                       .values_list("standby__name", flat=True))
        linked = {name for pair in DomainLink.objects.filter(enabled=True, liveness_only=False).values_list("n1__name", "n2__name")
                  if here in pair for name in pair}
    except DatabaseError:
        return []  # check_open_apps already says the database could not be read
    return [CheckWarning(
        f"{name} is the standby of ranges homed on {here} but not an enabled neighbour: the live copy of their "
        "mailboxes cannot reach it and waits here.",
        hint=f"Link {here} and {name} (or name a neighbour as the standby).", id="switchboard.W018")
        for name in sorted(standbys - linked)]


@register(Tags.database, deploy=True)
def check_domain_number(app_configs, **kwargs):
    """A domain without a number draws its message ids from block 0, which no other domain keeps:
    each shows its own id for those messages (docs/architecture.md, "One id per message"), and a
    client reading them at a standby or after a hand-back sees one message under two ids."""
    here = settings.DOMAIN_NAME
    try:
        numbered = set(Domain.objects.filter(number__isnull=False).values_list("name", flat=True))
    except DatabaseError:
        return []  # check_open_apps already says the database could not be read
    if not numbered or here in numbered:
        return []
    return [CheckWarning(
        f"{here} has no number while other domains of the network have one: its messages take another id in "
        "every other domain that stores them.",
        hint=f"Give {here} a number no other domain has (the configuration file's `number`, or the admin), once.",
        id="switchboard.W019")]
