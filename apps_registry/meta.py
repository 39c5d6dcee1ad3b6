"""The meta role: one domain's admin edits the whole network (the linker's meta server).

Every domain serves its configuration at `GET /internal/v1/config` (`config_export_view`), to a
caller that signs the request with the network's META_SECRET (foundation.signed_calls: method GET,
the path with its query); the answer is the YAML of `config_export(include_secrets=True)` (app token
secrets and link shared secrets travel: the pulling domain needs them), signed with the same secret
as method ANSWER on the same path and with the request's nonce, so an answer recorded earlier, or
made for another request, does not verify. Without META_SECRET the endpoint refuses everyone.

A domain whose META_URL is set pulls it (`meta_pull`: the beat task apps_registry.tasks.meta_pull
every META_PULL_SECONDS, and `manage.py meta_pull`) and applies it as a mirror: the meta's
configuration is the whole truth, so what it no longer lists is removed here, with two exceptions
kept on purpose and named in the meta state's notice (the admin shows it on the Domain list):

- an app for which this domain still stores anything (messages, deliveries, sessions, channels,
  webhooks: any row of a higher layer) is kept, distributions included, so a remote edit never
  deletes a domain's message history; an operator deletes it here once that history may go;
- this domain itself, and a domain a kept app's distributions still name, are kept.

An unchanged configuration (the meta's YAML has the SHA-256 digest of the last one applied, and
this domain's own export the digest it had right after) changes nothing and writes nothing but the
time of the check; a local edit made since (despite the admin's warning) is undone by the next pull. After a change, this process's app snapshots
are dropped at commit; every other process (web nodes, workers) reads the change within
selectors.SNAPSHOT_TTL, as with an edit in the admin.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass

import yaml
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from foundation.body_cap import Admission, Refusal, RequestHead
from foundation.outgoing import Answer, OutgoingError, outgoing_client, outgoing_request, run_outgoing
from foundation.signed_calls import (
    ANSWER_METHOD,
    DOMAIN_HEADER,
    NONCE_KEY,
    SIGNATURE_HEADER,
    header_refusal,
    nonce_first_use,
    signature_refusal,
    signed_headers,
)
from foundation.transport.redis_clients import async_client, sync_client

from .config_io import ConfigError, config_export, config_import
from .models import ClientApp, Domain, DomainLink, MetaState
from .selectors import app_snapshots_clear

log = logging.getLogger(__name__)
EXPORT_PATH = "/internal/v1/config"
ANSWER_MAX_BYTES = 16 * 1024 * 1024
YAML_TYPE = "application/yaml; charset=utf-8"


# --- the export (every domain) -------------------------------------------------------------------


NO_META_SECRET = "this domain has no META_SECRET: its configuration is not exported"
REPLAYED = "nonce already used (a replayed call)"


def _refused(reason: str) -> JsonResponse:
    return JsonResponse({"error": f"refused: {reason}"}, status=403)


async def config_export_gate(head: RequestHead) -> Refusal | Admission:
    """The export's check before any body is read (messaging.federation.wire.transport.peer_headers_gate
    hands it the export's path): it takes no body, and a pull that is not signed, not fresh or
    whose nonce was used is refused as the view refuses it, without reading anything more."""
    if head.length != 0:
        return Refusal(400, {"error": "refused: the configuration export takes no request body"})
    if not settings.META_SECRET:
        return Refusal(403, {"error": f"refused: {NO_META_SECRET}"})
    reason, signature = header_refusal(header=head.headers.get(SIGNATURE_HEADER.lower()),
                                       max_skew=settings.FORWARD_MAX_SKEW_SECONDS)
    if reason is None and signature is not None and await async_client().exists(
            NONCE_KEY.format(sender="meta", nonce=signature.nonce)):
        reason = REPLAYED
    if reason is not None:
        return Refusal(403, {"error": f"refused: {reason}"})
    return Admission(key="meta", large_over=0, slots=0)


@require_GET
def config_export_view(request: HttpRequest) -> HttpResponse:
    secret = settings.META_SECRET
    if not secret:
        return _refused(NO_META_SECRET)
    path = request.get_full_path()
    sender = request.headers.get(DOMAIN_HEADER, "")[:64]
    reason, signature = signature_refusal(secret=secret, header=request.headers.get(SIGNATURE_HEADER),
                                          method="GET", path=path, body=b"",
                                          max_skew=settings.FORWARD_MAX_SKEW_SECONDS)
    # The nonce is remembered on its own, not under the caller's name: that header is not signed, so
    # a captured call sent again under another name must still be a replay.
    if reason is None and not nonce_first_use(redis=sync_client(), sender="meta", nonce=signature.nonce,
                                              ttl=2 * settings.FORWARD_MAX_SKEW_SECONDS):
        reason = REPLAYED
    if reason is not None:
        log.warning("config export refused to %r: %s", sender, reason)
        return _refused(reason)
    body = config_export(include_secrets=True).encode()
    response = HttpResponse(body, content_type=YAML_TYPE)
    answer = signed_headers(secret=secret, sender=settings.DOMAIN_NAME, method=ANSWER_METHOD, path=path, body=body,
                            nonce=signature.nonce)
    for name, value in answer.items():
        response[name] = value
    response["Cache-Control"] = "no-store"
    return response


# --- the pull (a domain with META_URL) -----------------------------------------------------------


class MetaPullError(Exception):
    """A pull that applied nothing; the message says why (and is the meta state's last error)."""


@dataclass(frozen=True)
class PullOutcome:
    changed: bool
    digest: str
    summary: str = ""
    notice: str = ""

    def __str__(self) -> str:
        if not self.changed:
            return f"configuration unchanged (digest {self.digest[:12]})"
        text = f"configuration applied (digest {self.digest[:12]}): {self.summary}"
        return f"{text}. {self.notice}" if self.notice else text


def meta_state() -> MetaState:
    return MetaState.objects.get_or_create(pk=1)[0]


def meta_state_line() -> str | None:
    """One line for the admin (the Domain list): where the configuration comes from, and how it went."""
    if not settings.META_URL:
        return None
    state = MetaState.objects.filter(pk=1).first()
    if state is None or state.checked_at is None:
        return f"Configuration pulled from {settings.META_URL}: not pulled yet."
    applied = f"at {state.applied_at:%Y-%m-%d %H:%M:%S} UTC, digest {state.digest[:12]}" if state.applied_at else \
        "never applied"
    line = (f"Configuration pulled from {state.meta_url or settings.META_URL} {applied}; "
            f"last checked {state.checked_at:%Y-%m-%d %H:%M:%S} UTC; last error: {state.last_error or 'none'}.")
    return f"{line} {state.notice}" if state.notice else line


async def _get(url: str, headers: dict[str, str], deadline: float) -> Answer:
    """The signed GET of the meta's export, within one deadline for the whole exchange and read up to
    ANSWER_MAX_BYTES (foundation.outgoing; the meta domain is the operator's configuration, so its
    address is not filtered)."""
    client = outgoing_client("meta", max_connections=2, max_keepalive=1, checked=False)
    return await outgoing_request(client, "GET", url, headers=headers, deadline=deadline, max_bytes=ANSWER_MAX_BYTES)


def _fetch(base_url: str, secret: str) -> bytes:
    path, nonce = EXPORT_PATH, secrets.token_hex(16)
    headers = signed_headers(secret=secret, sender=settings.DOMAIN_NAME, method="GET", path=path, body=b"",
                             nonce=nonce)
    url = base_url.rstrip("/") + path
    deadline = settings.FORWARD_TIMEOUT_SECONDS * 2
    try:
        answer = run_outgoing(_get(url, headers, deadline), deadline)
    except OutgoingError as exc:
        raise MetaPullError(f"{url} unreachable: {exc}") from None
    if answer.status != 200:
        raise MetaPullError(f"{url} answered {answer.status}: {answer.body[:300].decode(errors='replace')}")
    body = answer.body
    if not answer.complete:
        raise MetaPullError(f"{url} answered more than {ANSWER_MAX_BYTES} bytes")
    reason, signature = signature_refusal(secret=secret, header=answer.headers.get(SIGNATURE_HEADER.lower()),
                                          method=ANSWER_METHOD, path=path, body=body,
                                          max_skew=settings.FORWARD_MAX_SKEW_SECONDS)
    if reason is None and signature.nonce != nonce:
        reason = "the answer was signed for another request"
    if reason is not None:
        raise MetaPullError(f"{url} answered with an unverifiable configuration ({reason}): nothing applied")
    return body


def meta_pull() -> PullOutcome:
    """Pull the meta domain's configuration and mirror it here (the module doc says how). Raises
    MetaPullError (recorded as the meta state's last error, and logged) when nothing was applied."""
    base_url, secret = settings.META_URL, settings.META_SECRET
    if not base_url:
        raise MetaPullError("META_URL is not set: this domain's own admin is its configuration")
    if not secret:
        raise MetaPullError("META_SECRET is not set: a pull must be signed and its answer verified")
    try:
        body = _fetch(base_url, secret)
        return _apply(base_url, body)
    except MetaPullError as exc:
        log.error("meta pull from %s failed: %s", base_url, exc)
        MetaState.objects.update_or_create(pk=1, defaults={"checked_at": timezone.now(), "last_error": str(exc),
                                                           "meta_url": base_url})
        raise


def _apply(base_url: str, body: bytes) -> PullOutcome:
    digest = hashlib.sha256(body).hexdigest()
    with transaction.atomic():
        meta_state()
        state = MetaState.objects.select_for_update().get(pk=1)  # two pulls at once: the second sees the first
        now = timezone.now()
        if state.digest == digest and state.meta_url == base_url and state.local_digest == _local_digest():
            MetaState.objects.filter(pk=1).update(checked_at=now, last_error="")
            return PullOutcome(changed=False, digest=digest)
        try:
            text = body.decode()
            summary = config_import(text=text, mirror=True)
            notice = _mirror_remove(yaml.safe_load(text) or {})
        except (ConfigError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise MetaPullError(f"the meta's configuration cannot be applied: {exc}") from None
        state.meta_url, state.digest, state.applied_at, state.checked_at = base_url, digest, now, now
        state.last_error, state.notice, state.local_digest = "", notice, _local_digest()
        state.save()
        transaction.on_commit(app_snapshots_clear)
    log.info("meta pull from %s applied digest %s: %s %s", base_url, digest[:12], summary, notice)
    return PullOutcome(changed=True, digest=digest, summary=str(summary), notice=notice)


def _local_digest() -> str:
    return hashlib.sha256(config_export(include_secrets=True).encode()).hexdigest()


def _app_has_stored_data(app: ClientApp) -> bool:
    """Whether any row of a higher layer (messages, sessions, channels, webhooks...) belongs to
    `app`: found through the foreign keys to ClientApp, so this layer imports none of them."""
    # include_hidden: several tables point here with related_name "+" (messaging's mailboxes, channels).
    for relation in ClientApp._meta.get_fields(include_hidden=True):
        if not (relation.auto_created and not relation.concrete and (relation.one_to_many or relation.one_to_one)):
            continue
        model = relation.related_model
        if model._meta.app_label == ClientApp._meta.app_label:
            continue
        if model._base_manager.filter(**{relation.field.name: app}).exists():
            return True
    return False


def _mirror_remove(doc: dict) -> str:
    """Remove what the meta's document no longer lists; returns the notice of what was kept."""
    kept: list[str] = []
    pairs = {frozenset((str(e.get("n1")), str(e.get("n2")))) for e in doc.get("domainLinks") or []}
    for link in DomainLink.objects.select_related("n1", "n2"):
        if frozenset((link.n1.name, link.n2.name)) not in pairs:
            link.delete()
    app_names = {str(e.get("appName")) for e in doc.get("clientApps") or []}
    for app in ClientApp.objects.exclude(app_name__in=app_names):
        if _app_has_stored_data(app):
            kept.append(f"app {app.app_name} (the meta no longer lists it, but messages or sessions are stored for "
                        "it here: delete it in this admin when they may go)")
        else:
            app.delete()
    domain_names = {str(e.get("name")) for e in doc.get("domains") or []}
    for domain in Domain.objects.exclude(Q(name__in=domain_names) | Q(name=settings.DOMAIN_NAME)):
        if domain.distributions.exists() or domain.standby_distributions.exists():
            kept.append(f"domain {domain.name} (distributions of a kept app still name it)")
        else:
            domain.delete()
    return f"Kept: {'; '.join(kept)}." if kept else ""
