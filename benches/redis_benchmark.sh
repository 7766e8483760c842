#!/usr/bin/env bash
# The headline comparison with a tool nobody here wrote: redis-benchmark.
#
#   RESERVE on stockgate            vs   EVALSHA of benches/lua/reserve.lua on redis-server
#   PING on stockgate               vs   PING on redis-server
#
# at 50 clients, without pipelining and with pipeline 16, median of $RUNS runs.
# It starts every server itself on 127.0.0.1 (stockgate on a free port, redis on a
# probed free port), stops them at the end (also on Ctrl-C or error) and removes its
# temp dir. Every external command runs under `timeout`.
#
# Admission tokens: redis-benchmark can only substitute __rand_int__ (independently
# for each occurrence), so it cannot pair a random user with that user's signed token.
# The script therefore mints ONE admission token for ONE user (`bench-user`) and
# creates the sale with no per-user limit (LIMIT 0, the default) and unlimited stock;
# the request id is random (`req-__rand_int__`, from 10^9 values), so almost every call
# is a new reservation (a repeated id is an idempotent REPLAY: it takes nothing).
# One user means every reservation lands on that user's home shard: the worst case for
# stockgate's sharding, not the best.
#
# The Redis side sets its single stock key to the same unlimited stock and calls the
# baseline script with a random reservation token per call.
#
# Usage: benches/redis_benchmark.sh            (from the repository root)
# Env:   STOCKGATE_BIN (default target/release/stockgate; built if missing)
#        RUNS=3  CLIENTS=50  N=200000 (requests per P=1 test)  NP=500000 (per P=16 test)
#        SG_FSYNC="no everysec"   REDIS_MODES="none aof"
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SG_BIN=${STOCKGATE_BIN:-$ROOT/target/release/stockgate}
RUNS=${RUNS:-3}
CLIENTS=${CLIENTS:-50}
N=${N:-200000}
NP=${NP:-500000}
SG_FSYNC=${SG_FSYNC:-"no everysec"}
REDIS_MODES=${REDIS_MODES:-"none aof"}
SKU=BENCH
UNITS=1000000000000

for tool in redis-server redis-cli redis-benchmark timeout; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y redis-server redis-tools)" >&2; exit 2; }
done
if [[ ! -x $SG_BIN ]]; then
  echo "building stockgate (cargo build --release -p stockgate-server)..." >&2
  (cd "$ROOT" && timeout 1800 cargo build --release -p stockgate-server --bin stockgate) >&2
fi

