"""The checkout flow over the ledger's functions (docs/ledger.md; migration
``0006_ledger_functions.sql``), the same steps as the Rust ``stockgate_client::Checkout``:

1. :meth:`Checkout.reserve_and_record`: ``RESERVE`` on the server, ``RESERVATION`` to read
   the hold back (a replay's qty and times are the original's, and the server's creation
   time identifies the hold later), then ``materialize_order`` in the ledger.
2. :meth:`Checkout.pay`: ``pay_order`` in the ledger (the expiry guard and the refund
   branch are the ledger's), then ``COMMIT token VERIFIED`` on the server, with the
   branches for a server that released the units, does not know the token, refuses
   ``VERIFIED`` to this role, or is past the deadline.
3. :meth:`Checkout.cancel`: ``cancel_order`` in the ledger, then ``RELEASE token REASON
   cancel`` on the server, so the units are back at once (if this dies in between, the
   sweeper releases the cancelled order's hold when it expires).

The reservation token is the correlation key everywhere, and the payment's idempotency
key: a second payment with the same token is the same payment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Optional, Protocol, Tuple, TypeVar, Union

import psycopg
from psycopg import sql

from ._core import RetryPolicy, log
from ._pool import AsyncPool, SyncPool
from .admission import now_ms
from .aio import AsyncClient
from .client import Client
from .errors import (
    LedgerError,
    NoPerm,
    NoReservation,
    Released,
    StockgateError,
    Unavailable,
    ledger_error,
)
from .results import (
    AlreadyCommitted,
    Committed,
    Denied,
    Hold,
    Limit,
    OrderStatus,
    OverLimit,
    PayOutcome,
    RefundRequired,
    Refused,
    Replay,
    Reservation,
    ReservationState,
    Reserved,
    SoldOut,
)

__all__ = ["Checkout", "AsyncCheckout", "StartOutcome"]

T = TypeVar("T")

#: What :meth:`Checkout.reserve_and_record` answers.
StartOutcome = Union[Hold, SoldOut, Limit, Denied]


class _SyncPoolLike(Protocol):
    def connection(self) -> Any: ...


class _AsyncPoolLike(Protocol):
    def connection(self) -> Any: ...


def _fn(schema: str, name: str, args: str, table: bool = False) -> sql.Composed:
    head = "SELECT * FROM {}.{}(" if table else "SELECT {}.{}("
    return sql.SQL(head + args + ")").format(sql.Identifier(schema), sql.Identifier(name))


class _Sql:
    def __init__(self, schema: str) -> None:
        self.materialize = _fn(
            schema,
            "materialize_order",
            "%s::text, %s::text, %s::text, %s::text, %s::integer, %s::bigint, %s::bigint",
        )
        self.pay = _fn(schema, "pay_order", "%s::text, %s::text, %s::boolean", table=True)
        self.cancel = _fn(schema, "cancel_order", "%s::text")
        self.extend = _fn(schema, "extend_order", "%s::text, %s::bigint")
        self.refund_required = _fn(schema, "mark_refund_required", "%s::text, %s::text, %s::text")
        self.refunded = _fn(schema, "mark_refunded", "%s::text")
        self.is_hold = _fn(
            schema,
            "order_is_hold",
            "%s::text, %s::text, %s::text, %s::integer, %s::bigint, %s::bigint",
        )


def _connection_lost(e: psycopg.Error, conn: Any) -> bool:
    """Whether the statement's outcome is unknown because the connection failed (then
    it is sent again on another connection: every ledger function is safe to repeat)."""
    if getattr(conn, "broken", False) or getattr(conn, "closed", False):
        return True
    state = getattr(e, "sqlstate", None)
    if state is None:
        return isinstance(e, psycopg.OperationalError)
    # 08: connection exception; 57P01..03: the server is shutting down or restarting.
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _as_ledger_error(e: psycopg.Error, token: Optional[str]) -> StockgateError:
    state = getattr(e, "sqlstate", None) or "SG000"
    diag = getattr(e, "diag", None)
    message = (diag.message_primary if diag is not None else None) or str(e)
    typed = ledger_error(state, message, token)
    return typed if typed is not None else LedgerError(message, state, token)


def _status(s: Optional[str]) -> Optional[OrderStatus]:
    return None if s is None else OrderStatus(s)


def _same_hold_args(token: str, r: Reservation) -> Tuple[Any, ...]:
    return (token, r.sku, r.user, r.qty, r.created_at_ms, r.expires_at_ms)


class _Ledger:
    """The ledger's functions over a sync pool, each sent again on a fresh connection
    after a lost connection, within the retry policy's deadline."""

    def __init__(self, pool: _SyncPoolLike, schema: str, retry: RetryPolicy) -> None:
        self.pool = pool
        self.q = _Sql(schema)
        self.retry = retry

    def _run(self, query: sql.Composed, args: Tuple[Any, ...], token: Optional[str]) -> Any:
        start = time.monotonic()
        attempt = 0
        while True:
            conn: Any = None
            try:
                with self.pool.connection() as conn:
                    return conn.execute(query, args).fetchone()
            except psycopg.Error as e:
                if not _connection_lost(e, conn):
                    raise _as_ledger_error(e, token) from e
                attempt += 1
                pause = self.retry.backoff(attempt)
                if time.monotonic() - start + pause > self.retry.deadline:
                    raise Unavailable(f"ledger unreachable for {self.retry.deadline:g} s: {e}", e) from e
                log.debug("ledger call for %s: %s; sending it again", token, e)
                time.sleep(pause)

    def materialize(self, h: Hold) -> str:
        row = self._run(
            self.q.materialize,
            (h.token, h.sku, h.user, h.request_id, h.qty, h.expires_at_ms, h.created_at_ms),
            h.token,
        )
        return str(row[0])

    def pay(self, token: str, payment_ref: str, money_moved: bool) -> Tuple[str, Optional[str]]:
        row = self._run(self.q.pay, (token, payment_ref, money_moved), token)
        return str(row[0]), row[1]

    def cancel(self, token: str) -> str:
        return str(self._run(self.q.cancel, (token,), token)[0])

    def extend(self, token: str, expires_at_ms: int) -> str:
        return str(self._run(self.q.extend, (token, expires_at_ms), token)[0])

    def mark_refund_required(self, token: str, payment_ref: Optional[str], reason: str) -> str:
        return str(self._run(self.q.refund_required, (token, payment_ref, reason), token)[0])

    def mark_refunded(self, token: str) -> str:
        return str(self._run(self.q.refunded, (token,), token)[0])

    def order_is_hold(self, token: str, r: Reservation) -> bool:
        return bool(self._run(self.q.is_hold, _same_hold_args(token, r), token)[0])


