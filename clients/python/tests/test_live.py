"""Live counts over RESP (docs/protocol.md, section 4a, "Live counts over RESP"): the
payload parsed into :class:`LiveCounts` (with the buyer's place), and, against the real
server in RESP2 and RESP3, with the sync and the asyncio clients: the counts at once, a
RESERVE and a ROOM.JOIN showing up, a buyer's place moving up when the buyer ahead
leaves, and refused subscriptions raising the package's typed errors."""

from __future__ import annotations

import asyncio
import json
from typing import Callable, List, Optional

import pytest

import stockgate
from stockgate import (
    AsyncClient,
    BadTicket,
    Client,
    LiveCounts,
    LiveWatch,
    NoRoom,
    NoSale,
    PlaceAdmitted,
    ProtocolMismatch,
    Reserved,
    RoomBeforeOpen,
    RoomExpired,
    RoomGone,
    RoomLeft,
    RoomReserved,
    RoomSoldOut,
    RoomWaiting,
)
from stockgate import _parse

COUNTS = {"sku": "S1", "available": 940, "held": 12, "sold": 48, "waiting": 1500, "admitted": 30, "room": True, "state": "OPEN"}


# --- parsing --------------------------------------------------------------------------------


def test_parse_live_counts_and_places() -> None:
    want = LiveCounts("S1", 940, 12, 48, 1500, 30, True, "OPEN")
    assert _parse.parse_live(json.dumps(COUNTS)) == want
    assert _parse.parse_live(json.dumps(COUNTS).encode()) == want
    assert not want.gone and _parse.parse_live(json.dumps({**COUNTS, "state": "GONE"})).gone
    places = [
        ({"status": "WAITING", "position": 3, "eta_ms": 1200}, RoomWaiting(3, 1200)),
        ({"status": "ADMITTED", "until_ms": 17}, PlaceAdmitted(17)),
        ({"status": "BEFORE-OPEN", "opens_at_ms": 99}, RoomBeforeOpen(99)),
        ({"status": "RESERVED"}, RoomReserved()),
        ({"status": "SOLDOUT"}, RoomSoldOut()),
        ({"status": "EXPIRED"}, RoomExpired()),
        ({"status": "LEFT"}, RoomLeft()),
        ({"status": "GONE"}, RoomGone()),
    ]
    for you, place in places:
        assert _parse.parse_live(json.dumps({**COUNTS, "you": you})).you == place
    bad: List[object] = [
        "not json",
        "[1]",
        json.dumps({k: v for k, v in COUNTS.items() if k != "held"}),
        json.dumps({**COUNTS, "held": "12"}),
        json.dumps({**COUNTS, "held": True}),
        json.dumps({**COUNTS, "room": 1}),
        json.dumps({**COUNTS, "you": {"status": "WAITING", "position": 1}}),
        json.dumps({**COUNTS, "you": {"status": "LOST"}}),
        json.dumps({**COUNTS, "you": "WAITING"}),
        None,
    ]
    for b in bad:
        with pytest.raises(ProtocolMismatch):
            _parse.parse_live(b)


# --- against the server ---------------------------------------------------------------------


def until_counts(w: LiveWatch, what: str, ok: Callable[[LiveCounts], bool], seconds: float = 5.0) -> LiveCounts:
    """Reads the watch until a message for which ``ok`` holds."""
    seen: List[LiveCounts] = []
    while True:
        c = w.next(timeout=seconds)
        if c is None:
            raise AssertionError(f"{what}: not within {seconds} s; saw {seen!r}")
        seen.append(c)
        if ok(c):
            return c


def position(c: LiveCounts) -> Optional[int]:
    return c.you.position if isinstance(c.you, RoomWaiting) else None


@pytest.mark.parametrize("protocol", [2, 3])
def test_watch_sale_counts_at_once_then_a_reserve(addr: str, sku: str, keyring: stockgate.Keyring, protocol: int) -> None:
    with Client.connect(addr, protocol=protocol) as c:
        c.sale_create(sku, 5, shards=1, ttl_ms=60_000)
        with c.watch_sale(sku) as w:
            first = w.next(timeout=2.0)
            assert first == LiveCounts(sku, 5, 0, 0, 0, 0, False, "OPEN"), first
            hold = c.reserve(sku, "alice", keyring.mint(sku, "alice"), "order-1", qty=2)
            assert isinstance(hold, Reserved), hold
            after = until_counts(w, "the reserve", lambda x: x.held == 2)
            assert (after.available, after.sold, after.you) == (3, 0, None)
            assert c.commit(hold.token) is True
            sold = until_counts(w, "the commit", lambda x: x.sold == 2)
            assert (sold.available, sold.held) == (3, 0)
        with pytest.raises(StopIteration):
            next(w)