TMP=$(mktemp -d /tmp/sg-redis-benchmark.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop() { # pid
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2; return 1
}

# One redis-benchmark run; prints "rps p50_ms p99_ms".
bench_once() { # port pipeline requests cmd...
  local port=$1 pipe=$2 n=$3; shift 3
  local out
  out=$(timeout 300 redis-benchmark -h 127.0.0.1 -p "$port" -c "$CLIENTS" -n "$n" -P "$pipe" \
        -r 1000000000 --csv "$@" 2>/dev/null | tail -n 1)
  # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  echo "$out" | awk -F, '{gsub(/"/, ""); print $2, $5, $7}'
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# Median of $RUNS runs; appends a table row.
ROWS=()
measure() { # label port pipeline requests cmd...
  local label=$1 port=$2 pipe=$3 n=$4; shift 4
  local rps=() p50=() p99=() r
  for _ in $(seq 1 "$RUNS"); do
    read -r a b c < <(bench_once "$port" "$pipe" "$n" "$@")
    rps+=("$a"); p50+=("$b"); p99+=("$c")
  done
  r=$(printf '%s\n' "${rps[@]}" | median)
  ROWS+=("$(printf '| %-30s | %-8s | %2s | %10.0f | %7s | %7s |' "$label" "$1" "$pipe" "$r" \
    "$(printf '%s\n' "${p50[@]}" | median)" "$(printf '%s\n' "${p99[@]}" | median)")")
  echo "${ROWS[-1]}" >&2
}

for mode in $SG_FSYNC; do
  dir=$TMP/sg-$mode
  mkdir -p "$dir"
  timeout 3600 "$SG_BIN" --bind 127.0.0.1 --port 0 --data-dir "$dir/data" --fsync "$mode" \
    >"$dir/out" 2>"$dir/err" &
  pid=$!; PIDS+=("$pid")
  port=
  for _ in $(seq 1 150); do
    port=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$dir/out" | head -n 1)
    [[ -n $port ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/err" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n $port ]] || { echo "stockgate did not start" >&2; cat "$dir/err" >&2; exit 1; }
  timeout 10 redis-cli -p "$port" SALE.CREATE "$SKU" "$UNITS" >/dev/null
  token=$(timeout 10 "$SG_BIN" mint-token --data-dir "$dir/data" --sku "$SKU" --user bench-user --ttl-ms 86400000)
  check=$(timeout 10 redis-cli -p "$port" RESERVE "$SKU" bench-user "$token" check-1 | head -n 1)
  [[ $check == RESERVED ]] || { echo "RESERVE check failed: $check" >&2; exit 1; }
  for pipe in 1 16; do
    n=$N; [[ $pipe -gt 1 ]] && n=$NP
    measure "stockgate --fsync $mode" "$port" "$pipe" "$n" RESERVE "$SKU" bench-user "$token" "req-__rand_int__"
  done
  for pipe in 1 16; do
    n=$N; [[ $pipe -gt 1 ]] && n=$((NP * 4))
    measure "stockgate --fsync $mode" "$port" "$pipe" "$n" PING
  done
  stop "$pid"
done

for mode in $REDIS_MODES; do
  dir=$TMP/redis-$mode
  mkdir -p "$dir"
  port=$(free_port)
  persist=(--appendonly no)
  [[ $mode == aof ]] && persist=(--appendonly yes --appendfsync everysec)
  timeout 3600 redis-server --port "$port" --bind 127.0.0.1 --save "" --dir "$dir" \
    --daemonize no --logfile "$dir/log" "${persist[@]}" &
  pid=$!; PIDS+=("$pid")
  for _ in $(seq 1 150); do
    timeout 2 redis-cli -p "$port" PING >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
    sleep 0.1
  done
  sha=$(timeout 10 redis-cli -p "$port" SCRIPT LOAD "$(cat "$ROOT/benches/lua/reserve.lua")")
  tag="{${SKU}_SHARD_1}"
  timeout 10 redis-cli -p "$port" SET "$tag:stock" "$UNITS" >/dev/null
  expiry=$(( $(date +%s) + 630 ))
  label="redis-server (no persistence)"
  [[ $mode == aof ]] && label="redis-server (AOF everysec)"
  for pipe in 1 16; do
    n=$N; [[ $pipe -gt 1 ]] && n=$NP
    measure "$label" "$port" "$pipe" "$n" EVALSHA "$sha" 3 "$tag:stock" "$tag:expiry_index" \
      "$tag:reservation:{$SKU}tok__rand_int__" "$SKU" bench-user 1 630 "$expiry" "{$SKU}tok__rand_int__"
  done
  for pipe in 1 16; do
    n=$N; [[ $pipe -gt 1 ]] && n=$((NP * 4))
    measure "$label" "$port" "$pipe" "$n" PING
  done
  stop "$pid"
done

echo
echo "redis-benchmark -c $CLIENTS, median of $RUNS runs ($(nproc) cores, $(redis-server --version | awk '{print $3}'))"
echo
printf '| %-30s | %-8s | %2s | %10s | %7s | %7s |\n' server command P "req/s" "p50 ms" "p99 ms"
printf '|%s|%s|%s|%s|%s|%s|\n' "--------------------------------" "----------" "---:" "-----------:" "--------:" "--------:"
printf '%s\n' "${ROWS[@]}"