class _AsyncLedger:
    def __init__(self, pool: _AsyncPoolLike, schema: str, retry: RetryPolicy) -> None:
        self.pool = pool
        self.q = _Sql(schema)
        self.retry = retry

    async def _run(self, query: sql.Composed, args: Tuple[Any, ...], token: Optional[str]) -> Any:
        start = time.monotonic()
        attempt = 0
        while True:
            conn: Any = None
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(query, args)
                    return await cur.fetchone()
            except psycopg.Error as e:
                if not _connection_lost(e, conn):
                    raise _as_ledger_error(e, token) from e
                attempt += 1
                pause = self.retry.backoff(attempt)
                if time.monotonic() - start + pause > self.retry.deadline:
                    raise Unavailable(f"ledger unreachable for {self.retry.deadline:g} s: {e}", e) from e
                log.debug("ledger call for %s: %s; sending it again", token, e)
                await asyncio.sleep(pause)

    async def materialize(self, h: Hold) -> str:
        row = await self._run(
            self.q.materialize,
            (h.token, h.sku, h.user, h.request_id, h.qty, h.expires_at_ms, h.created_at_ms),
            h.token,
        )
        return str(row[0])

    async def pay(self, token: str, payment_ref: str, money_moved: bool) -> Tuple[str, Optional[str]]:
        row = await self._run(self.q.pay, (token, payment_ref, money_moved), token)
        return str(row[0]), row[1]

    async def cancel(self, token: str) -> str:
        return str((await self._run(self.q.cancel, (token,), token))[0])

    async def extend(self, token: str, expires_at_ms: int) -> str:
        return str((await self._run(self.q.extend, (token, expires_at_ms), token))[0])

    async def mark_refund_required(self, token: str, payment_ref: Optional[str], reason: str) -> str:
        return str((await self._run(self.q.refund_required, (token, payment_ref, reason), token))[0])

    async def mark_refunded(self, token: str) -> str:
        return str((await self._run(self.q.refunded, (token,), token))[0])

    async def order_is_hold(self, token: str, r: Reservation) -> bool:
        return bool((await self._run(self.q.is_hold, _same_hold_args(token, r), token))[0])


