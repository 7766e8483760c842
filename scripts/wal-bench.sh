#!/usr/bin/env bash
# Durability numbers for stockgate's write-ahead log, next to Redis + Lua.
#
#   scripts/wal-bench.sh            # builds the release binary if missing, prints a report
#
# 1. RESERVE throughput and p99 with redis-benchmark (50 clients, pipeline 1 and 16) under
#    --fsync always / everysec / no; the baseline Lua reserve script (docs/design.md, "The
#    baseline we measure against") on redis-server with appendonly yes and appendfsync
#    everysec / always, same load.
# 2. Recovery: a log of ~1,000,000 reservations, kill -9, time until `listening on`, with
#    no snapshot and after SAVE; WAL bytes per reservation, snapshot bytes per reservation,
#    server RSS per reservation.
#
# Environment: BIN (stockgate binary, default target/release/stockgate), N (requests per
# run, default 200000), REPEAT (runs per configuration, median reported, default 3),
# RECOVERY_N (reservations for part 2, default 1000000), SKIP_THROUGHPUT=1, SKIP_RECOVERY=1, SKIP_STOCKGATE=1 (throughput
# of Redis only), REDIS_MODES (default "everysec always"; "off" = no AOF).
# Every process it starts is wrapped in `timeout` and killed by its PID on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/stockgate}
N=${N:-200000}
REPEAT=${REPEAT:-3}
RECOVERY_N=${RECOVERY_N:-1000000}
CLIENTS=50
TMP=$(mktemp -d /tmp/wal-bench.XXXXXX)
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do
        kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

for t in redis-benchmark redis-server redis-cli; do
    command -v "$t" >/dev/null || { echo "missing $t (apt-get install redis-tools redis-server)" >&2; exit 1; }
done
if [ ! -x "$BIN" ]; then
    timeout 1800 cargo build --release -p stockgate-server --bin stockgate
fi

log() { echo "# $*" >&2; }

# start_stockgate DIR ARGS... -> sets SG_PID, SG_PORT; SG_START_MS = ms until `listening on`.
start_stockgate() {
    local dir=$1
    shift
    local out="$TMP/sg.out.$RANDOM"
    : >"$out"
    local t0
    t0=$(date +%s%N)
    STOCKGATE_LOG=${STOCKGATE_LOG:-info} timeout 3600 "$BIN" --port 0 --data-dir "$dir" "$@" \
        >"$out" 2>>"$TMP/sg.err" &
    # $! is `timeout`; SG_PID is stockgate itself (kill -9 must reach the server).
    SG_TIMEOUT_PID=$!
    PIDS+=("$SG_TIMEOUT_PID")
    SG_PID=""
    local i
    for i in $(seq 1 1000); do
        SG_PID=$(pgrep -P "$SG_TIMEOUT_PID" || true)
        [ -n "$SG_PID" ] && break
        sleep 0.001
    done
    PIDS+=("$SG_PID")
    for i in $(seq 1 60000); do
        if grep -q "^listening on" "$out" 2>/dev/null; then
            break
        fi
        if ! kill -0 "$SG_PID" 2>/dev/null; then
            echo "stockgate exited; stderr:" >&2
            tail -20 "$TMP/sg.err" >&2
            exit 1
        fi
        sleep 0.002
    done
    SG_START_MS=$((($(date +%s%N) - t0) / 1000000))
    SG_PORT=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out")
}

kill9() {
    kill -9 "$SG_PID" 2>/dev/null || true
    wait "$SG_TIMEOUT_PID" 2>/dev/null || true
}

stop_term() {
    kill -TERM "$SG_PID" 2>/dev/null || true
    wait "$SG_TIMEOUT_PID" 2>/dev/null || true
}

# bench PORT PIPELINE ARGS... -> "rps p99_ms" (median rps of REPEAT runs, with its p99)
bench_once() {
    local port=$1 pipe=$2
    shift 2
    timeout 600 redis-benchmark -p "$port" -c "$CLIENTS" -n "$N" -P "$pipe" -r 100000000 --csv "$@" |
        tail -1 | tr -d '"' | awk -F, '{print $2, $7}'
}

