"""Typed results, one class per reply shape of docs/protocol.md."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

__all__ = [
    "ReservationState",
    "SaleState",
    "OrderStatus",
    "Reserved",
    "Replay",
    "SoldOut",
    "Limit",
    "Denied",
    "ReserveOutcome",
    "Reservation",
    "SaleInfo",
    "Hold",
    "Committed",
    "AlreadyCommitted",
    "Refused",
    "RefundRequired",
    "OverLimit",
    "PayOutcome",
    "DENIED_REASONS",
    "RoomTicket",
    "RoomWaiting",
    "RoomAdmitted",
    "RoomBeforeOpen",
    "RoomReserved",
    "RoomSoldOut",
    "RoomExpired",
    "RoomLeft",
    "RoomStatus",
    "RoomInfo",
    "PlaceAdmitted",
    "RoomGone",
    "PlaceStatus",
    "LiveCounts",
]


class ReservationState(str, enum.Enum):
    RESERVED = "RESERVED"
    COMMITTED = "COMMITTED"
    RELEASED = "RELEASED"


class SaleState(str, enum.Enum):
    OPEN = "OPEN"
    PAUSED = "PAUSED"
    FENCED = "FENCED"
    #: Frozen while it moves to another group: writes answer ``-TRYAGAIN`` until the
    #: move ends (the client retries them within its deadline).
    MOVING = "MOVING"


class OrderStatus(str, enum.Enum):
    """An order's status in the ledger (``orders.status``)."""

    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    CANCELLED = "CANCELLED"
    CANCELLED_BY_SWEEPER = "CANCELLED_BY_SWEEPER"
    REFUND_REQUIRED = "REFUND_REQUIRED"
    REFUNDED = "REFUNDED"


@dataclass(frozen=True)
class Reserved:
    """``[RESERVED, token, expires_at_ms, shard]``: a new hold; ``qty`` units taken."""

    token: str
    expires_at_ms: int
    shard: int


@dataclass(frozen=True)
class Replay:
    """``[REPLAY, token, expires_at_ms, shard]``: this (sku, user, request id) was seen
    before; nothing taken. Also what a retry after a lost reply gets when the first send
    took effect."""

    token: str
    expires_at_ms: int
    shard: int


@dataclass(frozen=True)
class SoldOut:
    """``[SOLDOUT]``: no shard probed had the units. Not remembered: a retry with the same
    request id may succeed (other shards are probed)."""


@dataclass(frozen=True)
class Limit:
    """``[LIMIT, limit, held, [token...]]`` (RESERVE ... WITHLIMIT): the per-user limit is
    reached. ``live_tokens`` are the user's holds still RESERVED, to resume or cancel one;
    ``held`` counts units RESERVED or COMMITTED."""

    live_tokens: Tuple[str, ...]
    limit: int
    held: int


#: Wire text after ``-DENIED`` → the reason's name in INFO and Prometheus.
DENIED_REASONS = {
    "malformed admission token": "malformed",
    "unknown key id": "unknown_key",
    "bad signature": "bad_signature",
    "token bound to another sku": "wrong_sku",
    "token bound to another user": "wrong_user",
    "expired": "expired",
}


@dataclass(frozen=True)
class Denied:
    """``-DENIED <text>``: the admission token was refused. ``reason`` is one of
    ``malformed unknown_key bad_signature wrong_sku wrong_user expired`` (``text`` when the
    server says something this package does not know). ``expired`` means: get a new token
    from the waiting room; the others mean the keys disagree or the token is forged."""

    reason: str
    text: str = ""


ReserveOutcome = Union[Reserved, Replay, SoldOut, Limit, Denied]


@dataclass(frozen=True)
class Reservation:
    """The ``RESERVATION token`` map."""

    token: str
    sku: str
    user: str
    request_id: str
    qty: int
    shard: int
    state: ReservationState
    expires_at_ms: int
    created_at_ms: int


@dataclass(frozen=True)
class SaleInfo:
    """The ``SALE.INFO sku`` map. ``available + reserved + committed == total``."""

    total: int
    available: int
    reserved: int
    committed: int
    shards: int
    ttl_ms: int
    limit: int
    state: SaleState
    key_fingerprint: str
    shard_available: Tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Hold:
    """A reservation recorded in the ledger as a PENDING order: the buyer may pay for it.

    ``replay``: a retry of an earlier RESERVE (same request id), nothing new was taken.
    ``already_committed``: already paid (a retry after the payment).
    """

    token: str
    sku: str
    user: str
    request_id: str
    qty: int
    expires_at_ms: int
    created_at_ms: int
    replay: bool = False
    already_committed: bool = False


@dataclass(frozen=True)
class Committed:
    """Sold. ``server_confirmed`` is False when the ledger committed but the server could
    not be told yet (unreachable, fenced, or the hold's deadline passed and this
    connection's role may not send ``COMMIT ... VERIFIED``): the sweeper finishes it."""

    server_confirmed: bool = True


@dataclass(frozen=True)
class AlreadyCommitted:
    """The same token was paid before (the token is the payment's idempotency key)."""


@dataclass(frozen=True)
class Refused:
    """Refused, no money moved: do not capture. ``status`` is the order's status, None
    when the ledger has no order for the token."""

    status: Optional[OrderStatus]


