"""Errors: one base class, each carrying the code it came with.

Server errors carry the first word of the server's error reply (docs/protocol.md,
section 10): that word is what a client matches on, the rest is for people. Ledger errors
carry the SQLSTATE the ledger's functions raise (``SG001`` ... ``SG004``).
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Type

__all__ = [
    "StockgateError",
    "ServerError",
    "CommandError",
    "NoSale",
    "Fenced",
    "Paused",
    "AdmissionDenied",
    "Exists",
    "NoReservation",
    "Expired",
    "Released",
    "NoAuth",
    "WrongPass",
    "NoPerm",
    "NoProto",
    "ExecAbort",
    "ReadOnly",
    "Loading",
    "NoQuorum",
    "NoGoodSlave",
    "NoGroup",
    "BusyGroup",
    "Moved",
    "Ask",
    "TryAgain",
    "CrossSlot",
    "ClusterDown",
    "QueueFull",
    "SoldOutError",
    "TooManyJoins",
    "NoRoom",
    "BadTicket",
    "NotQueued",
    "Unavailable",
    "LedgerError",
    "OrderRefused",
    "OrderConflict",
    "OrderNotFound",
    "InvalidOrderArgument",
    "server_error",
    "ledger_error",
]


class StockgateError(Exception):
    """Base class of every error this package raises.

    ``code`` is the server's error code (``NORES``, ``FENCED``, ...), a ledger SQLSTATE
    (``SG001``...), or ``UNAVAILABLE`` when a retriable call ran out of its deadline.
    ``detail`` is the rest of the message.
    """

    code: str = "ERR"

    def __init__(self, detail: str = "", code: Optional[str] = None) -> None:
        if code is not None:
            self.code = code
        self.detail = detail
        super().__init__(f"{self.code} {detail}".strip())


class ServerError(StockgateError):
    """An error reply of the server whose code this package has no class for."""


class CommandError(ServerError):
    """``-ERR ...``: arguments, capacity or state refusals. Nothing changed."""

    code = "ERR"


class NoSale(ServerError):
    code = "NOSALE"


class Fenced(ServerError):
    """The sale's state is unproven: retry after the operator's rebuild."""

    code = "FENCED"


class Paused(ServerError):
    """RESERVE on a paused sale: retry later with the same request id."""

    code = "PAUSED"


class AdmissionDenied(ServerError):
    """``-DENIED`` outside RESERVE's typed answer (RESERVE answers :class:`Denied`)."""

    code = "DENIED"


class Exists(ServerError):
    code = "EXISTS"


class NoReservation(ServerError):
    """``-NORES``: unknown token, or (EXTEND) no longer RESERVED."""

    code = "NORES"


class Expired(ServerError):
    """``-EXPIRED``: EXTEND past the deadline, or COMMIT past it without VERIFIED.

    ``expires_at_ms`` is the deadline when the server names it (COMMIT does).
    """

    code = "EXPIRED"

    def __init__(self, detail: str = "", code: Optional[str] = None) -> None:
        super().__init__(detail, code)
        m = re.search(r"expired at (\d+) ms", detail)
        self.expires_at_ms: Optional[int] = int(m.group(1)) if m else None


class Released(ServerError):
    """``-RELEASED``: the units went back to stock; refuse or refund the capture."""

    code = "RELEASED"


class NoAuth(ServerError):
    code = "NOAUTH"


class WrongPass(ServerError):
    code = "WRONGPASS"


class NoPerm(ServerError):
    code = "NOPERM"


class NoProto(ServerError):
    code = "NOPROTO"


class ExecAbort(ServerError):
    code = "EXECABORT"


class ReadOnly(ServerError):
    """A member that may not take the command (not the leader): it did not run."""

    code = "READONLY"


class Loading(ServerError):
    code = "LOADING"


class NoQuorum(ServerError):
    code = "NOQUORUM"


class NoGoodSlave(ServerError):
    code = "NOGOODSLAVE"


class NoGroup(ServerError):
    code = "NOGROUP"


class BusyGroup(ServerError):
    code = "BUSYGROUP"


class Moved(ServerError):
    """Cluster mode: the sale's slot belongs to another group (``MOVED <slot> <host>:<port>``).
    It did not run; a :class:`~stockgate.ClusterClient` follows it by itself."""

    code = "MOVED"


class Ask(ServerError):
    """Cluster mode: the slot is moving and the sale is already on the destination
    (``ASK <slot> <host>:<port>``). It did not run; send ``ASKING`` and the command there."""

    code = "ASK"


class TryAgain(ServerError):
    """The sale is frozen while it moves to another group: it did not run. Retried
    within the call's deadline, so it reaches the application only inside
    :class:`Unavailable`."""

    code = "TRYAGAIN"


class CrossSlot(ServerError):
    """Cluster mode: a transaction touched two slots; nothing ran."""

    code = "CROSSSLOT"


