"""The order feed with redis-py, unmodified: xread / xrange / xrevrange / xlen / xinfo_stream
over a scripted workload, in RESP2 and RESP3; BLOCK wakes on a new event."""
import base64, hashlib, hmac, sys, threading, time

import redis

port, data_dir = int(sys.argv[1]), sys.argv[2]
kid, secret_hex = open(f"{data_dir}/secret").read().split()[:2]


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(sku, user, ttl_ms=60_000):
    payload = f"v1|{kid}|{sku}|{user}|{int(time.time() * 1000) + ttl_ms}".encode()
    sig = hmac.new(bytes.fromhex(secret_hex), payload, hashlib.sha256).digest()
    return b64(payload) + "." + b64(sig)


r = redis.Redis(port=port, decode_responses=True)
ALL, SALE = "stockgate:events", "{FEEDPY}:events"

# The scripted workload: every state change it makes, in order.
expected = []
r.execute_command("SALE.CREATE", "FEEDPY", 10, "SHARDS", 2)
expected.append(("sale.created", None))
r.execute_command("SALE.CREATE", "OTHER", 5)  # another sale: only in the all-events stream
toks = []
for i in range(4):
    rep = r.execute_command("RESERVE", "FEEDPY", f"u{i}", mint("FEEDPY", f"u{i}"), f"req{i}")
    assert rep[0] == "RESERVED", rep
    toks.append(rep[1])
    expected.append(("reserved", rep[1]))
# a retry is a REPLAY: no state change, no entry
assert r.execute_command("RESERVE", "FEEDPY", "u0", mint("FEEDPY", "u0"), "req0")[0] == "REPLAY"
assert r.execute_command("COMMIT", toks[0]) == 1
expected.append(("committed", toks[0]))
assert r.execute_command("COMMIT", toks[0]) == 0  # no change, no entry
assert r.execute_command("RELEASE", toks[1]) == 1
expected.append(("released", toks[1]))
assert r.execute_command("RELEASE", toks[1]) == 0
r.execute_command("EXTEND", toks[2], 120000)
expected.append(("extended", toks[2]))
r.execute_command("SALE.PAUSE", "FEEDPY")
expected.append(("sale.state", None))
r.execute_command("SALE.RESUME", "FEEDPY")
expected.append(("sale.state", None))
r.execute_command("SALE.ADJUST", "FEEDPY", 3)
expected.append(("sale.adjusted", None))


def check(entries):
    got = [(f["type"], f.get("token")) for _, f in entries]
    assert got == expected, f"\n got {got}\nwant {expected}"
    lsns = [int(i.split("-")[0]) for i, _ in entries]
    assert lsns == sorted(set(lsns)), lsns
    assert all(i.endswith("-0") for i, _ in entries)
    res = [f for _, f in entries if f["type"] == "reserved"]
    for i, f in enumerate(res):
        user, req = (f"u{i}", f"req{i}") if i < 4 else (f"late{i - 2}", "x")
        assert f["sku"] == "FEEDPY" and f["user"] == user and f["request_id"] == req, f
        assert f["qty"] == "1" and f["token"] == toks[i], f
        assert int(f["expires_at_ms"]) > int(f["created_at_ms"]) > 0, f
        assert f["shard"] in ("0", "1"), f
    for _, f in entries:
        assert f["sku"] == "FEEDPY", f  # released/committed/extended: sku from the token


for proto in (2, 3):
    c = redis.Redis(port=port, decode_responses=True, protocol=proto)
    # xread, per-sale stream, from the start, paged with COUNT 3
    entries, last = [], "0-0"
    while True:
        rep = c.xread({SALE: last}, count=3)
        if not rep:
            break
        if proto == 3:
            batch = rep[SALE][0]
        else:
            assert rep[0][0] == SALE, rep
            batch = rep[0][1]
        entries += batch
        last = batch[-1][0]
    check(entries)
    check(c.xrange(SALE, "-", "+"))
    assert [i for i, _ in c.xrevrange(SALE, "+", "-")] == [i for i, _ in reversed(entries)]
    assert c.xrange(SALE, entries[1][0], entries[2][0]) == entries[1:3]
    assert c.xrange(SALE, "(" + entries[1][0], "+", count=1) == entries[2:3]
    assert c.xlen(SALE) == len(expected)
    # the all-events stream has the other sale too, in log order
    everything = c.xrange(ALL, "-", "+")
    assert [e for e in everything if e[1]["sku"] == "FEEDPY"] == entries
    assert any(e[1]["sku"] == "OTHER" for e in everything)
    assert c.xlen(ALL) == len(everything)
    info = c.xinfo_stream(ALL)
    assert info["length"] == len(everything), info
    assert info["last-entry"][0] == everything[-1][0], info
    # nothing new after $
    assert not c.xread({SALE: "$"}, count=10, block=None)

    # BLOCK wakes on a new durable event
    def later(i=proto):
        time.sleep(0.3)
        r.execute_command("RESERVE", "FEEDPY", f"late{i}", mint("FEEDPY", f"late{i}"), "x")

    t0 = time.time()
    th = threading.Thread(target=later)
    th.start()
    rep = c.xread({SALE: "$"}, block=5000)
    th.join()
    waited = time.time() - t0
    batch = rep[SALE][0] if proto == 3 else rep[0][1]
    assert len(batch) == 1 and batch[0][1]["type"] == "reserved" and batch[0][1]["user"] == f"late{proto}", rep
    assert 0.2 < waited < 4, waited
    expected.append(("reserved", batch[0][1]["token"]))
    toks.append(batch[0][1]["token"])
    # BLOCK with nothing coming times out with nil
    t0 = time.time()
    assert c.xread({SALE: "$"}, block=200) in (None, [], {})
    assert time.time() - t0 >= 0.19
    # unknown stream names are refused rather than silently empty
    try:
        c.xread({"nosuch": "0"})
        raise AssertionError("unknown stream accepted")
    except redis.ResponseError as e:
        assert "unknown stream" in str(e), e

print("redis-py feed ok")