# --- the decisions both flavours share -------------------------------------------------


def _hold_from(
    outcome: Union[Reserved, Replay], sku: str, user: str, request_id: str, qty: int, r: Optional[Reservation]
) -> Hold:
    if r is not None:
        return Hold(outcome.token, sku, user, request_id, r.qty, r.expires_at_ms, r.created_at_ms,
                    replay=isinstance(outcome, Replay))
    # The server has no full record (purged): the request's qty and the reply's expiry;
    # an approximate creation time only weakens the same-hold check to the expiry.
    return Hold(outcome.token, sku, user, request_id, qty, outcome.expires_at_ms, now_ms(),
                replay=isinstance(outcome, Replay))


def _pay_outcome_of_ledger(outcome: str, previous: Optional[str]) -> Optional[PayOutcome]:
    """The outcome when the ledger step alone decides (no server COMMIT follows)."""
    if outcome == "REFUSED":
        return Refused(_status(previous))
    if outcome == "LIMIT":
        return OverLimit()
    if outcome == "REFUND_REQUIRED":
        return RefundRequired(OrderStatus(previous or "PENDING"))
    if outcome == "NOT_FOUND":
        return Refused(None)
    return None


def _deferred(fresh: bool) -> PayOutcome:
    return Committed(server_confirmed=False) if fresh else AlreadyCommitted()


