#!/usr/bin/env python3
"""Redis's own failover time, to compare with a stockgate Raft group's (docs/benchmarks.md): three redis-server 7 (one master, two replicas) and three redis-sentinel with
down-after-milliseconds 1000, failover-timeout 6000, parallel-syncs 2; the master is
kill -9ed ROUNDS times (restarted each time; Sentinel makes it a replica); measured: kill
-> first write (SET) acknowledged by the new master, found by polling the Sentinels as the
Rust test does. Usage: python3 benches/redis_failover.py [ROUNDS]  (default 5)."""
import os, shutil, signal, socket, subprocess, sys, tempfile, time

import redis

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


tmp = tempfile.mkdtemp(prefix="redis-failover-")
procs = {}


def start_redis(port, replicaof=None):
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", tmp, "--dbfilename", f"dump-{port}.rdb",
            "--logfile", f"{tmp}/redis-{port}.log"]
    if replicaof:
        args += ["--replicaof", "127.0.0.1", str(replicaof)]
    procs[port] = subprocess.Popen(args)
    for _ in range(100):
        try:
            redis.Redis(port=port, socket_timeout=1).ping()
            return
        except redis.RedisError:
            time.sleep(0.05)
    raise SystemExit(f"redis {port} did not start")


def primary(sentinels):
    votes = {}
    for p in sentinels:
        try:
            host, port = redis.Redis(port=p, socket_timeout=0.5).execute_command(
                "SENTINEL", "get-master-addr-by-name", "m")
            votes[int(port)] = votes.get(int(port), 0) + 1
        except (redis.RedisError, TypeError, ValueError):
            pass
    best = [p for p, n in votes.items() if n >= 2]
    return best[0] if best else None


try:
    ports = [free_port() for _ in range(3)]
    start_redis(ports[0])
    for p in ports[1:]:
        start_redis(p, ports[0])
    sentinels = []
    for i in range(3):
        sp = free_port()
        conf = f"{tmp}/sentinel-{i}.conf"
        with open(conf, "w") as f:
            f.write(f"port {sp}\nbind 127.0.0.1\ndir {tmp}\nlogfile {tmp}/sentinel-{i}.log\n"
                    f"sentinel monitor m 127.0.0.1 {ports[0]} 2\n"
                    "sentinel down-after-milliseconds m 1000\nsentinel failover-timeout m 6000\n"
                    "sentinel parallel-syncs m 2\n")
        procs[sp] = subprocess.Popen(["redis-sentinel", conf])
        sentinels.append(sp)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if all(len(redis.Redis(port=s, socket_timeout=0.5).execute_command("SENTINEL", "replicas", "m")) == 2
                   and len(redis.Redis(port=s, socket_timeout=0.5).execute_command("SENTINEL", "sentinels", "m")) == 2
                   for s in sentinels):
                break
        except redis.RedisError:
            pass
        time.sleep(0.2)
    times = []
    for r in range(ROUNDS):
        time.sleep(2.5)
        old = primary(sentinels)
        procs[old].send_signal(signal.SIGKILL)
        procs[old].wait()
        t = time.time()
        while time.time() - t < 30:
            p = primary(sentinels)
            if p and p != old:
                try:
                    redis.Redis(port=p, socket_timeout=0.5).set(f"probe{r}", "1")
                    break
                except redis.RedisError:
                    pass
            time.sleep(0.02)
        times.append(int((time.time() - t) * 1000))
        start_redis(old)  # comes back as a master; Sentinel converts it
        deadline = time.time() + 40
        while time.time() < deadline:
            try:
                info = redis.Redis(port=old, socket_timeout=0.5).info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    break
            except redis.RedisError:
                pass
            time.sleep(0.2)
    print(f"redis failover: kill -> first write on the new master: {times} ms")
finally:
    for p in procs.values():
        p.kill()
    shutil.rmtree(tmp, ignore_errors=True)
