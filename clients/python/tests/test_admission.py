"""Admission-token minting: the secret file's rules, the token's exact shape, and the real
server's verdict on minted tokens (accepted, and each refusal reason)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

import stockgate
from stockgate import Denied, Keyring, Replay, Reserved, SecretFileError, mint_admission_token


def b64d(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


SECRET = bytes(range(32))
HEX = SECRET.hex()


def test_token_shape_is_the_documented_one() -> None:
    t = mint_admission_token(SECRET, "k1", "SKU-1", "alice", 1767225630000)
    payload, sig = t.split(".")
    assert "=" not in t and "+" not in t and "/" not in t
    assert b64d(payload) == b"v1|k1|SKU-1|alice|1767225630000"
    assert b64d(sig) == hmac.new(SECRET, b"v1|k1|SKU-1|alice|1767225630000", hashlib.sha256).digest()
    assert len(sig) == 43


def test_expiry_must_be_1_to_19_digits() -> None:
    with pytest.raises(ValueError):
        mint_admission_token(SECRET, "k1", "S", "u", 0)
    with pytest.raises(ValueError):
        mint_admission_token(SECRET, "k1", "S", "u", 10**19)


def test_secret_file_rules() -> None:
    k = Keyring.parse(f"# rotation\n\nk2 {HEX}\n  k1 {'ab' * 40}  \n")
    assert k.kids == ["k2", "k1"]
    assert k.signing_kid == "k2"
    assert "ab" not in repr(k) and HEX not in repr(k)
    tok = k.mint("S", "u", expires_at_ms=123)
    assert b64d(tok.split(".")[0]) == b"v1|k2|S|u|123"
    tok = k.mint("S", "u", expires_at_ms=123, kid="k1")
    assert b64d(tok.split(".")[0]) == b"v1|k1|S|u|123"
    for bad, why in [
        ("", "no keys"),
        ("# only a comment\n", "no keys"),
        (f"k1 {HEX} extra", "line 1"),
        ("k1", "line 1"),
        (f"k/1 {HEX}", "kid"),
        (f"{'k' * 65} {HEX}", "kid"),
        ("k1 abc", "hex"),
        ("k1 zz" + HEX[2:], "hex"),
        (f"k1 {'ab' * 31}", "at least 32 bytes"),
    ]:
        with pytest.raises(SecretFileError, match=why):
            Keyring.parse(bad)
    with pytest.raises(SecretFileError):
        k.mint("S", "u", kid="nope")


def test_the_server_accepts_a_minted_token(client: stockgate.Client, keyring: Keyring, sku: str) -> None:
    client.sale_create(sku, 10)
    out = client.reserve(sku, "alice", keyring.mint(sku, "alice"), "req-1")
    assert isinstance(out, Reserved)
    assert out.token.startswith("{" + sku + "}") and len(out.token) == len(sku) + 2 + 26
    # The token binds (sku, user), not the request: another request of alice's with it.
    again = client.reserve(sku, "alice", keyring.mint(sku, "alice"), "req-1")
    assert again == Replay(out.token, out.expires_at_ms, out.shard)


def test_the_server_refuses_each_kind_of_bad_token(client: stockgate.Client, keyring: Keyring, sku: str) -> None:
    client.sale_create(sku, 10)
    kid = keyring.signing_kid
    cases = {
        "wrong_user": keyring.mint(sku, "bob"),
        "wrong_sku": keyring.mint(sku + "X", "alice"),
        "expired": keyring.mint(sku, "alice", expires_at_ms=stockgate.now_ms() - 1000),
        "bad_signature": mint_admission_token(b"\x07" * 32, kid, sku, "alice", stockgate.now_ms() + 60_000),
        "unknown_key": mint_admission_token(SECRET, "no-such-kid", sku, "alice", stockgate.now_ms() + 60_000),
        "malformed": "not-a-token",
    }
    for reason, token in cases.items():
        out = client.reserve(sku, "alice", token, f"req-{reason}")
        assert isinstance(out, Denied), (reason, out)
        assert out.reason == reason, out
    assert client.sale_info(sku).available == 10, "a refused RESERVE takes nothing"