class Checkout:
    """The checkout flow, synchronous. ``ledger`` is a Postgres conninfo/URL (a small pool
    of ``pool_size`` connections is made) or a pool with a ``connection()`` context
    manager (``psycopg_pool.ConnectionPool``). ``schema`` is the ledger's schema
    (``stockgate-sweeper --schema``, default ``stockgate``)."""

    def __init__(
        self,
        client: Client,
        ledger: Union[str, _SyncPoolLike],
        *,
        schema: str = "stockgate",
        pool_size: int = 10,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        self.client = client
        self._own_pool = isinstance(ledger, str)
        pool: _SyncPoolLike = SyncPool(ledger, pool_size) if isinstance(ledger, str) else ledger
        self._ledger = _Ledger(pool, schema, retry or client.retry)
        # Set once the server refused `COMMIT ... VERIFIED` to this connection's role.
        self._plain_commit_only = False

    def close(self) -> None:
        if self._own_pool and isinstance(self._ledger.pool, SyncPool):
            self._ledger.pool.close()

    def reserve_and_record(
        self, sku: str, user: str, admission: str, request_id: str, qty: int = 1
    ) -> StartOutcome:
        """Reserve on the server, read the hold back, record it as a PENDING order.

        Safe to call again with the same request id (the same token comes back and the
        order is found). Raises :class:`~stockgate.errors.OrderRefused` if the ledger
        already has the token cancelled (e.g. the sweeper tombstoned it first): do not take
        the payment."""
        outcome = self.client.reserve(sku, user, admission, request_id, qty)
        if not isinstance(outcome, (Reserved, Replay)):
            return outcome
        try:
            r = self.client.reservation(outcome.token)
        except StockgateError as e:
            if isinstance(outcome, Replay):
                raise
            # The hold exists; do not fail the checkout for the read-back.
            log.warning("could not read reservation %s back: %s", outcome.token, e)
            r = None
        hold = _hold_from(outcome, sku, user, request_id, qty, r)
        m = self._ledger.materialize(hold)
        if m == "ALREADY_COMMITTED" and isinstance(outcome, Reserved):
            # The server took stock again for a request that is already paid: it no longer
            # knew the paid hold, so this new hold is not the one the payment paid for.
            log.error("a paid request took a new hold %s on the server: releasing it", hold.token)
            self.client.release(hold.token)
        return dataclasses.replace(hold, already_committed=m == "ALREADY_COMMITTED")

    def pay(self, token: str, payment_ref: str, money_moved: bool = True) -> PayOutcome:
        """A payment for ``token``. ``money_moved``: the provider already took the money (a
        capture webhook, a one-step charge); False for authorize-then-capture, where a
        refusal means "do not capture".

        Ledger first (PENDING → COMMITTED only while the hold is unexpired), then
        ``COMMIT`` on the server. A late or cancelled hold is refused, or marked
        REFUND_REQUIRED if money moved: never a sale beyond stock."""
        outcome, previous = self._ledger.pay(token, payment_ref, money_moved)
        decided = _pay_outcome_of_ledger(outcome, previous)
        if decided is not None:
            if outcome == "NOT_FOUND" and money_moved:
                log.error("money moved for reservation %s, which the ledger never saw", token)
            return decided
        fresh = outcome == "COMMITTED"
        if not fresh and not self._holds_or_unknown(token):
            # A retry of a payment the ledger already has, and the server's hold for this
            # token (if any) is not the one it paid for: committing it would sell twice.
            return AlreadyCommitted()
        try:
            done = self._commit_on_server(token)
        except Released:
            log.error("ledger committed %s but the server had released it: REFUND_REQUIRED", token)
            prev = self._ledger.mark_refund_required(token, payment_ref, "server released the units")
            return RefundRequired(OrderStatus(prev))
        except NoReservation:
            if not fresh:
                # A retry long after the sale (the server purged its record).
                return AlreadyCommitted()
            log.error("ledger committed %s but the server has no such reservation: REFUND_REQUIRED", token)
            prev = self._ledger.mark_refund_required(token, payment_ref, "server has no such reservation")
            return RefundRequired(OrderStatus(prev))
        except StockgateError as e:
            # The payment stands in the ledger; the sweeper (which may send VERIFIED)
            # commits the hold on the server. Unreachable, fenced, late, moved to another
            # group or any other refusal: money moved and the ledger committed, so the
            # outcome says the server is yet to confirm, and nothing is raised.
            log.warning("ledger committed %s; server COMMIT deferred to the sweeper: %s", token, e)
            return _deferred(fresh)
        if done and fresh:
            return Committed(server_confirmed=True)
        return AlreadyCommitted()

    def _holds_or_unknown(self, token: str) -> bool:
        """Whether the server's hold is the one the ledger was paid for; False when the
        server cannot say now (the ledger has the payment: the sweeper finishes it)."""
        try:
            return self._server_holds_this_payment(token)
        except StockgateError as e:
            log.warning("ledger has the payment for %s; server check deferred: %s", token, e)
            return False

    def _commit_on_server(self, token: str) -> bool:
        # The ledger accepted the payment under its expiry guard: in time even if this
        # COMMIT arrives after the deadline, so it says VERIFIED. A role that may not
        # (checkout) gets -NOPERM once, and then plain COMMIT is sent.
        if not self._plain_commit_only:
            try:
                return self.client.commit(token, verified=True)
            except NoPerm:
                self._plain_commit_only = True
        return self.client.commit(token)

    def _server_holds_this_payment(self, token: str) -> bool:
        r = self.client.reservation(token)
        if r is None:
            return False
        if self._ledger.order_is_hold(token, r):
            return True
        log.error("paid order %s, but the server's hold for its token is another one: not committing it", token)
        if r.state == ReservationState.RESERVED:
            self.client.release(token)
        return False

    def cancel(self, token: str) -> bool:
        """The buyer abandons: ``cancel_order`` (PENDING → CANCELLED), then ``RELEASE token
        REASON cancel``. True if this call gave the units back. Raises
        :class:`~stockgate.errors.OrderRefused` for a paid, refunded or swept order and
        :class:`~stockgate.errors.OrderNotFound` for an unknown token."""
        self._ledger.cancel(token)
        return self.client.release(token, "cancel")

    def extend(self, token: str, ms: int) -> int:
        """Extend the hold by ``ms`` from now: server first (it refuses expired holds), then
        the ledger. If the ledger step fails, the ledger keeps the earlier deadline, which
        is only stricter."""
        at = self.client.extend(token, ms)
        self._ledger.extend(token, at)
        return at

    def mark_refunded(self, token: str) -> str:
        """REFUND_REQUIRED → REFUNDED once the refund went out: ``REFUNDED`` or
        ``ALREADY_REFUNDED``."""
        return self._ledger.mark_refunded(token)


class AsyncCheckout:
    """The checkout flow on asyncio; see :class:`Checkout`. ``ledger`` is a conninfo/URL
    or a pool with an async ``connection()`` context manager
    (``psycopg_pool.AsyncConnectionPool``)."""

    def __init__(
        self,
        client: AsyncClient,
        ledger: Union[str, _AsyncPoolLike],
        *,
        schema: str = "stockgate",
        pool_size: int = 10,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        self.client = client
        self._own_pool = isinstance(ledger, str)
        pool: _AsyncPoolLike = AsyncPool(ledger, pool_size) if isinstance(ledger, str) else ledger
        self._ledger = _AsyncLedger(pool, schema, retry or client.retry)
        self._plain_commit_only = False

    async def close(self) -> None:
        if self._own_pool and isinstance(self._ledger.pool, AsyncPool):
            await self._ledger.pool.close()

    async def reserve_and_record(
        self, sku: str, user: str, admission: str, request_id: str, qty: int = 1
    ) -> StartOutcome:
        """See :meth:`Checkout.reserve_and_record`."""
        outcome = await self.client.reserve(sku, user, admission, request_id, qty)
        if not isinstance(outcome, (Reserved, Replay)):
            return outcome
        try:
            r = await self.client.reservation(outcome.token)
        except StockgateError as e:
            if isinstance(outcome, Replay):
                raise
            log.warning("could not read reservation %s back: %s", outcome.token, e)
            r = None
        hold = _hold_from(outcome, sku, user, request_id, qty, r)
        m = await self._ledger.materialize(hold)
        if m == "ALREADY_COMMITTED" and isinstance(outcome, Reserved):
            log.error("a paid request took a new hold %s on the server: releasing it", hold.token)
            await self.client.release(hold.token)
        return dataclasses.replace(hold, already_committed=m == "ALREADY_COMMITTED")

    async def pay(self, token: str, payment_ref: str, money_moved: bool = True) -> PayOutcome:
        """See :meth:`Checkout.pay`."""
        outcome, previous = await self._ledger.pay(token, payment_ref, money_moved)
        decided = _pay_outcome_of_ledger(outcome, previous)
        if decided is not None:
            if outcome == "NOT_FOUND" and money_moved:
                log.error("money moved for reservation %s, which the ledger never saw", token)
            return decided
        fresh = outcome == "COMMITTED"
        if not fresh and not await self._holds_or_unknown(token):
            return AlreadyCommitted()
        try:
            done = await self._commit_on_server(token)
        except Released:
            log.error("ledger committed %s but the server had released it: REFUND_REQUIRED", token)
            prev = await self._ledger.mark_refund_required(token, payment_ref, "server released the units")
            return RefundRequired(OrderStatus(prev))
        except NoReservation:
            if not fresh:
                return AlreadyCommitted()
            log.error("ledger committed %s but the server has no such reservation: REFUND_REQUIRED", token)
            prev = await self._ledger.mark_refund_required(token, payment_ref, "server has no such reservation")
            return RefundRequired(OrderStatus(prev))
        except StockgateError as e:
            log.warning("ledger committed %s; server COMMIT deferred to the sweeper: %s", token, e)
            return _deferred(fresh)
        if done and fresh:
            return Committed(server_confirmed=True)
        return AlreadyCommitted()

    async def _holds_or_unknown(self, token: str) -> bool:
        try:
            return await self._server_holds_this_payment(token)
        except StockgateError as e:
            log.warning("ledger has the payment for %s; server check deferred: %s", token, e)
            return False

    async def _commit_on_server(self, token: str) -> bool:
        if not self._plain_commit_only:
            try:
                return await self.client.commit(token, verified=True)
            except NoPerm:
                self._plain_commit_only = True
        return await self.client.commit(token)

    async def _server_holds_this_payment(self, token: str) -> bool:
        r = await self.client.reservation(token)
        if r is None:
            return False
        if await self._ledger.order_is_hold(token, r):
            return True
        log.error("paid order %s, but the server's hold for its token is another one: not committing it", token)
        if r.state == ReservationState.RESERVED:
            await self.client.release(token)
        return False

    async def cancel(self, token: str) -> bool:
        """See :meth:`Checkout.cancel`."""
        await self._ledger.cancel(token)
        return await self.client.release(token, "cancel")

    async def extend(self, token: str, ms: int) -> int:
        """See :meth:`Checkout.extend`."""
        at = await self.client.extend(token, ms)
        await self._ledger.extend(token, at)
        return at

    async def mark_refunded(self, token: str) -> str:
        return await self._ledger.mark_refunded(token)