@dataclass(frozen=True)
class RefundRequired:
    """Money moved for a hold that was no longer this payment's to sell: the order is
    REFUND_REQUIRED. ``previous`` is the status it had."""

    previous: OrderStatus


@dataclass(frozen=True)
class OverLimit:
    """Refused, no money moved: the order is a part of a split sale, and paying it would
    take the buyer's paid units of the whole parent over its per-user limit (the
    ledger's ``pay_order`` keeps that limit; docs/cluster.md, "A split sale"). Nothing
    changed: the order stays PENDING and its hold live, to release or let expire. With
    money moved the outcome is :class:`RefundRequired`."""


PayOutcome = Union[Committed, AlreadyCommitted, Refused, OverLimit, RefundRequired]



# --- the waiting room (docs/protocol.md, section 4a) ---------------------------------------


@dataclass(frozen=True)
class RoomTicket:
    """``ROOM.JOIN``'s ``[ticket, position, eta_ms]``: the user's place, the same ticket
    again for a user who holds one. ``position`` is 1-based while waiting, 0 when admitted
    already or before the sale opens (:meth:`~stockgate.Client.status` says which);
    ``eta_ms`` the estimated wait."""

    ticket: str
    position: int
    eta_ms: int


@dataclass(frozen=True)
class RoomWaiting:
    """``[WAITING, position, eta_ms]``: in line, ``position`` 1-based."""

    position: int
    eta_ms: int


@dataclass(frozen=True)
class RoomAdmitted:
    """``[ADMITTED, admission-token, until_ms]``: the buyer's turn. ``admission`` is the
    token to pass to ``reserve`` before ``until_ms`` (Unix ms); a ``RESERVE`` with it uses
    the admission."""

    admission: str
    until_ms: int


@dataclass(frozen=True)
class RoomBeforeOpen:
    """``[BEFORE-OPEN, opens_at_ms]``: pre-queued; the line is drawn in a random order
    when the sale opens."""

    opens_at_ms: int


@dataclass(frozen=True)
class RoomReserved:
    """``[RESERVED]``: the admission was used by a ``RESERVE``."""


@dataclass(frozen=True)
class RoomSoldOut:
    """``[SOLDOUT]``: the sale has nothing available and nothing held."""


@dataclass(frozen=True)
class RoomExpired:
    """``[EXPIRED]``: admitted, not reserved within ``ADMIT-TTL``; join again for a place
    at the back."""


@dataclass(frozen=True)
class RoomLeft:
    """``[LEFT]``: the place was given up (``ROOM.LEAVE``)."""


RoomStatus = Union[RoomWaiting, RoomAdmitted, RoomBeforeOpen, RoomReserved, RoomSoldOut, RoomExpired, RoomLeft]


@dataclass(frozen=True)
class RoomInfo:
    """The ``ROOM.INFO sku`` map: the room's settings (``ROOM.OPEN``'s ``OPENS-AT RATE
    OVERADMIT ADMIT-TTL WINDOW MAX``), then ``waiting`` (in line or pre-queued),
    ``admitted`` (admitted, not reserved), ``open`` (the line is drawn) and ``sold_out``
    (waiting buyers are told SOLDOUT)."""

    opens_at_ms: int
    rate: int
    overadmit_permille: int
    admit_ttl_ms: int
    window_ms: int
    max_waiting: int
    waiting: int
    admitted: int
    open: bool
    sold_out: bool


# --- live counts over RESP (docs/protocol.md, section 4a, "Live counts over RESP") ---------


@dataclass(frozen=True)
class PlaceAdmitted:
    """``{"status":"ADMITTED","until_ms":...}`` on a buyer's channel: the buyer's turn
    until ``until_ms``. The channel carries no admission token: :meth:`~stockgate.Client.status`
    answers it (:class:`RoomAdmitted`)."""

    until_ms: int


@dataclass(frozen=True)
class RoomGone:
    """``{"status":"GONE"}`` on a buyer's channel: the room (or the place) is gone, the
    sale dropped or moved away."""


#: A buyer's place as the buyer's channel (``place:<ticket>``) tells it: what
#: ``ROOM.STATUS`` would answer, without the admission token, or :class:`RoomGone`.
PlaceStatus = Union[
    RoomWaiting, PlaceAdmitted, RoomBeforeOpen, RoomReserved, RoomSoldOut, RoomExpired, RoomLeft, RoomGone
]


@dataclass(frozen=True)
class LiveCounts:
    """One message of a sale's live channel (``sale:<sku>:live``) or of a buyer's
    (``place:<ticket>``): ``available``, ``held`` and ``sold`` are ``SALE.INFO``'s
    ``available``, ``reserved`` and ``committed``; ``waiting`` and ``admitted`` are
    ``ROOM.INFO``'s (0 with ``room`` False for a sale without a room); ``state`` is
    ``SALE.INFO``'s (``OPEN``, ``PAUSED``, ``FENCED``, ``MOVING``) or ``GONE`` once the sale
    is dropped or moved away. ``you`` is the buyer's place, on a buyer's channel only."""

    sku: str
    available: int
    held: int
    sold: int
    waiting: int
    admitted: int
    room: bool
    state: str
    you: Optional[PlaceStatus] = None

    @property
    def gone(self) -> bool:
        """The sale was dropped or moved away: no more counts will come for it here."""
        return self.state == "GONE"
