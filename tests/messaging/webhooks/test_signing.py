"""The Switchboard-Signature header: what the platform sends and what a receiver checks."""

from __future__ import annotations

import hashlib
import hmac

from messaging.webhooks.signing import signature_header, signature_verify

SECRET = "whsec_test-secret"
BODY = b'{"id":"4f1c","event":"user.connected","app":"app-id-343","created":1700000000,"data":{"userId":"ANZ-7"}}'


def test_the_header_carries_the_timestamp_and_the_hmac_of_timestamp_dot_body():
    header = signature_header(secret=SECRET, body=BODY, timestamp=1700000000)
    expected = hmac.new(SECRET.encode(), b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"


def test_a_receiver_accepts_a_fresh_call_signed_with_its_secret():
    header = signature_header(secret=SECRET, body=BODY)
    assert signature_verify(secret=SECRET, header=header, body=BODY)


def test_a_changed_body_another_secret_or_a_moved_timestamp_is_refused():
    header = signature_header(secret=SECRET, body=BODY, timestamp=1700000000)
    assert not signature_verify(secret=SECRET, header=header, body=BODY.replace(b"ANZ-7", b"ANZ-8"), now=1700000000)
    assert not signature_verify(secret="whsec_other", header=header, body=BODY, now=1700000000)
    moved = header.replace("t=1700000000", "t=1700000001")
    assert not signature_verify(secret=SECRET, header=moved, body=BODY, now=1700000000)


def test_a_replayed_call_outside_the_tolerance_is_refused():
    header = signature_header(secret=SECRET, body=BODY, timestamp=1700000000)
    assert signature_verify(secret=SECRET, header=header, body=BODY, now=1700000000 + 299)
    assert not signature_verify(secret=SECRET, header=header, body=BODY, now=1700000000 + 301)


def test_garbage_headers_are_refused_not_raised():
    for header in ("", "v1=abc", "t=soon,v1=abc", "t=1700000000", "nonsense"):
        assert not signature_verify(secret=SECRET, header=header, body=BODY, now=1700000000)


def test_any_matching_v1_signature_is_enough():
    good = signature_header(secret=SECRET, body=BODY, timestamp=1700000000)
    header = good.replace("v1=", "v1=" + "0" * 64 + ",v1=")
    assert signature_verify(secret=SECRET, header=header, body=BODY, now=1700000000)


def test_the_verification_snippet_in_the_docs_accepts_a_real_signature_and_refuses_a_forged_one():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "webhooks.md").read_text()
    snippet = doc.split("## Verifying the signature", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102  (our own documentation)
    verify = namespace["switchboard_signature_ok"]
    header = signature_header(secret=SECRET, body=BODY)
    assert verify(SECRET, header, BODY)
    assert not verify("whsec_other", header, BODY)
    assert not verify(SECRET, header, BODY + b" ")
    assert not verify(SECRET, signature_header(secret=SECRET, body=BODY, timestamp=1700000000), BODY)
