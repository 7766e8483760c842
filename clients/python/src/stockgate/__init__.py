"""stockgate: a client for the stockgate reservation server and its Postgres ledger.

- :class:`Client` / :class:`AsyncClient`: the server's commands with typed replies,
  retried with the same arguments after a lost reply or a failover (one address, or a Raft
  group through the Sentinel interface).
- :meth:`Client.watch_sale` / :meth:`Client.watch_place`: a sale's live counts and a
  buyer's place, pushed over RESP pub/sub (:class:`LiveWatch`, :class:`AsyncLiveWatch`).
- :class:`Keyring`: admission tokens, minted as the server verifies them.
- :class:`Checkout` / :class:`AsyncCheckout`: reserve and record, pay, cancel, over the
  ledger's functions.
- :func:`reserve_split`: a sale split over several groups, from the buyer's home part.
"""

from __future__ import annotations

from ._core import RetryPolicy
from ._parse import ProtocolMismatch
from .admission import Keyring, SecretFileError, mint_admission_token, now_ms
from ._pool import AsyncPool, SyncPool
from .aio import AsyncClient
from .checkout import AsyncCheckout, Checkout, StartOutcome
from .client import Client
from .live import AsyncLiveWatch, LiveWatch
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .results import *  # noqa: F401,F403
from .results import __all__ as _results_all
from .split import SplitReserve, home_part, probe_order, reserve_split, reserve_split_async, user_hash

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "LiveWatch",
    "AsyncLiveWatch",
    "RetryPolicy",
    "Checkout",
    "AsyncCheckout",
    "StartOutcome",
    "SyncPool",
    "AsyncPool",
    "Keyring",
    "SecretFileError",
    "mint_admission_token",
    "now_ms",
    "ProtocolMismatch",
    "SplitReserve",
    "home_part",
    "probe_order",
    "reserve_split",
    "reserve_split_async",
    "user_hash",
    *_errors_all,
    *_results_all,
]
