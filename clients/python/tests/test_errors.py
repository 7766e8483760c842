"""Error replies read the same on every redis-py the package allows: each reply goes
through the installed redis-py's own reply parser (what it does to a real ``-CODE text``
line), then through the package's translation. CI runs this on the oldest and the newest
redis-py of the declared range (tests/clients/python_package.rs)."""

from __future__ import annotations

import pytest
from redis._parsers.base import BaseParser

import stockgate
from stockgate import _core


def reply(line: str) -> BaseException:
    """What redis-py raises for the error reply ``-<line>``."""
    return BaseParser.parse_error(line)


CASES = [
    ("ERR syntax error", stockgate.CommandError, "syntax error"),
    ("ERR WAL is full", stockgate.CommandError, "WAL is full"),
    ("NOSALE no such sale", stockgate.NoSale, "no such sale"),
    ("FENCED sale state unproven", stockgate.Fenced, "sale state unproven"),
    ("PAUSED sale paused", stockgate.Paused, "sale paused"),
    ("DENIED token bound to another user", stockgate.AdmissionDenied, "token bound to another user"),
    ("EXISTS sale exists with other parameters", stockgate.Exists, "sale exists with other parameters"),
    ("NORES no such reservation", stockgate.NoReservation, "no such reservation"),
    ("EXPIRED reservation expired at 12 ms", stockgate.Expired, "reservation expired at 12 ms"),
    ("RELEASED reservation released", stockgate.Released, "reservation released"),
    ("NOPERM this user has no permissions", stockgate.NoPerm, "this user has no permissions"),
    ("NOPROTO unsupported protocol version", stockgate.NoProto, "unsupported protocol version"),
    ("EXECABORT Transaction discarded", stockgate.ExecAbort, "Transaction discarded"),
    ("NOQUORUM no leader", stockgate.NoQuorum, "no leader"),
    ("NOGOODSLAVE no candidate", stockgate.NoGoodSlave, "no candidate"),
    ("NOGROUP no such group", stockgate.NoGroup, "no such group"),
    ("BUSYGROUP group exists", stockgate.BusyGroup, "group exists"),
    ("MOVED 866 127.0.0.1:7001", stockgate.Moved, "866 127.0.0.1:7001"),
    ("ASK 866 127.0.0.1:7001", stockgate.Ask, "866 127.0.0.1:7001"),
    ("CROSSSLOT Keys in request don't hash to the same slot", stockgate.CrossSlot, "Keys in request don't hash to the same slot"),
    ("CLUSTERDOWN Hash slot not served", stockgate.ClusterDown, "Hash slot not served"),
]


@pytest.mark.parametrize("line,cls,detail", CASES, ids=[c[0].split()[0] + "-" + c[0].split()[1] for c in CASES])
def test_error_reply_is_typed_with_its_code_off(line: str, cls: type, detail: str) -> None:
    err = _core.translate(reply(line))
    assert type(err) is cls, (line, err)
    assert err.code == line.split()[0]
    assert err.detail == detail
    assert str(err) == line


@pytest.mark.parametrize("line", ["READONLY not the leader", "TRYAGAIN sale is moving", "LOADING catching up"])
def test_replies_of_commands_that_did_not_run_are_retried(line: str) -> None:
    assert _core.translate(reply(line)) is None


def test_auth_replies() -> None:
    assert type(_core.translate(reply("NOAUTH Authentication required."))) is stockgate.NoAuth
    wp = _core.translate(reply("WRONGPASS invalid username-password pair or user is disabled."))
    assert type(wp) is stockgate.WrongPass
    assert wp.detail == "invalid username-password pair or user is disabled."


def test_denied_reasons_from_a_reserve() -> None:
    # RESERVE's -DENIED is an answer: its reason is matched on by callers.
    for text, reason in [
        ("token bound to another user", "wrong_user"),
        ("token bound to another sku", "wrong_sku"),
        ("expired", "expired"),
        ("bad signature", "bad_signature"),
    ]:
        err = _core.translate(reply("DENIED " + text))
        assert err is not None
        out = _core.reserve_cmd("s", "u", "a", "r").on_error(err)
        assert out is not None and out.reason == reason, (text, out)


@pytest.mark.parametrize("state", ["OPEN", "PAUSED", "FENCED", "MOVING"])
def test_every_sale_state_the_server_sends_is_read(state: str) -> None:
    from stockgate import _parse

    info = _parse.parse_sale_info(
        [b"total", 1, b"available", 1, b"reserved", 0, b"committed", 0, b"shards", 1, b"ttl_ms", 1500,
         b"limit", 0, b"state", state.encode(), b"key_fingerprint", b"49dc46fa360f69d0"]
    )
    assert info.state.value == state


def test_credentials_of_a_redis_url_are_used() -> None:
    assert _core.credentials("redis://shop:s3%40cret@10.0.0.1:7379", None, None) == ("shop", "s3@cret")
    assert _core.credentials("redis://:only-pass@10.0.0.1:7379", None, None) == (None, "only-pass")
    assert _core.credentials("10.0.0.1:7379", "u", "p") == ("u", "p")
    assert _core.credentials("redis://shop:pw@h:1", "shop", None) == ("shop", "pw")
    with pytest.raises(ValueError):
        _core.credentials("redis://shop:pw@h:1", "other", None)
    seeds, kw = _core.cluster_kwargs("redis://shop:pw@h1:1, h2:2", None, None, (False, None, None, None))
    assert seeds == [("h1", 1), ("h2", 2)] and kw["username"] == "shop" and kw["password"] == "pw"
