"""Reply parsing: redis-py values (RESP2 lists or RESP3 maps, bytes or decoded strings)
into the typed results of :mod:`stockgate.results`. Anything of another shape is a
:class:`ProtocolMismatch`, never a guess."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from .errors import StockgateError
from .results import (
    DENIED_REASONS,
    Denied,
    Limit,
    LiveCounts,
    PlaceAdmitted,
    PlaceStatus,
    Replay,
    Reservation,
    ReservationState,
    Reserved,
    ReserveOutcome,
    RoomAdmitted,
    RoomBeforeOpen,
    RoomExpired,
    RoomGone,
    RoomInfo,
    RoomLeft,
    RoomReserved,
    RoomSoldOut,
    RoomStatus,
    RoomTicket,
    RoomWaiting,
    SaleInfo,
    SaleState,
    SoldOut,
)

__all__ = [
    "ProtocolMismatch",
    "text",
    "parse_reserve",
    "parse_reservation",
    "parse_sale_info",
    "parse_int",
    "parse_denied",
    "parse_room_join",
    "parse_room_status",
    "parse_room_info",
    "parse_live",
]


class ProtocolMismatch(StockgateError):
    """A reply whose shape docs/protocol.md does not describe (another server, or a
    client setting that changes replies)."""

    code = "PROTOCOL"


def text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, str):
        return v
    raise ProtocolMismatch(f"expected a string, got {v!r}")


def parse_int(v: Any) -> int:
    if isinstance(v, bool):
        raise ProtocolMismatch(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, (bytes, str)):
        try:
            return int(v)
        except ValueError:
            pass
    raise ProtocolMismatch(f"expected an integer, got {v!r}")


def parse_denied(message: str) -> Denied:
    """``-DENIED <text>`` (the text after the code)."""
    t = message.strip()
    return Denied(DENIED_REASONS.get(t, t), t)


def parse_reserve(v: Any) -> ReserveOutcome:
    """RESERVE's array replies (sent with WITHLIMIT)."""
    if not isinstance(v, (list, tuple)) or not v:
        raise ProtocolMismatch(f"unexpected RESERVE reply {v!r}")
    word = text(v[0])
    if word in ("RESERVED", "REPLAY") and len(v) == 4:
        token, exp, shard = text(v[1]), parse_int(v[2]), parse_int(v[3])
        return Reserved(token, exp, shard) if word == "RESERVED" else Replay(token, exp, shard)
    if word == "SOLDOUT" and len(v) == 1:
        return SoldOut()
    if word == "LIMIT":
        if len(v) == 4 and isinstance(v[3], (list, tuple)):
            return Limit(tuple(text(t) for t in v[3]), parse_int(v[1]), parse_int(v[2]))
        # Without WITHLIMIT: [LIMIT, token...]; the figures are unknown.
        if all(isinstance(t, (bytes, str)) for t in v[1:]):
            return Limit(tuple(text(t) for t in v[1:]), -1, -1)
    raise ProtocolMismatch(f"unexpected RESERVE reply {v!r}")


def _as_map(v: Any, what: str) -> Dict[str, Any]:
    if isinstance(v, dict):
        return {text(k): val for k, val in v.items()}
    if isinstance(v, (list, tuple)) and len(v) % 2 == 0:
        return {text(v[i]): v[i + 1] for i in range(0, len(v), 2)}
    raise ProtocolMismatch(f"unexpected {what} reply {v!r}")


def _field(m: Dict[str, Any], name: str, what: str) -> Any:
    if name not in m:
        raise ProtocolMismatch(f"{what} reply without `{name}`: {m!r}")
    return m[name]


def parse_reservation(v: Any) -> Optional[Reservation]:
    """The RESERVATION map, or None for nil (unknown or purged)."""
    if v is None:
        return None
    m = _as_map(v, "RESERVATION")
    f = lambda n: _field(m, n, "RESERVATION")  # noqa: E731
    state = text(f("state"))
    try:
        st = ReservationState(state)
    except ValueError:
        raise ProtocolMismatch(f"unknown reservation state {state!r}") from None
    return Reservation(
        token=text(f("token")),
        sku=text(f("sku")),
        user=text(f("user")),
        request_id=text(f("request_id")),
        qty=parse_int(f("qty")),
        shard=parse_int(f("shard")),
        state=st,
        expires_at_ms=parse_int(f("expires_at_ms")),
        created_at_ms=parse_int(f("created_at_ms")),
    )


def parse_sale_info(v: Any) -> SaleInfo:
    m = _as_map(v, "SALE.INFO")
    f = lambda n: _field(m, n, "SALE.INFO")  # noqa: E731
    state = text(f("state"))
    try:
        st = SaleState(state)
    except ValueError:
        raise ProtocolMismatch(f"unknown sale state {state!r}") from None
    per_shard: List[int] = []
    raw = m.get("shard_available")
    if isinstance(raw, (list, tuple)):
        per_shard = [parse_int(x) for x in raw]
    return SaleInfo(
        total=parse_int(f("total")),
        available=parse_int(f("available")),
        reserved=parse_int(f("reserved")),
        committed=parse_int(f("committed")),
        shards=parse_int(f("shards")),
        ttl_ms=parse_int(f("ttl_ms")),
        limit=parse_int(f("limit")),
        state=st,
        key_fingerprint=text(f("key_fingerprint")),
        shard_available=tuple(per_shard),
    )


