"""The web node's database lanes (foundation.asyncdb): a pooled thread never carries one call's
transaction into the next."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection, transaction

from apps_registry.models import Domain
from foundation.asyncdb import run_db

pytestmark = pytest.mark.django_db(transaction=True)


def _leave_a_transaction_open(name: str) -> None:
    transaction.atomic().__enter__()  # entered, never left: the bug this guards against
    Domain.objects.create(name=name, urls=["ws://nowhere.example/ws"])


def _state() -> tuple[bool, bool]:
    return connection.in_atomic_block, Domain.objects.filter(name="left-open").exists()


def test_a_call_that_leaves_a_transaction_open_is_rolled_back_and_the_next_call_starts_clean(caplog):
    async def calls() -> list:
        outcomes = []
        for _ in range(4):  # whichever pool thread took the first call, every later one is clean
            outcomes.append(await run_db(_state))
        return outcomes

    asyncio.run(run_db(_leave_a_transaction_open, "left-open"))
    assert "returned inside a transaction it never ended" in caplog.text
    assert asyncio.run(calls()) == [(False, False)] * 4  # nothing committed, nothing left open
    assert not Domain.objects.filter(name="left-open").exists()


def _leave_autocommit_off(name: str) -> None:
    # What a failure on the way out of an outermost atomic block leaves (its COMMIT done, turning
    # autocommit back on refused): every later block on the connection is a savepoint of one
    # transaction that is never committed.
    connection.set_autocommit(False)
    with transaction.atomic():
        Domain.objects.create(name=name, urls=["ws://nowhere.example/ws"])


def test_a_call_that_leaves_autocommit_off_is_rolled_back_and_the_next_call_starts_clean(caplog):
    async def calls() -> list:
        return [await run_db(_state) for _ in range(4)]

    asyncio.run(run_db(_leave_autocommit_off, "left-open"))
    assert "returned inside a transaction it never ended" in caplog.text
    assert asyncio.run(calls()) == [(False, False)] * 4
    assert not Domain.objects.filter(name="left-open").exists()
