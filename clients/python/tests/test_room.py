"""The waiting room (docs/protocol.md, section 4a): each ROOM.* reply parsed into its
typed result (RESP2 and RESP3, decoded and bytes), each room error reply into its
exception, and, against the real server, a room opened, joined, an admitted buyer's
token reserving through ``reserve``, with the sync and the asyncio clients."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, List, TypeVar

import pytest
from redis._parsers.base import BaseParser

import stockgate
from stockgate import (
    AsyncClient,
    BadTicket,
    Client,
    Exists,
    NoRoom,
    NotQueued,
    ProtocolMismatch,
    QueueFull,
    Reserved,
    RoomAdmitted,
    RoomBeforeOpen,
    RoomExpired,
    RoomInfo,
    RoomLeft,
    RoomReserved,
    RoomSoldOut,
    RoomStatus,
    RoomTicket,
    RoomWaiting,
    SoldOutError,
    TooManyJoins,
)
from stockgate import _core, _parse

T = TypeVar("T")


# --- parsing, on the values redis-py hands over -------------------------------------------


def test_parse_room_join_and_status() -> None:
    assert _parse.parse_room_join(["t1|k|S|u|1|sig", 3, 1500]) == RoomTicket("t1|k|S|u|1|sig", 3, 1500)
    assert _parse.parse_room_join([b"t1|k|S|u|1|sig", b"0", 0]) == RoomTicket("t1|k|S|u|1|sig", 0, 0)
    cases: List[tuple] = [
        (["WAITING", 4, 2000], RoomWaiting(4, 2000)),
        ([b"ADMITTED", b"tok.sig", 17], RoomAdmitted("tok.sig", 17)),
        (["BEFORE-OPEN", 1767225630000], RoomBeforeOpen(1767225630000)),
        ([b"RESERVED"], RoomReserved()),
        (["SOLDOUT"], RoomSoldOut()),
        (["EXPIRED"], RoomExpired()),
        ([b"LEFT"], RoomLeft()),
    ]
    for reply, want in cases:
        assert _parse.parse_room_status(reply) == want
    bad: List[object] = [[], ["WAITING", 1], ["ADMITTED", "t"], ["LEFT", 1], ["GONE"], "WAITING", None]
    for b in bad:
        with pytest.raises(ProtocolMismatch):
            _parse.parse_room_status(b)
    for b in [["t", 1], "t", None, ["t", "x", 1]]:
        with pytest.raises(ProtocolMismatch):
            _parse.parse_room_join(b)


def test_parse_room_info_in_both_protocols() -> None:
    fields = {
        "opens_at_ms": 0, "rate": 100, "overadmit_permille": 1000, "admit_ttl_ms": 120_000,
        "window_ms": 10_000, "max_waiting": 1_000_000, "waiting": 7, "admitted": 2, "open": 1,
        "sold_out": 0,
    }
    flat: List[object] = [x for kv in fields.items() for x in kv]
    r2 = _parse.parse_room_info(flat)
    r3 = _parse.parse_room_info({k.encode(): v for k, v in fields.items()})
    assert r2 == r3 == RoomInfo(0, 100, 1000, 120_000, 10_000, 1_000_000, 7, 2, True, False)
    with pytest.raises(ProtocolMismatch):
        _parse.parse_room_info(flat[:-2])
    with pytest.raises(ProtocolMismatch):
        _parse.parse_room_info({**fields, "open": 2})


ROOM_ERRORS = [
    ("QUEUEFULL queue full: 45 buyers are already waiting for this sale", QueueFull),
    ("SOLDOUT sold out", SoldOutError),
    ("TOOMANYJOINS too many joins: at most 4 places per user per sale", TooManyJoins),
    ("NOROOM no waiting room for this sale", NoRoom),
    ("BADTICKET ticket refused: bad signature", BadTicket),
    ("BADTICKET stale ticket: replaced by a later join", BadTicket),
    ("NOTQUEUED not in the queue", NotQueued),
]


@pytest.mark.parametrize("line,cls", ROOM_ERRORS, ids=[c[0].split(":")[0].replace(" ", "-") for c in ROOM_ERRORS])
def test_room_error_replies_are_typed(line: str, cls: type) -> None:
    err = _core.translate(BaseParser.parse_error(line))
    assert type(err) is cls, (line, err)
    code, _, detail = line.partition(" ")
    assert err.code == code and err.detail == detail and str(err) == line
    assert isinstance(err, stockgate.ServerError)


def test_room_error_details() -> None:
    full = stockgate.server_error("QUEUEFULL", "queue full: 45 buyers are already waiting for this sale")
    assert isinstance(full, QueueFull) and full.max_waiting == 45
    stale = stockgate.server_error("BADTICKET", "stale ticket: replaced by a later join")
    forged = stockgate.server_error("BADTICKET", "ticket refused: ticket of another user")
    assert isinstance(stale, BadTicket) and stale.stale and isinstance(forged, BadTicket) and not forged.stale


# --- against the server -------------------------------------------------------------------


def until(what: str, f: Callable[[], T], ok: Callable[[T], bool], seconds: float = 5.0) -> T:
    """Polls ``f`` until ``ok`` holds for its value (the room moves on a 20 ms tick)."""
    end = time.monotonic() + seconds
    while True:
        v = f()
        if ok(v):
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: still {v!r} after {seconds} s")
        time.sleep(0.02)


def admitted(s: RoomStatus) -> RoomAdmitted:
    assert isinstance(s, RoomAdmitted), s
    return s


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_room_queues_admits_and_its_token_reserves(addr: str, sku: str, protocol: int) -> None:
    c = Client.connect(addr, protocol=protocol)
    c.sale_create(sku, 2, shards=1, ttl_ms=60_000)
    with pytest.raises(NoRoom):
        c.join(sku, "alice")
    with pytest.raises(NoRoom):
        c.room_info(sku)
    c.open_room(sku, rate=1000, admit_ttl_ms=60_000, max_waiting=2)
    c.open_room(sku, rate=1000, admit_ttl_ms=60_000, max_waiting=2)  # the same settings: fine
    with pytest.raises(Exists):
        c.open_room(sku, max_waiting=3)
    info = c.room_info(sku)
    assert (info.rate, info.admit_ttl_ms, info.max_waiting, info.overadmit_permille) == (1000, 60_000, 2, 1000)
    assert (info.opens_at_ms, info.waiting, info.admitted, info.sold_out) == (0, 0, 0, False)

    # Two units: the first two are admitted as they join, the next two wait, the fifth
    # finds the line full.
    tickets = {u: c.join(sku, u) for u in ("alice", "bob", "carol", "dave")}
    assert [t.position for t in tickets.values()] == [0, 0, 1, 2]
    assert all(t.ticket.startswith("t1|") for t in tickets.values())
    assert c.join(sku, "alice") == tickets["alice"], "a repeated join answers the same place"
    with pytest.raises(QueueFull) as full:
        c.join(sku, "eve")
    assert full.value.code == "QUEUEFULL" and full.value.max_waiting == 2
    info = c.room_info(sku)
    assert (info.waiting, info.admitted, info.open) == (2, 2, True)

    carol = c.status(sku, "carol", tickets["carol"].ticket)
    assert isinstance(carol, RoomWaiting) and carol.position == 1 and carol.eta_ms >= 0

    # Tickets of another user, altered or garbage are refused, typed.
    with pytest.raises(BadTicket) as bad:
        c.status(sku, "bob", tickets["alice"].ticket)
    assert bad.value.code == "BADTICKET" and not bad.value.stale
    parts = tickets["bob"].ticket.split("|")
    parts[3] = "carol"
    with pytest.raises(BadTicket):
        c.status(sku, "carol", "|".join(parts))
    with pytest.raises(BadTicket):
        c.status(sku, "bob", "t1|nope")

    # The admitted buyer's token passes RESERVE, through the package's reserve.
    a = admitted(c.status(sku, "alice", tickets["alice"].ticket))
    assert a.until_ms > stockgate.now_ms() + 50_000
    hold = c.reserve(sku, "alice", a.admission, "order-1")
    assert isinstance(hold, Reserved), hold
    assert c.status(sku, "alice", tickets["alice"].ticket) == RoomReserved()

    # A buyer leaves: the line moves up; a repeated leave changes nothing.
    assert c.leave(sku, "carol") is True
    assert c.leave(sku, "carol") is False
    assert c.status(sku, "carol", tickets["carol"].ticket) == RoomLeft()
    dave = c.status(sku, "dave", tickets["dave"].ticket)
    assert isinstance(dave, RoomWaiting) and dave.position == 1

    # The hold released: its unit admits the head of the line.
    assert c.release(hold.token) is True
    d = until("dave admitted", lambda: c.status(sku, "dave", tickets["dave"].ticket), lambda s: isinstance(s, RoomAdmitted))
    assert isinstance(c.reserve(sku, "dave", admitted(d).admission, "order-1"), Reserved)
    c.close()


def test_rejoins_stale_tickets_and_too_many_joins(client: Client, sku: str) -> None:
    client.sale_create(sku, 100, shards=1)
    client.open_room(sku, rate=1000)
    first = client.join(sku, "zoe")
    assert client.leave(sku, "zoe") is True
    second = client.join(sku, "zoe")
    assert second.ticket != first.ticket
    with pytest.raises(BadTicket) as stale:
        client.status(sku, "zoe", first.ticket)
    assert stale.value.stale
    assert isinstance(client.status(sku, "zoe", second.ticket), RoomAdmitted)
    for _ in range(2):
        assert client.leave(sku, "zoe") is True
        client.join(sku, "zoe")
    assert client.leave(sku, "zoe") is True
    with pytest.raises(TooManyJoins) as e:
        client.join(sku, "zoe")
    assert e.value.code == "TOOMANYJOINS"


def test_before_open_expired_and_sold_out(client: Client, sku: str) -> None:
    # Before OPENS-AT: pre-queued.
    later = f"{sku}-LATER"
    client.sale_create(later, 5, shards=1)
    opens = stockgate.now_ms() + 3_600_000
    client.open_room(later, opens_at_ms=opens)
    t = client.join(later, "ann")
    assert t.position == 0
    assert client.status(later, "ann", t.ticket) == RoomBeforeOpen(opens)
    assert client.room_info(later).open is False

    # An admission not used within ADMIT-TTL expires.
    client.sale_create(sku, 1, shards=1, ttl_ms=60_000)
    client.open_room(sku, rate=1000, admit_ttl_ms=100)
    ann = client.join(sku, "ann")
    assert isinstance(client.status(sku, "ann", ann.ticket), RoomAdmitted)
    until("ann's admission expired", lambda: client.status(sku, "ann", ann.ticket), lambda s: s == RoomExpired())

    # Everything sold, nothing held: waiting buyers are told SOLDOUT, new joins refused.
    ben = client.join(sku, "ben")
    b = until("ben admitted", lambda: client.status(sku, "ben", ben.ticket), lambda s: isinstance(s, RoomAdmitted))
    cal = client.join(sku, "cal")
    assert isinstance(client.status(sku, "cal", cal.ticket), RoomWaiting)
    hold = client.reserve(sku, "ben", admitted(b).admission, "order-1")
    assert isinstance(hold, Reserved) and client.commit(hold.token) is True
    until("cal told sold out", lambda: client.status(sku, "cal", cal.ticket), lambda s: s == RoomSoldOut())
    with pytest.raises(SoldOutError) as e:
        client.join(sku, "dan")
    assert e.value.code == "SOLDOUT"
    assert client.room_info(sku).sold_out is True


def test_the_asyncio_client_in_the_room(addr: str, sku: str) -> None:
    async def run() -> None:
        a = AsyncClient.connect(addr)
        try:
            await a.sale_create(sku, 1, shards=1, ttl_ms=60_000)
            with pytest.raises(NoRoom):
                await a.join(sku, "amy")
            await a.open_room(sku, rate=1000, max_waiting=1)
            amy = await a.join(sku, "amy")
            bo = await a.join(sku, "bo")
            assert (amy.position, bo.position) == (0, 1)
            with pytest.raises(QueueFull):
                await a.join(sku, "cy")
            with pytest.raises(BadTicket):
                await a.status(sku, "bo", amy.ticket)
            s = await a.status(sku, "amy", amy.ticket)
            assert isinstance(s, RoomAdmitted), s
            hold = await a.reserve(sku, "amy", s.admission, "order-1")
            assert isinstance(hold, Reserved), hold
            assert await a.status(sku, "amy", amy.ticket) == RoomReserved()
            info = await a.room_info(sku)
            assert (info.waiting, info.admitted) == (1, 0)
            assert await a.leave(sku, "bo") is True
            assert await a.status(sku, "bo", bo.ticket) == RoomLeft()
        finally:
            await a.close()

    asyncio.run(run())
