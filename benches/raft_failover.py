#!/usr/bin/env python3
"""A stockgate Raft group's failover time under load, through redis-py's Sentinel client at its
default settings (docs/benchmarks.md, "Failover and switchover").

Three members (`--fsync always`) on 127.0.0.1; LOAD threads reserve without pause through
`Sentinel(...).master_for("stockgate")`; the leader is `kill -9`ed ROUNDS times, each time
after the group has run under load for a few seconds with every member up. Measured per kill:
kill -> the first RESERVE acknowledged that was sent after the kill (the client rediscovers
the leader on its own). Also: how many terms each failover took (one is an election won at
the first try), and, over the whole run, elections the kills do not explain.

Usage: python3 benches/raft_failover.py [ROUNDS] [BIN]   (default 12, target/release/stockgate)
Env: LOAD (threads, default 8), RAFT_ARGS (extra flags for every member, e.g.
"--raft-election-min-ms 300 --raft-election-max-ms 600"), QUIET_SECS (a run without faults
first, counting elections, default 0).
"""
import os, shlex, signal, socket, statistics, subprocess, sys, tempfile, threading, time

import redis
from redis.sentinel import Sentinel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
BIN = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/release/stockgate")
LOAD = int(os.environ.get("LOAD", "8"))
EXTRA = shlex.split(os.environ.get("RAFT_ARGS", ""))
QUIET = int(os.environ.get("QUIET_SECS", "0"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


tmp = tempfile.mkdtemp(prefix="sg-failover-")
ids = [1, 2, 3]
ports = {i: free_port() for i in ids}
rports = {i: free_port() for i in ids}
peers = ",".join(f"{i}=127.0.0.1:{ports[i]}/127.0.0.1:{rports[i]}" for i in ids)
procs = {}


def start(i, first=False):
    args = [BIN, "--port", str(ports[i]), "--data-dir", f"{tmp}/n{i}", "--fsync", "always",
            "--raft-id", str(i), "--raft-listen", f"127.0.0.1:{rports[i]}", "--raft-peers", peers,
            "--secret-file", f"{tmp}/secret", "--reservation-key-file", f"{tmp}/reservation.key",
            "--create-keys", *EXTRA]
    if first:
        args.append("--raft-bootstrap")
    log = open(f"{tmp}/n{i}.log", "a")
    procs[i] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log,
                                env={**os.environ, "STOCKGATE_LOG": "info,openraft=warn"})
    for _ in range(200):
        try:
            redis.Redis(port=ports[i], socket_timeout=1).ping()
            return
        except redis.RedisError:
            time.sleep(0.05)
    raise SystemExit(f"member {i} did not start; see {tmp}/n{i}.log")


def info(i):
    try:
        return {k: str(v) for k, v in
                redis.Redis(port=ports[i], socket_timeout=1).info("replication").items()}
    except redis.RedisError:
        return {}


def leader():
    for i in ids:
        if procs.get(i) and procs[i].poll() is None and info(i).get("raft_state") == "leader":
            return i
    return None


def wait(what, cond, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}; logs in {tmp}")


acks = []  # (sent, done) of every acknowledged RESERVE
acks_lock = threading.Lock()
stop = threading.Event()


def buyer(n, token):
    sentinel = Sentinel([("127.0.0.1", ports[i]) for i in ids])
    master = sentinel.master_for("stockgate")
    k = 0
    while not stop.is_set():
        k += 1
        sent = time.time()
        try:
            master.execute_command("RESERVE", "FO", f"u{n}", token, f"r{n}-{k}")
        except redis.RedisError:
            time.sleep(0.005)
            continue
        with acks_lock:
            acks.append((sent, time.time()))


def terms():
    return max(int(info(i).get("raft_term", "0") or 0) for i in ids if procs[i].poll() is None)


try:
    with open(f"{tmp}/secret", "w") as f:
        f.write(f"k1 {os.urandom(32).hex()}\n")
    start(1, first=True)
    for i in ids[1:]:
        start(i)
    wait("a leader", lambda: leader() is not None)
    l = leader()
    r = redis.Redis(port=ports[l], socket_timeout=5)
    r.execute_command("SALE.CREATE", "FO", 10**12)
    token = {}
    for n in range(LOAD):
        token[n] = subprocess.check_output(
            [BIN, "mint-token", "--secret-file", f"{tmp}/secret", "--sku", "FO", "--user", f"u{n}",
             "--ttl-ms", "86400000"], text=True).strip()
    threads = [threading.Thread(target=buyer, args=(n, token[n]), daemon=True) for n in range(LOAD)]
    for t in threads:
        t.start()
    if QUIET:
        t0 = terms()
        time.sleep(QUIET)
        print(f"quiet run: {QUIET} s under load, {terms() - t0} elections, "
              f"{len(acks)} reservations acknowledged")
    times, extra_terms = [], []
    for rnd in range(ROUNDS):
        wait("every member up and following", lambda: leader() is not None and all(
            info(i).get("raft_state") in ("leader", "follower") for i in ids), 60)
        time.sleep(3)
        old = leader()
        before = terms()
        t0 = time.time()
        procs[old].send_signal(signal.SIGKILL)
        procs[old].wait()

        def first_ack():
            with acks_lock:
                after = [done for sent, done in acks if sent > t0]
            return min(after) if after else None

        wait("an acknowledged RESERVE after the kill", lambda: first_ack() is not None, 30)
        ms = int((first_ack() - t0) * 1000)
        times.append(ms)
        extra_terms.append(terms() - before)
        print(f"round {rnd + 1}: killed member {old}: first acknowledged RESERVE after {ms} ms, "
              f"{terms() - before} term(s)", flush=True)
        start(old)
    stop.set()
    if not times:
        raise SystemExit(0)
    s = sorted(times)
    p90 = s[min(len(s) - 1, int(len(s) * 0.9))]
    print(f"raft failover over {len(s)} kills (LOAD={LOAD}, {' '.join(EXTRA) or 'default timings'}): "
          f"median {int(statistics.median(s))} ms, p90 {p90} ms, max {s[-1]} ms; "
          f"{sum(1 for t in extra_terms if t > 1)} took more than one election; "
          f"{len(acks)} reservations acknowledged")
    print(f"times: {times}")
finally:
    stop.set()
    for p in procs.values():
        p.kill()
    if not os.environ.get("KEEP"):
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp}")
