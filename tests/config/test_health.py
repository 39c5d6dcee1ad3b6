"""Health answers: /readyz names a failing part and nothing about how it failed."""

from __future__ import annotations

import logging

import pytest


@pytest.mark.django_db
def test_healthz_answers_while_the_process_serves(client):
    assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_readyz_is_ready_when_postgres_and_redis_answer(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


@pytest.mark.django_db
def test_readyz_names_redis_when_it_does_not_answer_but_not_its_address_or_error(client, settings, caplog):
    settings.REDIS_URL = "redis://secret-user:secret-pass@127.0.0.1:9/0"  # discard port: nothing listens
    with caplog.at_level(logging.WARNING, logger="config.health"):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "failing": ["redis"]}
    assert b"127.0.0.1" not in response.content and b"secret" not in response.content
    assert "redis does not answer" in caplog.text  # the details are for the operator's log


@pytest.mark.django_db(transaction=True)
def test_readyz_names_the_database_when_it_does_not_answer_but_not_its_address(client, settings, caplog):
    from django.db import connection

    real = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = "9"
    try:
        with caplog.at_level(logging.WARNING, logger="config.health"):
            response = client.get("/readyz")
    finally:
        connection.close()
        connection.settings_dict.update(real)
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "failing": ["database"]}
    assert real["HOST"].encode() not in response.content and b"port" not in response.content.lower()
    assert "the database does not answer" in caplog.text


@pytest.mark.django_db
def test_readyz_says_draining_from_the_moment_the_node_drains_while_healthz_still_answers(client, monkeypatch):
    import threading

    from foundation import draining

    monkeypatch.setattr(draining, "_draining", threading.Event())
    assert client.get("/readyz").status_code == 200
    draining.drain_begin()
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "draining" and response.json()["failing"] == ["draining"]
    assert client.get("/healthz").status_code == 200
