"""Resumable session ids (messaging.requests.sessions): issued by the server, bound to one user of one
app, checked without a lookup; ending a session discards what waited for it, once."""

from __future__ import annotations

import pytest

from messaging.requests.sessions import client_session_belongs, client_session_new


def test_a_session_id_belongs_to_the_user_and_app_it_was_issued_to_only():
    session = client_session_new(app_id="app-id-343", user_id="ANZ-1001")
    assert client_session_belongs(session, app_id="app-id-343", user_id="ANZ-1001")
    assert not client_session_belongs(session, app_id="app-id-343", user_id="ANZ-1002")
    assert not client_session_belongs(session, app_id="app-id-bnz", user_id="ANZ-1001")
    assert client_session_new(app_id="app-id-343", user_id="ANZ-1001") != session  # a new one each time
    assert "|" not in session and len(session) <= 40  # (the presence cache's value holds it)


@pytest.mark.parametrize("made_up", ["", "s", "sAAAA.BBBB", "s.a.b", "x" * 200, "sQ2x.." + "A" * 16])
def test_a_made_up_session_id_belongs_to_nobody(made_up):
    assert not client_session_belongs(made_up, app_id="app-id-343", user_id="ANZ-1001")


def test_a_session_id_signed_with_another_secret_is_refused(settings):
    session = client_session_new(app_id="app-id-343", user_id="ANZ-1001")
    settings.SECRET_KEY = "another deployment's secret key, long enough to be a key" * 2
    assert not client_session_belongs(session, app_id="app-id-343", user_id="ANZ-1001")
