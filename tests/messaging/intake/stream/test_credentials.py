"""An app's queue credential: a Redis ACL user that may XADD to its own intake stream and nothing else."""

from __future__ import annotations

import pytest
import redis
from django.core.management import call_command

from foundation.transport.queue_names import acl_user, intake_key, queue_db
from messaging.intake.stream.credentials import (
    CredentialExists,
    queue_acl_sync,
    queue_credential_revoke,
    queue_credential_rotate,
)
from messaging.intake.stream.models import QueueCredential
from tests.messaging.intake.stream.conftest import writer_for

pytestmark = pytest.mark.django_db


def test_credential_writes_its_own_stream(anz, credential, queue_redis):
    writer = writer_for("ANZ", credential(anz))
    assert writer.ping()
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "hello"})
    assert queue_redis.xlen(intake_key("ANZ")) == 1
    stored = QueueCredential.objects.get(app=anz)
    assert len(stored.password_sha256) == 64  # only the hash is kept


def test_credential_cannot_write_or_read_another_apps_stream_or_read_its_own(anz, bnz, credential, queue_redis):
    writer = writer_for("ANZ", credential(anz))
    credential(bnz)
    writer.xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "mine"})
    refused = [
        lambda: writer.xadd(intake_key("BNZ"), {"to": "BNZ-2", "content": "theirs"}),
        lambda: writer.xadd("sbq:ANZ:dead", {"content": "forged"}),
        lambda: writer.xrange(intake_key("ANZ")),
        lambda: writer.xread({intake_key("ANZ"): "0"}),
        lambda: writer.xrange(intake_key("BNZ")),
        lambda: writer.xread({intake_key("BNZ"): "0"}),
        lambda: writer.xlen(intake_key("ANZ")),
        lambda: writer.xreadgroup("switchboard", "me", {intake_key("ANZ"): ">"}),
        lambda: writer.xtrim(intake_key("ANZ"), maxlen=0),
        lambda: writer.delete(intake_key("ANZ")),
        lambda: writer.set(intake_key("ANZ"), "x"),
        lambda: writer.get("anything"),
        lambda: writer.keys("*"),
        lambda: writer.publish("sb-asgi", "x"),
        lambda: writer.execute_command("CONFIG", "GET", "*"),
        lambda: writer.execute_command("ACL", "WHOAMI"),
        lambda: writer.execute_command("FLUSHDB"),
        lambda: writer.eval("return redis.call('XRANGE', KEYS[1], '-', '+')", 1, intake_key("ANZ")),
        lambda: writer.execute_command("SELECT", (queue_db() + 1) % 16),  # another database: its own sbq:ANZ:in
    ]
    for command in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            command()
    assert queue_redis.xlen(intake_key("BNZ")) == 0
    assert queue_redis.xlen(intake_key("ANZ")) == 1


def test_rotate_makes_the_old_password_fail(anz, credential, queue_redis, django_capture_on_commit_callbacks):
    old = credential(anz)
    connected = writer_for("ANZ", old)
    connected.ping()
    with django_capture_on_commit_callbacks(execute=True):
        _, new = queue_credential_rotate(app=anz)
    with pytest.raises(redis.exceptions.AuthenticationError):
        writer_for("ANZ", old).ping()
    assert [c for c in queue_redis.client_list() if c["user"] == acl_user("ANZ")] == []  # its connection was closed
    with pytest.raises(redis.exceptions.ConnectionError):
        connected.ping()
    writer_for("ANZ", new).xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "after rotation"})
    with pytest.raises(CredentialExists):
        credential(anz)


def test_revoke_deletes_the_user(anz, credential, queue_redis, django_capture_on_commit_callbacks):
    password = credential(anz)
    with django_capture_on_commit_callbacks(execute=True):
        queue_credential_revoke(app=anz)
    with pytest.raises(redis.exceptions.AuthenticationError):
        writer_for("ANZ", password).ping()
    assert queue_redis.execute_command("ACL", "GETUSER", acl_user("ANZ")) is None


def test_sync_brings_back_users_a_restarted_redis_forgot_and_removes_stale_ones(anz, credential, queue_redis):
    password = credential(anz)
    queue_redis.execute_command("ACL", "DELUSER", acl_user("ANZ"))  # as after a Redis restart
    queue_redis.execute_command("ACL", "SETUSER", acl_user("GONE"), "on", ">pw", "+@all", "~*")  # an app deleted
    synced = queue_acl_sync()
    assert synced.applied == ("ANZ",)
    assert synced.removed == (acl_user("GONE"),)
    writer_for("ANZ", password).xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "back"})
    assert queue_acl_sync().applied == ()  # nothing to change


def test_command_creates_rotates_and_revokes(anz, queue_redis, capsys, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        call_command("queuecredential", "create", "ANZ")
    first = capsys.readouterr().out.strip().splitlines()[-1]
    writer_for("ANZ", first).xadd(intake_key("ANZ"), {"to": "ANZ-1002", "content": "from the shell"})
    with django_capture_on_commit_callbacks(execute=True):
        call_command("queuecredential", "rotate", "ANZ")
    second = capsys.readouterr().out.strip().splitlines()[-1]
    assert second != first
    writer_for("ANZ", second).ping()
    call_command("queuecredential", "list")
    assert acl_user("ANZ") in capsys.readouterr().out
    with django_capture_on_commit_callbacks(execute=True):
        call_command("queuecredential", "revoke", "ANZ")
    assert not QueueCredential.objects.exists()


def test_console_shows_the_password_once_and_rotates(anz, operator, queue_redis, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        page = operator.post("/admin/messaging/queuecredential/add/", {"app": anz.pk}, follow=True)
    html = page.content.decode()
    assert "shown only this once" in html
    password = html.split("class='new-queue-password'>", 1)[1].split("<", 1)[0]
    writer_for("ANZ", password).ping()
    credential = QueueCredential.objects.get(app=anz)
    with django_capture_on_commit_callbacks(execute=True):
        page = operator.post("/admin/messaging/queuecredential/", {"action": "rotate", "_selected_action": [credential.pk]},
                             follow=True)
    assert "shown only this once" in page.content.decode()
    with pytest.raises(redis.exceptions.AuthenticationError):
        writer_for("ANZ", password).ping()
    assert operator.get(f"/admin/messaging/queuecredential/{credential.pk}/change/").status_code == 200
