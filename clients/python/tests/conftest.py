"""Fixtures over the environment the CI harness gives (tests/clients/python_package.rs; the
contract is in the shared ledger-functions spec):

STOCKGATE_ADDR, STOCKGATE_SECRET_FILE, STOCKGATE_DATABASE_URL, STOCKGATE_LEDGER_SCHEMA,
STOCKGATE_SWEEPER_RUNNING for the single-server tests; STOCKGATE_GROUP_ADDRS and
STOCKGATE_FAILOVER_SIGNAL for the failover test. A test whose environment is missing is
skipped, naming the variable; the harness refuses a run with any skip."""

from __future__ import annotations

import os
import uuid
from typing import Iterator

import psycopg
import pytest

import stockgate


def env(name: str) -> str:
    v = os.environ.get(name, "")
    if not v:
        pytest.skip(f"{name} is not set (the CI harness tests/clients/python_package.rs sets it)")
    return v


@pytest.fixture(scope="session")
def addr() -> str:
    return env("STOCKGATE_ADDR")


@pytest.fixture(scope="session")
def secret_file() -> str:
    return env("STOCKGATE_SECRET_FILE")


@pytest.fixture(scope="session")
def keyring(secret_file: str) -> stockgate.Keyring:
    return stockgate.Keyring.from_file(secret_file)


@pytest.fixture(scope="session")
def database_url() -> str:
    return env("STOCKGATE_DATABASE_URL")


@pytest.fixture(scope="session")
def schema() -> str:
    return os.environ.get("STOCKGATE_LEDGER_SCHEMA") or "stockgate"


@pytest.fixture(scope="session")
def sweeper_running() -> bool:
    if env("STOCKGATE_SWEEPER_RUNNING") != "1":
        pytest.skip("STOCKGATE_SWEEPER_RUNNING is not 1")
    return True


@pytest.fixture()
def client(addr: str) -> Iterator[stockgate.Client]:
    c = stockgate.Client.connect(addr)
    yield c
    c.close()


@pytest.fixture()
def db(database_url: str) -> Iterator["psycopg.Connection[tuple]"]:
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture()
def sku(request: pytest.FixtureRequest) -> str:
    """A sale name of this test's own (sales are never dropped)."""
    base = "".join(ch for ch in request.node.name.upper() if ch.isalnum())[:40]
    return f"PY-{base}-{uuid.uuid4().hex[:8]}"