def parse_room_join(v: Any) -> RoomTicket:
    """``ROOM.JOIN``'s ``[ticket, position, eta_ms]``."""
    if not isinstance(v, (list, tuple)) or len(v) != 3:
        raise ProtocolMismatch(f"unexpected ROOM.JOIN reply {v!r}")
    return RoomTicket(text(v[0]), parse_int(v[1]), parse_int(v[2]))


_ROOM_WORDS_ALONE = {
    "RESERVED": RoomReserved,
    "SOLDOUT": RoomSoldOut,
    "EXPIRED": RoomExpired,
    "LEFT": RoomLeft,
}


def parse_room_status(v: Any) -> RoomStatus:
    """``ROOM.STATUS``: a word, then its values."""
    if not isinstance(v, (list, tuple)) or not v:
        raise ProtocolMismatch(f"unexpected ROOM.STATUS reply {v!r}")
    word = text(v[0])
    if word == "WAITING" and len(v) == 3:
        return RoomWaiting(parse_int(v[1]), parse_int(v[2]))
    if word == "ADMITTED" and len(v) == 3:
        return RoomAdmitted(text(v[1]), parse_int(v[2]))
    if word == "BEFORE-OPEN" and len(v) == 2:
        return RoomBeforeOpen(parse_int(v[1]))
    alone = _ROOM_WORDS_ALONE.get(word)
    if alone is not None and len(v) == 1:
        return alone()
    raise ProtocolMismatch(f"unexpected ROOM.STATUS reply {v!r}")


def _flag(v: Any, what: str) -> bool:
    n = parse_int(v)
    if n not in (0, 1):
        raise ProtocolMismatch(f"{what}: expected 0 or 1, got {v!r}")
    return n == 1


def parse_room_info(v: Any) -> RoomInfo:
    m = _as_map(v, "ROOM.INFO")
    f = lambda n: _field(m, n, "ROOM.INFO")  # noqa: E731
    return RoomInfo(
        opens_at_ms=parse_int(f("opens_at_ms")),
        rate=parse_int(f("rate")),
        overadmit_permille=parse_int(f("overadmit_permille")),
        admit_ttl_ms=parse_int(f("admit_ttl_ms")),
        window_ms=parse_int(f("window_ms")),
        max_waiting=parse_int(f("max_waiting")),
        waiting=parse_int(f("waiting")),
        admitted=parse_int(f("admitted")),
        open=_flag(f("open"), "ROOM.INFO open"),
        sold_out=_flag(f("sold_out"), "ROOM.INFO sold_out"),
    )


def _json_int(m: Dict[str, Any], name: str, what: str) -> int:
    v = _field(m, name, what)
    # JSON's true/false are Python bools, which are ints: refused as counts.
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolMismatch(f"{what}: `{name}` is not an integer: {v!r}")
    return v


def _json_str(m: Dict[str, Any], name: str, what: str) -> str:
    v = _field(m, name, what)
    if not isinstance(v, str):
        raise ProtocolMismatch(f"{what}: `{name}` is not a string: {v!r}")
    return v


_PLACE_WORDS_ALONE = {
    "RESERVED": RoomReserved,
    "SOLDOUT": RoomSoldOut,
    "EXPIRED": RoomExpired,
    "LEFT": RoomLeft,
    "GONE": RoomGone,
}


def parse_place(v: Any) -> PlaceStatus:
    """A buyer channel's ``"you"``: ``{"status": WORD, ...}``."""
    what = "live place"
    if not isinstance(v, dict):
        raise ProtocolMismatch(f"{what}: expected an object, got {v!r}")
    word = _json_str(v, "status", what)
    if word == "WAITING":
        return RoomWaiting(_json_int(v, "position", what), _json_int(v, "eta_ms", what))
    if word == "ADMITTED":
        return PlaceAdmitted(_json_int(v, "until_ms", what))
    if word == "BEFORE-OPEN":
        return RoomBeforeOpen(_json_int(v, "opens_at_ms", what))
    alone = _PLACE_WORDS_ALONE.get(word)
    if alone is not None:
        return alone()
    raise ProtocolMismatch(f"{what}: unknown status {word!r}")


def parse_live(payload: Any) -> LiveCounts:
    """One live channel message's payload (the JSON, as bytes or text)."""
    what = "live counts"
    try:
        m = json.loads(text(payload))
    except ValueError:
        raise ProtocolMismatch(f"{what}: not JSON: {payload!r}") from None
    if not isinstance(m, dict):
        raise ProtocolMismatch(f"{what}: expected an object, got {m!r}")
    room = _field(m, "room", what)
    if not isinstance(room, bool):
        raise ProtocolMismatch(f"{what}: `room` is not a boolean: {room!r}")
    you = m.get("you")
    return LiveCounts(
        sku=_json_str(m, "sku", what),
        available=_json_int(m, "available", what),
        held=_json_int(m, "held", what),
        sold=_json_int(m, "sold", what),
        waiting=_json_int(m, "waiting", what),
        admitted=_json_int(m, "admitted", what),
        room=room,
        state=_json_str(m, "state", what),
        you=None if you is None else parse_place(you),
    )
