#!/usr/bin/env bash
# What the metrics cost on RESERVE, end to end: the same redis-benchmark RESERVE load
# against a server built without them (BEFORE) and with them (AFTER), alternating
# BEFORE/AFTER $RUNS times in one session, at P=1 and P=16. Reports requests/s and the
# server's CPU time per request (utime+stime from /proc, the figure that survives a noisy
# 2-core machine), median of the runs. The server is pinned to core 1 and redis-benchmark
# to core 0 (ENVIRONMENT.md). Everything runs under `timeout`, on 127.0.0.1, and every
# process started here is stopped here.
#
# Usage: BEFORE=/path/to/stockgate AFTER=target/release/stockgate benches/metrics_overhead.sh
# Env:   RUNS=3 CLIENTS=50 N=200000 (P=1) NP=400000 (P=16) FSYNC=no
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BEFORE=${BEFORE:?set BEFORE to the binary without metrics}
AFTER=${AFTER:-$ROOT/target/release/stockgate}
RUNS=${RUNS:-3}
CLIENTS=${CLIENTS:-50}
N=${N:-200000}
NP=${NP:-400000}
FSYNC=${FSYNC:-no}
TMP=$(mktemp -d /tmp/sg-overhead.XXXXXX)
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# run BIN P N -> "rps cpu_us_per_request"
run() {
  local bin=$1 p=$2 n=$3 dir="$TMP/d$RANDOM"
  mkdir -p "$dir"
  taskset -c 1 "$bin" --port 0 --data-dir "$dir" --fsync "$FSYNC" \
    >"$dir/out" 2>"$dir/err" &
  PID=$!
  for _ in $(seq 100); do grep -q "listening on" "$dir/out" 2>/dev/null && break; sleep 0.05; done
  local port
  port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$dir/out")
  timeout 10 redis-cli -p "$port" SALE.CREATE BENCH 1000000000000 >/dev/null
  local tok
  tok=$(timeout 10 "$bin" mint-token --data-dir "$dir" --sku BENCH --user bench-user --ttl-ms 3600000)
  local t0 t1 rps
  t0=$(ticks "$PID")
  rps=$(timeout 300 taskset -c 0 redis-benchmark -p "$port" -c "$CLIENTS" -P "$p" -n "$n" \
    -r 1000000000 --csv RESERVE BENCH bench-user "$tok" req-__rand_int__ |
    awk -F'","' 'NR==2 {gsub(/"/,"",$2); print $2}')
  t1=$(ticks "$PID")
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
  rm -rf "$dir"
  awk -v r="$rps" -v d=$((t1 - t0)) -v hz="$HZ" -v n="$n" \
    'BEGIN {printf "%.0f %.2f\n", r, d / hz * 1e6 / n}'
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for p in 1 16; do
  n=$N; [ "$p" = 16 ] && n=$NP
  : >"$TMP/before.$p"; : >"$TMP/after.$p"
  for i in $(seq "$RUNS"); do
    run "$BEFORE" "$p" "$n" >>"$TMP/before.$p"
    run "$AFTER" "$p" "$n" >>"$TMP/after.$p"
  done
  for side in before after; do
    rps=$(awk '{print $1}' "$TMP/$side.$p" | median)
    cpu=$(awk '{print $2}' "$TMP/$side.$p" | median)
    echo "P=$p $side: ${rps} req/s, ${cpu} µs server CPU per RESERVE (runs: $(awk '{printf "%s/%s ", $1, $2}' "$TMP/$side.$p"))"
  done
done
