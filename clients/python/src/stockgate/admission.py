"""Admission tokens, minted exactly as the server verifies them (docs/protocol.md,
section 3)::

    payload = "v1|" kid "|" sku "|" user "|" expires_at_ms
    token   = base64url(payload) "." base64url(HMAC-SHA256(secret_of(kid), payload))

base64url is unpadded. The secret file holds one ``<kid> <secret as hex>`` per line
(``#`` comments and blank lines skipped); the first line's key signs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

__all__ = ["SecretFileError", "Keyring", "mint_admission_token", "now_ms"]

_KID = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_HEX = re.compile(r"^(?:[0-9a-fA-F]{2})*$")
MIN_SECRET_BYTES = 32


class SecretFileError(ValueError):
    """The secret file (or text) is not ``<kid> <hex>`` lines the server would accept."""




def now_ms() -> int:
    """Unix time in milliseconds, as the server reports times."""
    return time.time_ns() // 1_000_000


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint_admission_token(secret: bytes, kid: str, sku: str, user: str, expires_at_ms: int) -> str:
    """An admission token for ``(sku, user)`` valid until ``expires_at_ms`` (Unix ms),
    signed with ``secret`` under the key id ``kid``."""
    if not 1 <= expires_at_ms <= 9_999_999_999_999_999_999:
        raise ValueError("expires_at_ms must be 1 to 19 digits")
    payload = f"v1|{kid}|{sku}|{user}|{expires_at_ms}".encode()
    sig = hmac.new(secret, payload, hashlib.sha256).digest()
    return f"{_b64url(payload)}.{_b64url(sig)}"


@dataclass(frozen=True)
class _Key:
    kid: str
    secret: bytes


class Keyring:
    """The keys of a secret file: the first signs, as the server's ``mint-token`` does."""

    def __init__(self, keys: List[Tuple[str, bytes]]) -> None:
        if not keys:
            raise SecretFileError("no keys")
        self._keys = [_Key(k, s) for k, s in keys]

    def __repr__(self) -> str:
        # Never print secrets.
        return f"Keyring(kids={[k.kid for k in self._keys]!r})"

    @classmethod
    def parse(cls, text: str) -> "Keyring":
        """Parses a secret file's text with the server's rules."""
        keys: List[Tuple[str, bytes]] = []
        for n, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise SecretFileError(f"line {n}: expected `<kid> <secret as hex>`")
            kid, hexs = parts
            if not _KID.match(kid):
                raise SecretFileError(f"line {n}: kid must be 1-64 bytes of [A-Za-z0-9_.:-]")
            if not _HEX.match(hexs):
                raise SecretFileError(f"line {n}: secret is not valid hex")
            secret = bytes.fromhex(hexs)
            if len(secret) < MIN_SECRET_BYTES:
                raise SecretFileError(f"line {n}: secret must be at least 32 bytes")
            keys.append((kid, secret))
        return cls(keys)

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"]) -> "Keyring":
        """Reads a secret file (``--secret-file``, or ``<data-dir>/secret``)."""
        with open(path, encoding="utf-8") as f:
            return cls.parse(f.read())

    @property
    def signing_kid(self) -> str:
        return self._keys[0].kid

    @property
    def kids(self) -> List[str]:
        return [k.kid for k in self._keys]

    def mint(
        self,
        sku: str,
        user: str,
        ttl_ms: int = 60_000,
        *,
        expires_at_ms: Optional[int] = None,
        kid: Optional[str] = None,
    ) -> str:
        """A token for ``(sku, user)``, valid for ``ttl_ms`` from now (or until
        ``expires_at_ms``), signed with the first key (or the key named ``kid``)."""
        key = self._keys[0]
        if kid is not None:
            found = [k for k in self._keys if k.kid == kid]
            if not found:
                raise SecretFileError(f"no key named {kid!r}")
            key = found[0]
        exp = expires_at_ms if expires_at_ms is not None else now_ms() + ttl_ms
        return mint_admission_token(key.secret, key.kid, sku, user, exp)
