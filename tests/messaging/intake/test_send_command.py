"""`manage.py send`: a server-side send from the command line, through the API's services."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from apps_registry.selectors import app_snapshots_clear
from messaging.models import ChannelMessage, Message

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_snapshots():
    """Each test's apps are new rows: the per-process app snapshots of an earlier test must go."""
    app_snapshots_clear()
    yield
    app_snapshots_clear()


def _send(*args: str, stdin: str | None = None, monkeypatch=None) -> dict:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    out = io.StringIO()
    call_command("send", *args, stdout=out)
    return json.loads(out.getvalue())


def test_a_message_to_one_user_is_stored_and_its_id_printed(anz):
    answer = _send("--app", "ANZ", "--to", "ANZ-1002", "--reference", "r-1", "hello from the shell")
    message = Message.objects.get(pk=int(answer["id"]))
    assert (message.kind, message.sender, message.content, message.reference) == (
        "direct", "ANZ-123223", "hello from the shell", "r-1")
    assert answer["recipients"] == ["ANZ-1002"] and answer["feature"] == "RELIABLE"


def test_several_recipients_make_a_group_message_and_content_comes_from_stdin(anz, monkeypatch):
    answer = _send("--app", "ANZ", "--to", "ANZ-1,ANZ-2", "--to", "ANZ-3", "--from", "ANZ-9", stdin="piped text\n",
                   monkeypatch=monkeypatch)
    message = Message.objects.get(pk=int(answer["id"]))
    assert (message.kind, message.sender, message.content) == ("group", "ANZ-9", "piped text\n")
    assert message.deliveries.count() == 3


def test_a_fast_send_is_never_stored(anz):
    assert _send("--app", "ANZ", "--to", "ANZ-1", "--feature", "FAST", "blink") == {
        "feature": "FAST", "from": "ANZ-123223", "recipients": ["ANZ-1"], "connections": 0}
    assert not Message.objects.exists()


def test_a_channel_publish_prints_its_offset(anz, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = _send("--app", "ANZ", "--channel", "news", "one")
    assert first == {"channel": "news", "offset": 1, "subscribers": 0}
    assert ChannelMessage.objects.get().publisher == "manage.py send"


@pytest.mark.parametrize("args, error", [
    (["--app", "NOPE", "--to", "NOPE-1", "x"], "no client app named 'NOPE'"),
    (["--app", "ANZ", "--to", "BNZ-1", "x"], "unknown_user: recipient 'BNZ-1' is not a user of app ANZ"),
    (["--app", "ANZ", "--channel", "bad name", "x"], "invalid_channel"),
    (["--app", "ANZ", "--channel", "news", "--feature", "FAST", "x"], "always kept in the channel's history"),
])
def test_what_the_api_refuses_the_command_refuses(anz, args, error):
    with pytest.raises(CommandError) as refused:
        call_command("send", *args, stdout=io.StringIO())
    assert error in str(refused.value)
