"""Consumer groups on the order feed with redis-py, unmodified: two consumers of one group
read a scripted workload with xreadgroup (every entry delivered exactly once across them,
in log order), xack empties xpending, xautoclaim moves an idle entry, xclaim, BLOCK wakes
on a new event, xinfo_groups / xinfo_consumers, Redis's error codes. RESP2 and RESP3.

argv: port data_dir phase. Phase `run` does all of it and leaves group `persist` with a
known state (written to stdout as `STATE <json>`); phase `check <json>` (after a kill -9
and a restart) checks that state came back."""
import json, sys, threading, time

import redis

sys.argv, phase, rest = sys.argv[:3], sys.argv[3], sys.argv[4:]
import sg  # noqa: E402  (reads port and data dir from argv)

ALL = "stockgate:events"
r = redis.Redis(port=sg.port, decode_responses=True)


def reserve(sku, user, req):
    rep = r.execute_command("RESERVE", sku, user, sg.mint(sku, user), req)
    assert rep[0] == "RESERVED", rep
    return rep[1]


def entries_of(rep, stream, proto):
    """xreadgroup's parsed reply -> [(id, fields)] of one stream."""
    if not rep:
        return []
    if proto == 3:
        return rep[stream][0]
    assert len(rep) == 1 and rep[0][0] == stream, rep
    return rep[0][1]


def lsn(i):
    return int(i.split("-")[0])


