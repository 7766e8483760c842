"""redis-py's default pipeline() (transaction=True: MULTI ... EXEC) against stockgate.

Usage: python3 tests/py/transactions.py PORT DATA_DIR. Exits non-zero on any failure.
"""
import base64, hashlib, hmac, sys, time

import redis

port, data_dir = int(sys.argv[1]), sys.argv[2]
kid, hexsecret = open(f"{data_dir}/secret").read().split()[:2]
secret = bytes.fromhex(hexsecret)


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(sku, user, ttl_ms=60_000):
    payload = f"v1|{kid}|{sku}|{user}|{int(time.time() * 1000) + ttl_ms}".encode()
    return b64(payload) + "." + b64(hmac.new(secret, payload, hashlib.sha256).digest())


for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto, decode_responses=True)
    sku = f"TX{proto}"
    assert r.execute_command("SALE.CREATE", sku, 10, "SHARDS", 1) in ("OK", True)

    # Three reservations and a STOCK in one transaction, the client's default mode.
    p = r.pipeline()
    for u in ("ann", "bob", "cat"):
        p.execute_command("RESERVE", sku, u, mint(sku, u), "req-1")
    p.execute_command("STOCK", sku)
    out = p.execute()
    assert [x[0] for x in out[:3]] == ["RESERVED"] * 3, out
    assert out[3] == 7, out
    tokens = [x[1] for x in out[:3]]
    assert len(set(tokens)) == 3
    assert r.execute_command("STOCK", sku) == 7, "exactly one unit per RESERVE"

    # The same transaction again: every RESERVE replays, nothing more is taken.
    p = r.pipeline()
    for u in ("ann", "bob", "cat"):
        p.execute_command("RESERVE", sku, u, mint(sku, u), "req-1")
    out = p.execute()
    assert [x[0] for x in out] == ["REPLAY"] * 3 and [x[1] for x in out] == tokens, out
    assert r.execute_command("STOCK", sku) == 7

    # A queue-time error (unknown command, wrong arity) aborts: nothing runs.
    for bad in (("NOSUCHCMD", "x"), ("RESERVE", sku)):
        p = r.pipeline()
        p.execute_command("RESERVE", sku, "dan", mint(sku, "dan"), "req-1")
        p.execute_command(*bad)
        p.execute_command("RELEASE", tokens[0])
        try:
            p.execute()
            raise AssertionError(f"{bad}: expected the transaction to fail")
        except redis.exceptions.ResponseError as e:
            assert "unknown command" in str(e) or "wrong number" in str(e), e
        assert r.execute_command("STOCK", sku) == 7, bad
        info = r.execute_command("RESERVATION", tokens[0])
        if isinstance(info, list):
            info = dict(zip(info[::2], info[1::2]))
        assert info["state"] == "RESERVED", info

    # A runtime error is one reply among the others; the rest still ran.
    p = r.pipeline()
    p.execute_command("STOCK", "NOPE")
    p.execute_command("RELEASE", tokens[0])
    p.execute_command("STOCK", sku)
    out = p.execute(raise_on_error=False)
    assert isinstance(out[0], redis.exceptions.ResponseError) and "NOSALE" in str(out[0]), out
    assert out[1:] == [1, 8], out

    # WATCH is refused with a clear error rather than faked.
    p = r.pipeline()
    try:
        p.watch(sku)
        raise AssertionError("WATCH must be refused")
    except redis.exceptions.ResponseError as e:
        assert "not supported" in str(e), e
    p.reset()
    assert r.ping() is True
    r.close()
print("redis-py transactions ok")