median_run() {
    local runs=()
    local i
    for i in $(seq 1 "$REPEAT"); do
        runs+=("$(bench_once "$@")")
    done
    printf '%s\n' "${runs[@]}" | sort -n -k1 | awk -v n="${#runs[@]}" 'NR == int((n + 1) / 2)'
}

# Sum of file sizes (du counts directory blocks too).
dir_bytes() {
    find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

LUA_RESERVE='
-- KEYS: stock, expiry index, reservation key (one hash tag)
-- ARGV: sku, user, shard, ttl seconds, expiry epoch seconds, reservation token
if redis.call("EXISTS", KEYS[3]) == 1 then return 2 end
local stock = tonumber(redis.call("GET", KEYS[1]))
if stock and stock > 0 then
  redis.call("DECR", KEYS[1])
  redis.call("HSET", KEYS[3], "sku", ARGV[1], "user", ARGV[2], "shard", ARGV[3],
             "qty", 1, "status", "RESERVED", "expiry", ARGV[5])
  redis.call("EXPIRE", KEYS[3], 86400)
  redis.call("ZADD", KEYS[2], ARGV[5], ARGV[6])
  return 1
end
return 0
'

echo "== machine: $(nproc) cores; $(uptime)"
echo "== stockgate: $BIN ($(stat -c %y "$BIN" | cut -d. -f1)); $(redis-server --version | cut -d' ' -f1-3)"
echo "== load: redis-benchmark -c $CLIENTS -n $N -r 100000000, median of $REPEAT"

if [ "${SKIP_THROUGHPUT:-0}" != 1 ]; then
    printf '%-44s %6s %12s %10s\n' "target" "pipe" "req/s" "p99 ms"
    for fsync in ${SG_MODES:-always everysec no}; do
        [ "${SKIP_STOCKGATE:-0}" = 1 ] && break
        dir="$TMP/sg-$fsync"
        start_stockgate "$dir" --fsync "$fsync"
        timeout 10 redis-cli -p "$SG_PORT" SALE.CREATE BIG 1000000000 >/dev/null
        tok=$(timeout 10 "$BIN" mint-token --data-dir "$dir" --sku BIG --user u1 --ttl-ms 3600000)
        for pipe in 1 16; do
            read -r rps p99 < <(median_run "$SG_PORT" "$pipe" RESERVE BIG u1 "$tok" 'req__rand_int__')
            printf '%-44s %6s %12s %10s\n' "stockgate --fsync $fsync (RESERVE)" "$pipe" "$rps" "$p99"
        done
        # Sanity: the load really reserved (a DENIED token would be fast and wrong).
        echo "   stockgate $fsync: $(timeout 10 redis-cli -p "$SG_PORT" DBSIZE) reservations, $(dir_bytes "$dir/wal") WAL bytes"
        stop_term
        rm -rf "$dir"
    done
    # Automatic AOF rewrites are off (a fork + rewrite at 64 MB would land in the middle
    # of a run; stockgate's automatic snapshot, every 2M records, does not trigger either).
    # REDIS_MODES=off adds a run without AOF, for calibration against docs/design.md's numbers.
    for fsync in ${REDIS_MODES:-everysec always}; do
        dir="$TMP/redis-$fsync"
        mkdir -p "$dir"
        port=$(free_port)
        if [ "$fsync" = off ]; then
            aof=(--appendonly no)
        else
            aof=(--appendonly yes --appendfsync "$fsync" --auto-aof-rewrite-percentage 0)
        fi
        timeout 3600 redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' \
            "${aof[@]}" --daemonize no --logfile "$dir/log" &
        rpid=$!
        PIDS+=("$rpid")
        for _ in $(seq 1 500); do
            timeout 2 redis-cli -p "$port" PING >/dev/null 2>&1 && break
            sleep 0.01
        done
        sha=$(timeout 10 redis-cli -p "$port" SCRIPT LOAD "$LUA_RESERVE")
        timeout 10 redis-cli -p "$port" SET '{BIG_SHARD_1}:stock' 1000000000 >/dev/null
        exp=$(($(date +%s) + 630))
        for pipe in 1 16; do
            read -r rps p99 < <(median_run "$port" "$pipe" EVALSHA "$sha" 3 \
                '{BIG_SHARD_1}:stock' '{BIG_SHARD_1}:expiry_index' '{BIG_SHARD_1}:reservation:__rand_int__' \
                BIG u1 1 630 "$exp" 'tok__rand_int__')
            printf '%-44s %6s %12s %10s\n' "redis appendfsync $fsync (Lua reserve)" "$pipe" "$rps" "$p99"
        done
        mem=$(timeout 10 redis-cli -p "$port" INFO memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p')
        keys=$(timeout 10 redis-cli -p "$port" DBSIZE)
        aof=$(dir_bytes "$dir")
        echo "   redis $fsync: $keys keys, used_memory $mem B, appendonly dir $aof B"
        kill -TERM "$rpid" 2>/dev/null || true
        wait "$rpid" 2>/dev/null || true
        rm -rf "$dir"
    done
fi

if [ "${SKIP_RECOVERY:-0}" != 1 ]; then
    dir="$TMP/sg-recovery"
    start_stockgate "$dir" --fsync everysec
    timeout 10 redis-cli -p "$SG_PORT" SALE.CREATE BIG 1000000000 >/dev/null
    tok=$(timeout 10 "$BIN" mint-token --data-dir "$dir" --sku BIG --user u1 --ttl-ms 3600000)
    t0=$(date +%s%N)
    # Request ids from a 1e9 keyspace (redis-benchmark's -r is an int): ~0.05% of 1e6
    # draws collide and are REPLAYs; DBSIZE gives the exact count.
    timeout 1200 redis-benchmark -p "$SG_PORT" -c "$CLIENTS" -n "$RECOVERY_N" -P 64 -r 1000000000 -q \
        RESERVE BIG u1 "$tok" 'req__rand_int__' >/dev/null
    fill_ms=$((($(date +%s%N) - t0) / 1000000))
    count=$(timeout 10 redis-cli -p "$SG_PORT" DBSIZE)
    rss_kb=$(ps -o rss= -p "$SG_PID" | tr -d ' ')
    kill9
    wal_bytes=$(dir_bytes "$dir/wal")
    echo "== recovery: $count reservations written in $fill_ms ms (redis-benchmark -P 64)"
    echo "   WAL: $wal_bytes bytes = $((wal_bytes / count)) bytes/reservation; server RSS ${rss_kb} kB = $((rss_kb * 1024 / count)) bytes/reservation"

    : >"$TMP/sg.err"
    start_stockgate "$dir" --fsync everysec
    echo "   restart, no snapshot (replay $count records): ${SG_START_MS} ms to 'listening on'; server says: $(grep -o 'recovered .*' "$TMP/sg.err" | tail -1)"
    test "$(timeout 10 redis-cli -p "$SG_PORT" DBSIZE)" = "$count"
    t0=$(date +%s%N)
    timeout 600 redis-cli -p "$SG_PORT" SAVE >/dev/null
    save_ms=$((($(date +%s%N) - t0) / 1000000))
    snap_bytes=$(cat "$dir"/wal/snapshot-*.snap | wc -c)
    kill9
    echo "   SAVE: $save_ms ms; snapshot $snap_bytes bytes = $((snap_bytes / count)) bytes/reservation; wal dir after SAVE: $(dir_bytes "$dir/wal") bytes"
    : >"$TMP/sg.err"
    start_stockgate "$dir" --fsync everysec
    echo "   restart from snapshot: ${SG_START_MS} ms to 'listening on'; server says: $(grep -o 'recovered .*' "$TMP/sg.err" | tail -1)"
    test "$(timeout 10 redis-cli -p "$SG_PORT" DBSIZE)" = "$count"
    stop_term
fi