def workload(sku, n):
    r.execute_command("SALE.CREATE", sku, 1000, "SHARDS", 2)
    toks = [reserve(sku, f"u{i}", f"req{i}") for i in range(n)]
    for t in toks[: n // 3]:
        assert r.execute_command("COMMIT", t) == 1
    for t in toks[n // 3 : n // 2]:
        assert r.execute_command("RELEASE", t) == 1
    return toks


def run():
    for proto in (2, 3):
        c = redis.Redis(port=sg.port, decode_responses=True, protocol=proto)
        sku = f"GRP{proto}"
        stream = "{" + sku + "}:events"
        start = c.xinfo_stream(ALL)["last-generated-id"]
        # A group on the all-events stream from now on, and one on the sale's stream
        # from its beginning.
        assert c.xgroup_create(ALL, f"all{proto}", id="$") is True
        assert c.xgroup_create(stream, "orders", id="0", mkstream=True) is True
        try:
            c.xgroup_create(stream, "orders", id="0")
            raise AssertionError("BUSYGROUP expected")
        except redis.ResponseError as e:
            assert str(e).startswith("BUSYGROUP"), e
        workload(sku, 30)
        want = c.xrange(stream, "-", "+")
        assert len(want) == 1 + 30 + 10 + 5, len(want)

        # Two consumers, concurrently, small batches, acking what they processed.
        got = {"c1": [], "c2": []}
        lock = threading.Lock()

        def consume(name):
            cc = redis.Redis(port=sg.port, decode_responses=True, protocol=proto)
            idle_rounds = 0
            while idle_rounds < 3:
                rep = cc.xreadgroup("orders", name, {stream: ">"}, count=4, block=100)
                es = entries_of(rep, stream, proto)
                if not es:
                    idle_rounds += 1
                    continue
                idle_rounds = 0
                with lock:
                    got[name] += es
                assert cc.xack(stream, "orders", *[i for i, _ in es]) == len(es)

        ts = [threading.Thread(target=consume, args=(n,)) for n in got]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        ids1, ids2 = [i for i, _ in got["c1"]], [i for i, _ in got["c2"]]
        assert not set(ids1) & set(ids2), "an entry was delivered to both consumers"
        assert sorted(ids1 + ids2, key=lsn) == [i for i, _ in want], "not every entry exactly once"
        for ids in (ids1, ids2):
            assert [lsn(i) for i in ids] == sorted(lsn(i) for i in ids), "out of log order"
        assert dict(got["c1"] + got["c2"]) == dict(want), "fields differ from XRANGE"
        p = c.xpending(stream, "orders")
        assert p["pending"] == 0 and p["min"] is None and p["consumers"] == [], p

        # The all-events group sees the same entries (and the other sale's none).
        rep = c.xreadgroup(f"all{proto}", "solo", {ALL: ">"}, count=10_000, noack=True)
        allg = entries_of(rep, ALL, proto)
        assert [i for i, f in allg if f["sku"] == sku] == [i for i, _ in want], allg[:3]
        assert lsn(allg[0][0]) > lsn(start)
        assert c.xpending(ALL, f"all{proto}")["pending"] == 0  # NOACK

        # Pending, XACK, XPENDING in both forms.
        toks = [reserve(sku, f"p{i}", f"preq{i}") for i in range(3)]
        es = entries_of(c.xreadgroup("orders", "c1", {stream: ">"}, count=10), stream, proto)
        assert [f["token"] for _, f in es] == toks, es
        p = c.xpending(stream, "orders")
        assert p["pending"] == 3 and p["min"] == es[0][0] and p["max"] == es[-1][0], p
        assert p["consumers"] == [{"name": "c1", "pending": 3}], p
        rng = c.xpending_range(stream, "orders", "-", "+", 10)
        assert [x["message_id"] for x in rng] == [i for i, _ in es], rng
        assert all(x["consumer"] == "c1" and x["times_delivered"] == 1 for x in rng), rng
        assert c.xpending_range(stream, "orders", "-", "+", 10, consumername="c2") == []
        assert c.xack(stream, "orders", es[0][0], es[0][0], "999999-0") == 1
        assert [x["message_id"] for x in c.xpending_range(stream, "orders", "-", "+", 10)] == [
            es[1][0],
            es[2][0],
        ]
        # Re-reading the consumer's history: one more delivery each.
        hist = entries_of(c.xreadgroup("orders", "c1", {stream: "0"}), stream, proto)
        assert [i for i, _ in hist] == [es[1][0], es[2][0]], hist
        assert [x["times_delivered"] for x in c.xpending_range(stream, "orders", "-", "+", 10)] == [2, 2]
        # Nothing new: nil without BLOCK.
        assert not c.xreadgroup("orders", "c1", {stream: ">"})

        # XAUTOCLAIM moves only entries idle long enough.
        nxt, claimed, deleted = c.xautoclaim(stream, "orders", "c2", 60_000, "0-0")
        assert claimed == [] and deleted == [], (claimed, deleted)
        time.sleep(0.3)
        nxt, claimed, deleted = c.xautoclaim(stream, "orders", "c2", 200, "0-0", count=1)
        assert [i for i, _ in claimed] == [es[1][0]] and deleted == [], claimed
        assert nxt == es[2][0], nxt
        assert claimed[0][1]["token"] == toks[1]
        owners = {x["message_id"]: x["consumer"] for x in c.xpending_range(stream, "orders", "-", "+", 10)}
        assert owners == {es[1][0]: "c2", es[2][0]: "c1"}, owners
        # XCLAIM (JUSTID) back to c1.
        assert c.xclaim(stream, "orders", "c1", 0, [es[1][0]], justid=True) == [es[1][0]]
        info = {x["name"]: x for x in c.xinfo_consumers(stream, "orders")}
        assert info["c1"]["pending"] == 2 and info["c2"]["pending"] == 0, info
        assert set(info) == {"c1", "c2"}, info
        g = [x for x in c.xinfo_groups(stream) if x["name"] == "orders"][0]
        assert g["pending"] == 2 and g["consumers"] == 2 and g["last-delivered-id"] == es[-1][0], g
        ga = [x for x in c.xinfo_groups(ALL) if x["name"] == f"all{proto}"][0]
        assert ga["lag"] == 3, ga  # the three reservations since its NOACK read
        assert c.xinfo_stream(stream)["groups"] == 1

        # BLOCK on XREADGROUP wakes on a new event.
        def later():
            time.sleep(0.4)
            reserve(sku, "late", "latereq")

        t0 = time.time()
        th = threading.Thread(target=later)
        th.start()
        rep = c.xreadgroup("orders", "c2", {stream: ">"}, count=5, block=5000)
        th.join()
        waited = time.time() - t0
        es2 = entries_of(rep, stream, proto)
        assert len(es2) == 1 and es2[0][1]["user"] == "late", rep
        assert 0.3 < waited < 4, waited
        # BLOCK with nothing coming: nil after the timeout.
        assert not c.xreadgroup("orders", "c2", {stream: ">"}, block=200)

        # Errors as Redis words them.
        for call in (
            lambda: c.xreadgroup("nosuch", "c1", {stream: ">"}),
            lambda: c.xpending(stream, "nosuch"),
            lambda: c.xautoclaim(stream, "nosuch", "c", 0, "0"),
        ):
            try:
                call()
                raise AssertionError("NOGROUP expected")
            except redis.ResponseError as e:
                assert str(e).startswith("NOGROUP No such key"), e
        assert c.xack(stream, "nosuch", "1-0") == 0
        assert c.xgroup_createconsumer(stream, "orders", "c3") == 1
        assert c.xgroup_createconsumer(stream, "orders", "c3") == 0
        assert c.xgroup_delconsumer(stream, "orders", "c2") == 1  # its 1 pending entry
        assert c.xgroup_destroy(ALL, f"all{proto}") == 1
        assert c.xgroup_destroy(ALL, f"all{proto}") == 0

    # Group `persist`: a known state for the restart phase.
    sku = "GRPKEEP"
    stream = "{" + sku + "}:events"
    r.xgroup_create(stream, "persist", id="0")
    workload(sku, 9)  # 1 + 9 + 3 + 1 entries
    a = entries_of(r.xreadgroup("persist", "a", {stream: ">"}, count=5), stream, 2)
    b = entries_of(r.xreadgroup("persist", "b", {stream: ">"}, count=3), stream, 2)
    r.xack(stream, "persist", a[0][0], b[1][0])
    r.xreadgroup("persist", "a", {stream: "0"}, count=1)  # a's oldest pending: 2 deliveries
    state = {
        "last": b[-1][0],
        "pending": [[x["message_id"], x["consumer"], x["times_delivered"]] for x in r.xpending_range(stream, "persist", "-", "+", 100)],
        "rest": [i for i, _ in r.xrange(stream, "(" + b[-1][0], "+")],
    }
    assert len(state["pending"]) == 6 and len(state["rest"]) == 6, state
    print("STATE " + json.dumps(state))
    print("redis-py groups ok")


def check(state):
    sku = "GRPKEEP"
    stream = "{" + sku + "}:events"
    g = [x for x in r.xinfo_groups(stream) if x["name"] == "persist"][0]
    assert g["last-delivered-id"] == state["last"], (g, state)
    got = [[x["message_id"], x["consumer"], x["times_delivered"]] for x in r.xpending_range(stream, "persist", "-", "+", 100)]
    assert got == state["pending"], (got, state["pending"])
    # Reading on delivers exactly what was not delivered before the crash.
    es = entries_of(r.xreadgroup("persist", "a", {stream: ">"}, count=100), stream, 2)
    assert [i for i, _ in es] == state["rest"], (es, state["rest"])
    print("redis-py groups check ok")


if phase == "run":
    run()
else:
    check(json.loads(rest[0]))