@pytest.mark.parametrize("protocol", [2, 3])
def test_watch_place_moves_up_when_the_buyer_ahead_leaves(addr: str, sku: str, protocol: int) -> None:
    with Client.connect(addr, protocol=protocol) as c:
        c.sale_create(sku, 1, shards=1, ttl_ms=60_000)
        c.open_room(sku, rate=1000, window_ms=0)
        with c.watch_sale(sku) as sale:
            first = next(sale)
            assert (first.room, first.waiting, first.admitted, first.available) == (True, 0, 0, 1), first
            a = c.join(sku, "a")
            until_counts(sale, "a's join", lambda x: x.admitted == 1)
            b = c.join(sku, "b")
            t = c.join(sku, "c")
            assert (a.position, b.position, t.position) == (0, 1, 2)
            until_counts(sale, "b and c waiting", lambda x: x.waiting == 2)
        with c.watch_place(t.ticket) as place:
            now = place.next(timeout=2.0)
            assert now is not None and now.sku == sku and now.you == RoomWaiting(2, now.you.eta_ms), now  # type: ignore[union-attr]
            assert c.leave(sku, "a") is True
            moved = until_counts(place, "c moved up", lambda x: position(x) == 1)
            assert moved.waiting == 1 and moved.admitted == 1
            assert c.leave(sku, "c") is True
            assert until_counts(place, "c left", lambda x: x.you == RoomLeft()).waiting == 0


@pytest.mark.parametrize("protocol", [2, 3])
def test_refused_watches_raise_typed_errors(addr: str, sku: str, protocol: int) -> None:
    with Client.connect(addr, protocol=protocol) as c:
        with pytest.raises(NoSale):
            c.watch_sale(f"{sku}-NONE")
        c.sale_create(sku, 3, shards=1)
        with pytest.raises(NoRoom):
            c.watch_place(f"t1|k|{sku}|u|0|sig")
        c.open_room(sku, rate=1000)
        real = c.join(sku, "u")
        parts = real.ticket.split("|")
        parts[3] = "mallory"
        for forged in ("|".join(parts), "t1|nope", "garbage"):
            with pytest.raises(BadTicket) as e:
                c.watch_place(forged)
            assert e.value.code == "BADTICKET" and e.value.detail.startswith("ticket refused"), e.value
        # The client's own commands still work beside the refused watches.
        with c.watch_place(real.ticket) as w:
            got = w.next(timeout=2.0)
            assert got is not None and isinstance(got.you, PlaceAdmitted), got


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_asyncio_client_watches(addr: str, sku: str, protocol: int) -> None:
    async def run() -> None:
        a = AsyncClient.connect(addr, protocol=protocol)
        try:
            with pytest.raises(NoSale):
                async with a.watch_sale(f"{sku}-NONE"):
                    pass
            await a.sale_create(sku, 1, shards=1, ttl_ms=60_000)
            await a.open_room(sku, rate=1000, window_ms=0)
            async with a.watch_sale(sku) as w:
                first = await w.next(timeout=2.0)
                assert first == LiveCounts(sku, 1, 0, 0, 0, 0, True, "OPEN"), first
                await a.join(sku, "a")
                async for counts in w:
                    if counts.admitted == 1:
                        break
            await a.join(sku, "b")
            t = await a.join(sku, "c")
            place = a.watch_place(t.ticket)
            try:
                now = await place.next(timeout=2.0)
                assert now is not None and position(now) == 2, now
                assert await a.leave(sku, "a") is True
                for _ in range(50):
                    got = await place.next(timeout=5.0)
                    assert got is not None, "no message after the leave"
                    if position(got) == 1:
                        break
                else:
                    raise AssertionError("c never moved up")
            finally:
                await place.close()
            with pytest.raises(BadTicket):
                await a.watch_place("t1|nope").open()
        finally:
            await a.close()

    asyncio.run(run())
