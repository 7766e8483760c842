"""The client's commands against the real server: each reply shape parsed into its typed
result (RESP2 and RESP3, decoded and bytes), each error reply into its exception with the
server's code, a lost reply sent again with the same request id, and the deadline."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import List, Optional

import pytest
import redis

import stockgate
from stockgate import (
    AsyncClient,
    Client,
    CommandError,
    Exists,
    Expired,
    Fenced,
    Limit,
    NoReservation,
    NoSale,
    Paused,
    ProtocolMismatch,
    Released,
    Replay,
    ReservationState,
    Reserved,
    RetryPolicy,
    SaleState,
    SoldOut,
    StockgateError,
    Unavailable,
)
from stockgate import _parse


# --- parsing, on the values redis-py hands over -------------------------------------------


def test_parse_reserve_shapes() -> None:
    assert _parse.parse_reserve(["RESERVED", "{S}tok", 17, 3]) == Reserved("{S}tok", 17, 3)
    assert _parse.parse_reserve([b"REPLAY", b"{S}tok", 17, 3]) == Replay("{S}tok", 17, 3)
    assert _parse.parse_reserve([b"SOLDOUT"]) == SoldOut()
    assert _parse.parse_reserve(["LIMIT", 2, 2, ["{S}a", "{S}b"]]) == Limit(("{S}a", "{S}b"), 2, 2)
    assert _parse.parse_reserve(["LIMIT", 2, 0, []]) == Limit((), 2, 0)
    for bad in [[], ["RESERVED", "t", 1], ["WHAT"], "RESERVED", None, ["SOLDOUT", 1]]:
        with pytest.raises(ProtocolMismatch):
            _parse.parse_reserve(bad)


def test_parse_maps_in_both_protocols() -> None:
    fields = {
        "token": "{S}t", "sku": "S", "user": "u", "request_id": "r", "qty": 2, "shard": 1,
        "state": "COMMITTED", "expires_at_ms": 20, "created_at_ms": 10,
    }
    flat: List[object] = [x for kv in fields.items() for x in kv]
    r2 = _parse.parse_reservation(flat)
    r3 = _parse.parse_reservation({k.encode(): v for k, v in fields.items()})
    assert r2 == r3 and r2 is not None and r2.state == ReservationState.COMMITTED and r2.qty == 2
    assert _parse.parse_reservation(None) is None
    with pytest.raises(ProtocolMismatch):
        _parse.parse_reservation(flat[:-2])
    with pytest.raises(ProtocolMismatch):
        _parse.parse_reservation({**fields, "state": "LOST"})


def test_error_codes_map_to_classes() -> None:
    e = stockgate.server_error("EXPIRED", "reservation expired at 1767225630000 ms; if the ledger ...")
    assert isinstance(e, Expired) and e.code == "EXPIRED" and e.expires_at_ms == 1767225630000
    assert isinstance(stockgate.server_error("RELEASED", "units"), Released)
    other = stockgate.server_error("NEWCODE", "something")
    assert type(other) is stockgate.ServerError and other.code == "NEWCODE"
    for cls in (NoSale, Fenced, Paused, NoReservation, Released, Expired, CommandError, Unavailable):
        assert issubclass(cls, StockgateError)
    refused = stockgate.ledger_error("SG001", "order {S}abc is COMMITTED: cancel refused")
    assert isinstance(refused, stockgate.OrderRefused)
    assert (refused.code, refused.status, refused.token) == ("SG001", "COMMITTED", "{S}abc")


# --- against the server -------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3])
def test_every_reply_shape_from_the_server(addr: str, keyring: stockgate.Keyring, sku: str, protocol: int) -> None:
    c = Client.connect(addr, protocol=protocol)
    c.sale_create(sku, 3, shards=1, ttl_ms=60_000, limit=2)
    c.sale_create(sku, 3, shards=1, ttl_ms=60_000, limit=2)  # the same parameters: fine
    with pytest.raises(Exists):
        c.sale_create(sku, 4)
    info = c.sale_info(sku)
    assert (info.total, info.available, info.reserved, info.committed) == (3, 3, 0, 0)
    assert (info.shards, info.ttl_ms, info.limit, info.state) == (1, 60_000, 2, SaleState.OPEN)
    assert len(info.key_fingerprint) == 16 and info.shard_available == (3,)

    a = c.reserve(sku, "alice", keyring.mint(sku, "alice"), "r1", qty=2)
    assert isinstance(a, Reserved)
    r = c.reservation(a.token)
    assert r is not None
    assert (r.token, r.sku, r.user, r.request_id, r.qty, r.state) == (a.token, sku, "alice", "r1", 2, ReservationState.RESERVED)
    assert r.expires_at_ms == a.expires_at_ms and r.created_at_ms <= r.expires_at_ms - 60_000 + 5
    lim = c.reserve(sku, "alice", keyring.mint(sku, "alice"), "r2")
    assert lim == Limit((a.token,), 2, 2)
    assert c.reserve(sku, "bob", keyring.mint(sku, "bob"), "r1", qty=2) == SoldOut()
    assert c.stock(sku) == 1
    b = c.reserve(sku, "bob", keyring.mint(sku, "bob"), "r2")
    assert isinstance(b, Reserved)

    later = c.extend(a.token, 120_000)
    assert later > a.expires_at_ms
    assert c.commit(a.token) is True
    assert c.commit(a.token) is False
    assert c.release(b.token, "cancel") is True
    assert c.release(b.token) is False
    with pytest.raises(Released):
        c.commit(b.token)
    with pytest.raises(NoReservation):
        c.extend(b.token, 1000)
    unknown = "{" + sku + "}" + "a" * 26
    assert c.reservation(unknown) is None
    with pytest.raises(NoReservation):
        c.commit(unknown)
    assert c.release(unknown) is False
    assert sku in c.sale_list()
    info = c.sale_info(sku)
    assert (info.available, info.reserved, info.committed) == (1, 0, 2)
    c.close()


def test_bytes_replies_from_a_redis_py_client_of_ones_own(addr: str, keyring: stockgate.Keyring, sku: str) -> None:
    host, port = addr.rsplit(":", 1)
    c = Client.from_redis(redis.Redis(host=host, port=int(port)))
    c.sale_create(sku, 2)
    out = c.reserve(sku, "u", keyring.mint(sku, "u"), "r")
    assert isinstance(out, Reserved) and isinstance(out.token, str)
    r = c.reservation(out.token)
    assert r is not None and r.user == "u" and r.state == ReservationState.RESERVED
    assert c.sale_info(sku).reserved == 1


def test_errors_carry_the_servers_code(client: Client, keyring: stockgate.Keyring, sku: str) -> None:
    with pytest.raises(NoSale) as e:
        client.reserve(sku, "u", keyring.mint(sku, "u"), "r")
    assert e.value.code == "NOSALE" and "no such sale" in e.value.detail
    client.sale_create(sku, 5, ttl_ms=1)
    with pytest.raises(CommandError) as ce:
        client.reserve(sku, "u", keyring.mint(sku, "u"), "r", qty=0)
    assert ce.value.code == "ERR" and "qty must be between 1 and 1000000" in str(ce.value)
    with pytest.raises(CommandError, match="invalid user"):
        client.reserve(sku, "bad user", keyring.mint(sku, "bad user"), "r")
    with pytest.raises(ValueError):
        client.release("{X}" + "a" * 26, "because")

    # A 1 ms TTL: the hold is past its deadline at once.
    out = client.reserve(sku, "u", keyring.mint(sku, "u"), "r")
    assert isinstance(out, Reserved)
    time.sleep(0.01)
    with pytest.raises(Expired) as ex:
        client.commit(out.token)
    assert ex.value.code == "EXPIRED" and ex.value.expires_at_ms == out.expires_at_ms
    with pytest.raises(Expired):
        client.extend(out.token, 1000)
    # The ledger accepted the payment in time: VERIFIED commits the late hold.
    assert client.commit(out.token, verified=True) is True

    client.redis.execute_command("SALE.PAUSE", sku)
    with pytest.raises(Paused) as p:
        client.reserve(sku, "v", keyring.mint(sku, "v"), "r")
    assert p.value.code == "PAUSED"
    # A retry of a request the server saw answers REPLAY even on a paused sale.
    assert isinstance(client.reserve(sku, "u", keyring.mint(sku, "u"), "r"), Replay)
    client.redis.execute_command("SALE.FENCE", sku)
    with pytest.raises(Fenced) as f:
        client.reserve(sku, "v", keyring.mint(sku, "v"), "r")
    assert f.value.code == "FENCED"
    assert client.sale_info(sku).state == SaleState.FENCED


class LoseReplies:
    """A TCP proxy in front of the real server that, when armed, forwards the next
    request containing ``needle`` and closes the client's connection instead of passing
    the server's reply back: a reply lost after the command ran."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed: Optional[bytes] = None
        self.lost = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, needle: bytes) -> None:
        with self.lock:
            self.armed = needle

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            drop = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, drop), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, drop), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, drop: threading.Event) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(src, dst)
                return
            with self.lock:
                if self.armed is not None and self.armed in data:
                    self.armed = None
                    drop.set()
            try:
                dst.sendall(data)
            except OSError:
                _close(src, dst)
                return

    def _down(self, src: socket.socket, dst: socket.socket, drop: threading.Event) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data or drop.is_set():
                if drop.is_set():
                    with self.lock:
                        self.lost += 1
                _close(src, dst)
                return
            try:
                dst.sendall(data)
            except OSError:
                _close(src, dst)
                return

    def close(self) -> None:
        # shutdown wakes the thread blocked in accept(); close alone would not.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def test_a_lost_reply_is_sent_again_with_the_same_request_id(
    addr: str, client: Client, keyring: stockgate.Keyring, sku: str
) -> None:
    client.sale_create(sku, 10, ttl_ms=60_000)
    proxy = LoseReplies(addr)
    c = Client.connect(f"127.0.0.1:{proxy.port}")
    try:
        proxy.arm(b"RESERVE")
        out = c.reserve(sku, "alice", keyring.mint(sku, "alice"), "order-1")
        # The first send took the unit; its reply was lost; the retry found it.
        assert proxy.lost == 1 and c.retries == 1
        assert isinstance(out, Replay), out
        assert client.sale_info(sku).reserved == 1, "the retry took nothing more"
        r = client.reservation(out.token)
        assert r is not None and r.request_id == "order-1"

        proxy.arm(b"COMMIT")
        assert c.commit(out.token) is False  # the lost first send committed it
        assert proxy.lost == 2 and c.retries == 2
        assert client.sale_info(sku).committed == 1
    finally:
        c.close()
        proxy.close()


