"""The checkout flow over the ledger's functions, branch by branch, sync and async, against
the real server and the real ledger: what the ledger records, what the server holds, and
the mistakes the ledger refuses."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator, Optional, Tuple

import psycopg
import pytest

import stockgate
from stockgate import (
    AlreadyCommitted,
    AsyncCheckout,
    AsyncClient,
    Checkout,
    Client,
    Committed,
    Denied,
    Hold,
    Limit,
    OrderNotFound,
    OrderRefused,
    OrderStatus,
    OverLimit,
    RefundRequired,
    Refused,
    ReservationState,
    SoldOut,
)


@pytest.fixture()
def co(client: Client, database_url: str, schema: str) -> Iterator[Checkout]:
    c = Checkout(client, database_url, schema=schema, pool_size=4)
    yield c
    c.close()


def order(db: "psycopg.Connection[Any]", schema: str, token: str) -> Optional[Tuple[Any, ...]]:
    return db.execute(
        f'SELECT status, qty, user_id, request_id, payment_ref, '
        f"(extract(epoch from reservation_expires_at) * 1000)::bigint, "
        f"(extract(epoch from reservation_created_at) * 1000)::bigint "
        f'FROM "{schema}".orders WHERE reservation_token = %s',
        (token,),
    ).fetchone()


def events(db: "psycopg.Connection[Any]", schema: str, token: str) -> list:
    return db.execute(
        f'SELECT from_status, to_status, actor FROM "{schema}".order_events '
        "WHERE reservation_token = %s ORDER BY id",
        (token,),
    ).fetchall()


def start(co: Checkout, keyring: stockgate.Keyring, sku: str, user: str, rid: str = "r1", qty: int = 1) -> Hold:
    h = co.reserve_and_record(sku, user, keyring.mint(sku, user), rid, qty)
    assert isinstance(h, Hold), h
    return h


def test_reserve_and_record_then_pay(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    client.sale_create(sku, 10, shards=1, ttl_ms=60_000)
    h = start(co, keyring, sku, "alice", qty=2)
    r = client.reservation(h.token)
    assert r is not None
    # The ledger records the server's own times and the hold's qty.
    assert order(db, schema, h.token) == ("PENDING", 2, "alice", "r1", None, r.expires_at_ms, r.created_at_ms)
    assert (h.qty, h.created_at_ms, h.expires_at_ms, h.replay) == (2, r.created_at_ms, r.expires_at_ms, False)
    again = start(co, keyring, sku, "alice", qty=2)
    assert again.token == h.token and again.replay and not again.already_committed

    assert co.pay(h.token, "pay-1") == Committed(server_confirmed=True)
    assert client.reservation(h.token).state == ReservationState.COMMITTED  # type: ignore[union-attr]
    assert order(db, schema, h.token)[:5] == ("COMMITTED", 2, "alice", "r1", "pay-1")  # type: ignore[index]
    # The same payment again: the ledger knows it, the server's hold is this order's.
    assert co.pay(h.token, "pay-1") == AlreadyCommitted()
    # A retry of the checkout after the payment.
    assert start(co, keyring, sku, "alice", qty=2).already_committed
    assert events(db, schema, h.token) == [(None, "PENDING", "checkout"), ("PENDING", "COMMITTED", "payment")]
    info = client.sale_info(sku)
    assert (info.committed, info.reserved) == (2, 0)
    with pytest.raises(OrderRefused) as e:
        co.cancel(h.token)
    assert (e.value.code, e.value.status) == ("SG001", "COMMITTED")
    assert client.sale_info(sku).committed == 2, "a paid order's units stay sold"


def test_cancel(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    client.sale_create(sku, 1, shards=1, ttl_ms=60_000)
    h = start(co, keyring, sku, "bob")
    assert client.stock(sku) == 0
    assert co.cancel(h.token) is True
    assert client.stock(sku) == 1, "units back at once"
    assert client.reservation(h.token).state == ReservationState.RELEASED  # type: ignore[union-attr]
    assert order(db, schema, h.token)[0] == "CANCELLED"  # type: ignore[index]
    assert co.cancel(h.token) is False  # ALREADY_CANCELLED; nothing more to release
    # Paying a cancelled order: refused, or marked for refund when the money moved.
    assert co.pay(h.token, "p", money_moved=False) == Refused(OrderStatus.CANCELLED)
    assert co.pay(h.token, "p", money_moved=True) == RefundRequired(OrderStatus.CANCELLED)
    with pytest.raises(stockgate.OrderRefused):
        co.reserve_and_record(sku, "bob", keyring.mint(sku, "bob"), "r1")
    with pytest.raises(OrderNotFound) as nf:
        co.cancel("{" + sku + "}" + "b" * 26)
    assert nf.value.code == "SG003"


def test_late_payment_is_refused_by_the_ledger(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    client.sale_create(sku, 5, shards=1, ttl_ms=300)
    h = start(co, keyring, sku, "carol")
    while stockgate.now_ms() <= h.expires_at_ms + 20:
        time.sleep(0.02)
    assert co.pay(h.token, "late", money_moved=False) in (
        Refused(OrderStatus.PENDING),
        Refused(OrderStatus.CANCELLED_BY_SWEEPER),
    )
    status = order(db, schema, h.token)[0]  # type: ignore[index]
    assert status in ("PENDING", "CANCELLED_BY_SWEEPER"), "a refusal changes nothing"
    out = co.pay(h.token, "late", money_moved=True)
    # The sweeper of this run may cancel the late order between the read and this payment.
    assert isinstance(out, RefundRequired) and out.previous.value in (status, "CANCELLED_BY_SWEEPER"), out
    assert order(db, schema, h.token)[0] == "REFUND_REQUIRED"  # type: ignore[index]
    assert client.sale_info(sku).committed == 0, "a late payment sells nothing"
    assert co.pay("{" + sku + "}" + "c" * 26, "p") == Refused(None)


def split_parent(db: Any, schema: str, parent: str, parts: list, limit: int) -> None:
    """Records `parts` (sales the test made) as the parts of a split sale, as
    ``stockgate-sweeper split`` does."""
    for p in parts:
        db.execute(
            f'INSERT INTO "{schema}".sales (sku, initial_allocation, allocation) VALUES (%s, 10, 10)',
            (p,),
        )
    db.execute(
        f'INSERT INTO "{schema}".split_parents (parent, allocation, parts, per_user_limit) '
        "VALUES (%s, %s, %s, %s)",
        (parent, 10 * len(parts), len(parts), limit),
    )
    for i, p in enumerate(parts):
        db.execute(
            f'INSERT INTO "{schema}".split_parts (parent, part_index, sku, history_id) '
            "VALUES (%s, %s, %s, 'test-history')",
            (parent, i, p),
        )


def test_payment_over_a_split_sales_per_user_limit(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    parts = [f"{sku}.p0", f"{sku}.p1", f"{sku}.p2"]
    for p in parts:
        client.sale_create(p, 10, shards=1, ttl_ms=60_000, limit=2)
    split_parent(db, schema, f"PYL-{sku[-8:]}", parts, limit=2)
    # The limit on each part is the server's; over the parent it is the ledger's, at payment.
    holds = [start(co, keyring, p, "erin", qty=2) for p in parts]
    assert co.pay(holds[0].token, "p0") == Committed(server_confirmed=True)
    assert co.pay(holds[1].token, "p1", money_moved=False) == OverLimit()
    assert order(db, schema, holds[1].token)[0] == "PENDING", "a refusal changes nothing"
    assert co.pay(holds[2].token, "p2", money_moved=True) == RefundRequired(OrderStatus.PENDING)
    assert order(db, schema, holds[2].token)[0] == "REFUND_REQUIRED"
    assert sum(client.sale_info(p).committed for p in parts) == 2, "the limit over the parent"
    # Another buyer is not affected by erin's purchases.
    other = start(co, keyring, parts[1], "frank", qty=2)
    assert co.pay(other.token, "f1") == Committed(server_confirmed=True)


def test_server_released_the_units_after_the_ledger_committed(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    """Someone broke the ledger-first rule and released the hold on the server: the
    payment the ledger took cannot stand, and the order is marked for refund."""
    client.sale_create(sku, 5, shards=1, ttl_ms=60_000)
    h = start(co, keyring, sku, "dave")
    assert client.release(h.token, "admin")
    assert co.pay(h.token, "pay-d") == RefundRequired(OrderStatus.COMMITTED)
    assert order(db, schema, h.token)[0] == "REFUND_REQUIRED"  # type: ignore[index]


def test_server_does_not_know_the_token(co: Checkout, client: Client, db: Any, schema: str, sku: str) -> None:
    """An order the server has no hold for (lost and rebuilt without it): paid in the
    ledger, then refused by the server, then marked for refund."""
    client.sale_create(sku, 5, shards=1, ttl_ms=60_000)
    token = "{" + sku + "}" + "d" * 26
    now = stockgate.now_ms()
    db.execute(
        f'SELECT "{schema}".materialize_order(%s, %s, %s, %s, 1, %s, %s)',
        (token, sku, "erin", "r1", now + 60_000, now),
    )
    assert co.pay(token, "pay-e") == RefundRequired(OrderStatus.COMMITTED)
    assert order(db, schema, token)[0] == "REFUND_REQUIRED"  # type: ignore[index]


def test_a_paid_token_whose_server_hold_is_another_one(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    """The same-hold check: the ledger holds a paid order for a token, the server's hold for
    that token is not the one it was paid for; a payment retry must not commit it."""
    client.sale_create(sku, 5, shards=1, ttl_ms=60_000)
    h = start(co, keyring, sku, "frank")
    # The ledger's record of this token says another creation time and expiry.
    db.execute(
        f'UPDATE "{schema}".orders SET reservation_created_at = reservation_created_at - interval \'1 hour\', '
        "reservation_expires_at = reservation_expires_at - interval '1 minute', status = 'COMMITTED', "
        "committed_at = now() WHERE reservation_token = %s",
        (h.token,),
    )
    assert co.pay(h.token, "pay-f") == AlreadyCommitted()
    r = client.reservation(h.token)
    assert r is not None and r.state == ReservationState.RELEASED, "the unpaid hold is given back, not sold"
    assert client.sale_info(sku).committed == 0


def test_extend_and_passthrough_outcomes(co: Checkout, client: Client, keyring: stockgate.Keyring, db: Any, schema: str, sku: str) -> None:
    client.sale_create(sku, 1, shards=1, ttl_ms=60_000, limit=1)
    h = start(co, keyring, sku, "gina")
    at = co.extend(h.token, 120_000)
    assert at > h.expires_at_ms and order(db, schema, h.token)[5] == at  # type: ignore[index]
    assert co.reserve_and_record(sku, "gina", keyring.mint(sku, "gina"), "r2") == Limit((h.token,), 1, 1)
    assert co.reserve_and_record(sku, "hal", keyring.mint(sku, "hal"), "r1") == SoldOut()
    d = co.reserve_and_record(sku, "hal", keyring.mint(sku, "other"), "r1")
    assert isinstance(d, Denied) and d.reason == "wrong_user"
    assert order(db, schema, "{" + sku + "}" + "e" * 26) is None


def test_async_checkout(addr: str, keyring: stockgate.Keyring, database_url: str, schema: str, sku: str) -> None:
    async def run() -> None:
        client = AsyncClient.connect(addr)
        co = AsyncCheckout(client, database_url, schema=schema, pool_size=4)
        try:
            await client.sale_create(sku, 3, shards=1, ttl_ms=60_000)
            holds = await asyncio.gather(
                *(co.reserve_and_record(sku, u, keyring.mint(sku, u), "r1") for u in ("a", "b", "c", "d"))
            )
            got = [h for h in holds if isinstance(h, Hold)]
            assert len(got) == 3 and sum(isinstance(h, SoldOut) for h in holds) == 1
            assert await co.pay(got[0].token, "p0") == Committed(server_confirmed=True)
            assert await co.pay(got[0].token, "p0") == AlreadyCommitted()
            assert await co.cancel(got[1].token) is True
            with pytest.raises(OrderRefused):
                await co.cancel(got[0].token)
            at = await co.extend(got[2].token, 90_000)
            assert at > got[2].expires_at_ms
            assert await co.pay(got[2].token, "p2", money_moved=False) == Committed(server_confirmed=True)
            info = await client.sale_info(sku)
            assert (info.committed, info.reserved, info.available) == (2, 0, 1)
        finally:
            await co.close()
            await client.close()

    asyncio.run(run())
