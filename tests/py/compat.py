"""redis-py against stockgate: RESP2 and RESP3 connections, pipelines, errors.

Usage: python3 tests/py/compat.py PORT DATA_DIR. Exits non-zero on any failure.
"""
import sys, time

import redis

from sg import b64, data_dir, mint, port  # noqa: F401


for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto, decode_responses=True)
    assert r.ping() is True
    sku = f"PY{proto}"
    assert r.execute_command("SALE.CREATE", sku, 5, "SHARDS", 1) in ("OK", True)
    out = r.execute_command("RESERVE", sku, "alice", mint(sku, "alice"), "req-1")
    assert out[0] == "RESERVED", out
    token = out[1]
    assert token.startswith("{%s}" % sku)
    again = r.execute_command("RESERVE", sku, "alice", mint(sku, "alice"), "req-1")
    assert again[0] == "REPLAY" and again[1] == token
    info = r.execute_command("RESERVATION", token)
    if isinstance(info, list):
        info = dict(zip(info[::2], info[1::2]))
    assert info["state"] == "RESERVED" and int(info["qty"]) == 1, info
    assert r.execute_command("STOCK", sku) == 4
    # A pipeline of reservations answers in order.
    p = r.pipeline(transaction=False)
    for i in range(20):
        u = f"user{i}"
        p.execute_command("RESERVE", sku, u, mint(sku, u), "r")
    outcomes = [x[0] for x in p.execute()]
    assert outcomes.count("RESERVED") == 4 and outcomes.count("SOLDOUT") == 16, outcomes
    assert r.execute_command("COMMIT", token) == 1
    try:
        r.execute_command("STOCK", "NOPE")
        raise AssertionError("expected an error")
    except redis.ResponseError as e:
        assert "NOSALE" in str(e)
    # Command introspection that cluster-aware clients rely on.
    cmds = r.command()
    assert "reserve" in cmds and cmds["reserve"]["arity"] == -5, cmds.get("reserve")
    docs = r.execute_command("COMMAND", "INFO", "reserve")
    assert docs, docs
    r.close()
print("redis-py ok")
