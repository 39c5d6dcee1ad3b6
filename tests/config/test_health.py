from __future__ import annotations

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
def test_readyz_names_redis_when_it_does_not_answer(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # discard port: nothing listens
    response = client.get("/readyz")
    assert response.status_code == 503
    assert list(response.json()["failing"]) == ["redis"]


@pytest.mark.django_db(transaction=True)
def test_readyz_names_postgres_when_it_does_not_answer(client, settings):
    from django.db import connection

    real = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = "9"
    try:
        response = client.get("/readyz")
    finally:
        connection.close()
        connection.settings_dict.update(real)
    assert response.status_code == 503
    assert list(response.json()["failing"]) == ["postgres"]