def test_async_lost_reply_and_deadline(addr: str, keyring: stockgate.Keyring, sku: str) -> None:
    async def run() -> None:
        proxy = LoseReplies(addr)
        a = AsyncClient.connect(f"127.0.0.1:{proxy.port}")
        try:
            await a.sale_create(sku, 5)
            proxy.arm(b"RESERVE")
            out = await a.reserve(sku, "bob", keyring.mint(sku, "bob"), "order-1")
            assert isinstance(out, Replay) and a.retries == 1 and proxy.lost == 1
            assert (await a.sale_info(sku)).reserved == 1
        finally:
            await a.close()
            proxy.close()
        # Nothing listens there: the call fails once its deadline is spent.
        dead = AsyncClient.connect(f"127.0.0.1:{free_port()}", retry=RetryPolicy(deadline=0.5))
        t = time.monotonic()
        with pytest.raises(Unavailable) as e:
            await dead.stock(sku)
        assert e.value.code == "UNAVAILABLE" and 0.1 < time.monotonic() - t <= 0.5 + 0.5
        assert dead.retries >= 1
        await dead.close()

    asyncio.run(run())


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    s = socket.create_server(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_unavailable_after_the_deadline() -> None:
    c = Client.connect(f"127.0.0.1:{free_port()}", retry=RetryPolicy(deadline=0.5))
    t = time.monotonic()
    with pytest.raises(Unavailable) as e:
        c.reserve("S", "u", "tok", "r")
    assert e.value.code == "UNAVAILABLE" and isinstance(e.value.last, redis.ConnectionError)
    assert 0.1 < time.monotonic() - t <= 0.5 + 0.5 and c.retries >= 1