class ClusterDown(ServerError):
    """Cluster mode: the slot has no owner in the map; it did not run."""

    code = "CLUSTERDOWN"


class QueueFull(ServerError):
    """``-QUEUEFULL`` (``ROOM.JOIN``): the waiting room holds its ``MAX`` buyers already;
    nothing changed. ``max_waiting`` is that limit when the server names it."""

    code = "QUEUEFULL"

    def __init__(self, detail: str = "", code: Optional[str] = None) -> None:
        super().__init__(detail, code)
        m = re.search(r"queue full: (\d+) buyers", detail)
        self.max_waiting: Optional[int] = int(m.group(1)) if m else None


class SoldOutError(ServerError):
    """``-SOLDOUT`` (``ROOM.JOIN``): the sale has nothing available and nothing held, so
    the room takes no new buyers. (``RESERVE`` answers the result :class:`SoldOut`.)"""

    code = "SOLDOUT"


class TooManyJoins(ServerError):
    """``-TOOMANYJOINS`` (``ROOM.JOIN``): the user took the most places one user may take
    in this sale (4)."""

    code = "TOOMANYJOINS"


class NoRoom(ServerError):
    """``-NOROOM``: the sale has no waiting room (``ROOM.OPEN`` opens one)."""

    code = "NOROOM"


class BadTicket(ServerError):
    """``-BADTICKET`` (``ROOM.STATUS``): the ticket is malformed, altered, of another sale
    or user (``ticket refused: ...``), or of a place given up since (``stale``: a later
    join replaced it; use that join's ticket)."""

    code = "BADTICKET"

    def __init__(self, detail: str = "", code: Optional[str] = None) -> None:
        super().__init__(detail, code)
        self.stale: bool = detail.startswith("stale ticket")


class NotQueued(ServerError):
    """``-NOTQUEUED`` (``ROOM.STATUS``): the user holds no place in the room."""

    code = "NOTQUEUED"


class Unavailable(StockgateError):
    """A call that is safe to repeat kept failing (connection lost, no leader, ...) until
    its deadline. ``last`` is the last underlying error; the outcome of the call is
    unknown, and repeating it later is still safe."""

    code = "UNAVAILABLE"

    def __init__(self, detail: str, last: Optional[BaseException] = None) -> None:
        super().__init__(detail)
        self.last = last


_BY_CODE: Dict[str, Type[ServerError]] = {
    cls.code: cls
    for cls in (
        CommandError,
        NoSale,
        Fenced,
        Paused,
        AdmissionDenied,
        Exists,
        NoReservation,
        Expired,
        Released,
        NoAuth,
        WrongPass,
        NoPerm,
        NoProto,
        ExecAbort,
        ReadOnly,
        Loading,
        NoQuorum,
        NoGoodSlave,
        NoGroup,
        BusyGroup,
        Moved,
        Ask,
        TryAgain,
        CrossSlot,
        ClusterDown,
        QueueFull,
        SoldOutError,
        TooManyJoins,
        NoRoom,
        BadTicket,
        NotQueued,
    )
}


def server_error(code: str, detail: str) -> ServerError:
    """The typed exception for an error reply ``-<code> <detail>``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return ServerError(detail, code)
    return cls(detail)


class LedgerError(StockgateError):
    """An error raised by one of the ledger's functions; ``code`` is its SQLSTATE."""

    code = "SG000"

    def __init__(self, detail: str = "", code: Optional[str] = None, token: Optional[str] = None) -> None:
        super().__init__(detail, code)
        self.token = token


class OrderRefused(LedgerError):
    """``SG001``: the order's status does not allow this step. ``status`` is that status."""

    code = "SG001"

    def __init__(self, detail: str = "", code: Optional[str] = None, token: Optional[str] = None) -> None:
        super().__init__(detail, code, token)
        m = re.match(r"order (\S+) is ([A-Z_]+):", detail)
        self.status: Optional[str] = m.group(2) if m else None
        if m and self.token is None:
            self.token = m.group(1)


class OrderConflict(LedgerError):
    """``SG002``: the token exists with another sku / user / qty (a bug in the caller)."""

    code = "SG002"


class OrderNotFound(LedgerError):
    """``SG003``: no order for this token."""

    code = "SG003"


class InvalidOrderArgument(LedgerError):
    """``SG004``: an invalid argument (qty <= 0, empty token, negative time...)."""

    code = "SG004"


_LEDGER_BY_CODE: Dict[str, Type[LedgerError]] = {
    cls.code: cls for cls in (OrderRefused, OrderConflict, OrderNotFound, InvalidOrderArgument)
}


def ledger_error(sqlstate: str, detail: str, token: Optional[str] = None) -> Optional[LedgerError]:
    """The typed exception for a ledger function's SQLSTATE, or None if it is not one of
    the ledger's own (``SG...``)."""
    cls = _LEDGER_BY_CODE.get(sqlstate)
    if cls is None:
        return None
    return cls(detail, token=token)
