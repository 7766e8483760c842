#!/usr/bin/env bash
# Per-core comparison, one run, every target under the same conditions:
#
#   server under test pinned to one core   (taskset -c $SERVER_CPU, default 1)
#   redis-benchmark pinned to the other    (taskset -c $LOAD_CPU,   default 0)
#
# Targets (each a fresh process):
#   redis-ping        redis-server, PING
#   redis-per-user    redis-server + benches/lua/reserve_per_user.lua (EVALSHA)
#   redis-seed        redis-server + benches/lua/reserve.lua (EVALSHA)
#   sg-t1             stockgate --fsync everysec --threads 1, RESERVE
#   sg-t2             stockgate --fsync everysec --threads 2, RESERVE
#   sg-ping           stockgate --fsync everysec --threads 1, PING
#   sg-repl           sg-t1 as a primary with one replica (on the same core) and
#                     --min-replicas-ack 1: every reply waits for the replica's log
# Points: C=50 P=1, C=1000 P=1, C=50 P=16, $N requests each (default 300,000).
#
# Columns: req/s and p50/p99/p99.9 as redis-benchmark reports them (its percentile
# distribution), and the server's CPU per request: utime+stime of the server process
# (all threads) from /proc/PID/stat before and after the point, divided by requests.
# That last column is the one that survives a noisy shared machine; req/s and latency
# move with whatever else runs on the cores. Ratios are against Redis PING of this run.
#
# RESERVE is driven as in benches/redis_benchmark.sh: ONE minted admission token for ONE
# user, unlimited stock, no per-user limit, random request id per call (a repeated id is
# an idempotent REPLAY), so nearly every call is a new reservation on one shard.
#
# Before/after in one run: BASE_BIN=<older stockgate binary> adds base-t1, base-t2 and
# base-ping (the same three stockgate targets on that binary) to the default targets, so
# both builds meet the same machine load; on a shared machine that matters more than
# anything else (figures move ±20–40 % between runs here, same-run ratios much less).
#
# Usage: benches/pinned.sh [TARGETS...]          (from anywhere; default: all)
# Env:   STOCKGATE_BIN (default target/release/stockgate)  N=300000  POINTS="50:1 1000:1 50:16"
#        BASE_BIN=path  SERVER_CPU=1 LOAD_CPU=0  OUT=file (also write the table there)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SG_BIN=${STOCKGATE_BIN:-$ROOT/target/release/stockgate}
N=${N:-300000}
POINTS=${POINTS:-"50:1 1000:1 50:16"}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
TARGETS=("$@")
BASE_BIN=${BASE_BIN:-}
if [[ ${#TARGETS[@]} -eq 0 ]]; then
  if [[ -n $BASE_BIN ]]; then
    # Interleaved, so slow drifts of the machine's load hit both builds alike.
    TARGETS=(redis-ping redis-per-user redis-seed sg-t1 base-t1 sg-t2 base-t2 sg-ping base-ping)
  else
    TARGETS=(redis-ping redis-per-user redis-seed sg-t1 sg-t2 sg-ping)
  fi
fi
SKU=BENCH
UNITS=1000000000000
HZ=$(getconf CLK_TCK)

for tool in redis-server redis-cli redis-benchmark timeout taskset; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
[[ -x $SG_BIN ]] || { echo "no $SG_BIN: cargo build --release -p stockgate-server --bin stockgate" >&2; exit 2; }
# 1000 clients need 1000 descriptors on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

TMP=$(mktemp -d /tmp/sg-pinned.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
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

cpu_ticks() { # pid -> utime+stime in clock ticks (the comm field may hold spaces: cut after ')')
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

# Runs one point; prints "rps p50 p99 p999 cpu_us_per_req".
point() { # pid port clients pipeline cmd...
  local pid=$1 port=$2 c=$3 p=$4; shift 4
  local t0 t1 out rps p50 p99 p999
  t0=$(cpu_ticks "$pid")
  out=$(timeout 300 taskset -c "$LOAD_CPU" redis-benchmark -h 127.0.0.1 -p "$port" -c "$c" -n "$N" \
        -P "$p" -r 1000000000 "$@" 2>/dev/null | tr '\r' '\n')
  t1=$(cpu_ticks "$pid")
  rps=$(echo "$out" | awk '/throughput summary:/ {print $3}' | tail -n 1)
  # "latency summary (msec):" header, names line, values line: avg min p50 p95 p99 max
  read -r p50 p99 < <(echo "$out" | awk '/latency summary/ {getline; getline; print $3, $5}' | tail -n 1)
  # Percentile distribution lines: "99.900% <= 1.234 milliseconds (cumulative count N)"
  p999=$(echo "$out" | awk '/milliseconds \(cumulative count/ { sub(/%/, "", $1); if ($1 + 0 >= 99.9) { print $3; exit } }')
  awk -v r="${rps:-0}" -v a="${p50:-nan}" -v b="${p99:-nan}" -v c="${p999:-nan}" \
      -v d=$((t1 - t0)) -v hz="$HZ" -v n="$N" \
      'BEGIN { printf "%s %s %s %s %.2f\n", r, a, b, c, d / hz * 1e6 / n }'
}

# `timeout` forks the server: CPU is read from its child, the server itself.
SPID=
server_pid() {
  SPID=
  for _ in $(seq 1 50); do
    SPID=$(pgrep -P "$PID" | head -n 1 || true)
    [[ -n $SPID ]] && return 0
    sleep 0.05
  done
  echo "server process not found under $PID" >&2; return 1
}

start_redis() { # dir -> sets PID PORT
  mkdir -p "$1"
  local attempt
  # A free-looking port can be taken between the probe and the bind (another process,
  # an ephemeral port of the load generator): on a bind failure, try another port.
  for attempt in 1 2 3 4 5; do
    PORT=$(free_port)
    taskset -c "$SERVER_CPU" timeout 3600 redis-server --port "$PORT" --bind 127.0.0.1 --save "" \
      --appendonly no --dir "$1" --daemonize no --logfile "$1/log" --maxclients 10000 &
    PID=$!; PIDS+=("$PID")
    server_pid || true
    for _ in $(seq 1 150); do
      timeout 2 redis-cli -p "$PORT" PING >/dev/null 2>&1 && return 0
      kill -0 "$PID" 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q "Address already in use" "$1/log" 2>/dev/null; then break; fi
    stop "$PID"
  done
  cat "$1/log" >&2; echo "redis did not start" >&2; exit 1
}

start_sg() { # dir threads bin [extra flags...] -> sets PID PORT
  mkdir -p "$1"
  local d=$1 th=$2 b=$3; shift 3
  taskset -c "$SERVER_CPU" timeout 3600 "$b" --bind 127.0.0.1 --port 0 --data-dir "$d/data" \
    --fsync everysec --threads "$th" "$@" >"$d/out" 2>"$d/err" &
  PID=$!; PIDS+=("$PID")
  server_pid || exit 1
  PORT=
  for _ in $(seq 1 150); do
    PORT=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$d/out" | head -n 1)
    [[ -n $PORT ]] && return 0
    kill -0 "$PID" 2>/dev/null || { cat "$d/err" >&2; exit 1; }
    sleep 0.1
  done
  echo "stockgate did not start" >&2; cat "$d/err" >&2; exit 1
}

declare -A RES
run_target() { # name
  local t=$1 dir=$TMP/$1 cmd=() pt c p
  case $t in
    redis-ping|redis-per-user|redis-seed)
      start_redis "$dir"
      local tag="{${SKU}_SHARD_1}"
      timeout 10 redis-cli -p "$PORT" SET "$tag:stock" "$UNITS" >/dev/null
      case $t in
        redis-ping) cmd=(PING) ;;
        redis-per-user)
          local sha
          sha=$(timeout 10 redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$ROOT/benches/lua/reserve_per_user.lua")")
          cmd=(EVALSHA "$sha" 2 "$tag:stock" "$tag:user:u__rand_int__" 1 600 "{$SKU}tok__rand_int__") ;;
        redis-seed)
          local sha expiry
          sha=$(timeout 10 redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$ROOT/benches/lua/reserve.lua")")
          expiry=$(( $(date +%s) + 630 ))
          cmd=(EVALSHA "$sha" 3 "$tag:stock" "$tag:expiry_index" "$tag:reservation:{$SKU}tok__rand_int__"
               "$SKU" bench-user 1 630 "$expiry" "{$SKU}tok__rand_int__") ;;
      esac ;;
    sg-t1|sg-t2|sg-ping|base-t1|base-t2|base-ping|sg-repl)
      local threads=1 bin=$SG_BIN
      [[ $t == *-t2 ]] && threads=2
      if [[ $t == base-* ]]; then
        [[ -x $BASE_BIN ]] || { echo "$t needs BASE_BIN" >&2; exit 2; }
        bin=$BASE_BIN
      fi
      if [[ $t == sg-repl ]]; then
        start_sg "$dir" 1 "$bin" --min-replicas-ack 1
        local ppid=$PID pport=$PORT pspid=$SPID rport
        rport=$(free_port)
        mkdir -p "$dir/replica"
        taskset -c "$SERVER_CPU" timeout 3600 "$bin" --bind 127.0.0.1 --port "$rport" \
          --data-dir "$dir/replica/data" --fsync everysec --threads 1 \
          --secret-file "$dir/data/secret" --reservation-key-file "$dir/data/reservation.key" \
          --replicaof "127.0.0.1:$pport" >"$dir/replica/out" 2>"$dir/replica/err" &
        PIDS+=("$!")
        for _ in $(seq 1 100); do
          timeout 2 redis-cli -p "$pport" INFO replication 2>/dev/null | grep -q '^connected_slaves:1' && break
          sleep 0.1
        done
        PID=$ppid PORT=$pport SPID=$pspid
      else
        start_sg "$dir" "$threads" "$bin"
      fi
      if [[ $t == *-ping ]]; then
        cmd=(PING)
      else
        timeout 10 redis-cli -p "$PORT" SALE.CREATE "$SKU" "$UNITS" >/dev/null
        local token check
        token=$(timeout 10 "$bin" mint-token --data-dir "$dir/data" --sku "$SKU" --user bench-user --ttl-ms 86400000)
        check=$(timeout 10 redis-cli -p "$PORT" RESERVE "$SKU" bench-user "$token" check-1 | head -n 1)
        [[ $check == RESERVED ]] || { echo "RESERVE check failed: $check" >&2; exit 1; }
        cmd=(RESERVE "$SKU" bench-user "$token" "req-__rand_int__")
      fi ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
  for pt in $POINTS; do
    c=${pt%%:*}; p=${pt##*:}
    RES[$t,$pt]=$(point "$SPID" "$PORT" "$c" "$p" "${cmd[@]}")
    echo "$t C=$c P=$p: ${RES[$t,$pt]}" >&2
  done
  stop "$PID"
}

for t in "${TARGETS[@]}"; do run_target "$t"; done

{
  echo "benches/pinned.sh: $N requests per point, server on CPU $SERVER_CPU, redis-benchmark on CPU $LOAD_CPU"
  [[ -n $BASE_BIN ]] && echo "base-*: the same stockgate targets on $BASE_BIN"
  echo "($(nproc) cores, $(redis-server --version | awk '{print $3}'), stockgate $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ))"
  echo
  printf '| %-15s | %-6s | %10s | %7s | %7s | %7s | %10s | %12s |\n' target "C/P" "req/s" "p50 ms" "p99 ms" "p99.9" "CPU µs/req" "CPU vs PING"
  printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' "-----------------" "--------" "-----------:" "--------:" "--------:" "--------:" "-----------:" "-------------:"
  for pt in $POINTS; do
    for t in "${TARGETS[@]}"; do
      read -r rps p50 p99 p999 cpu <<<"${RES[$t,$pt]}"
      ratio="-"
      if [[ -n ${RES[redis-ping,$pt]:-} ]]; then
        base=$(awk '{print $5}' <<<"${RES[redis-ping,$pt]}")
        ratio=$(awk -v a="$cpu" -v b="$base" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
      fi
      printf '| %-15s | %-6s | %10.0f | %7s | %7s | %7s | %10s | %12s |\n' "$t" "${pt/:/\/}" "$rps" "$p50" "$p99" "$p999" "$cpu" "$ratio"
    done
  done
} | tee "${OUT:-/dev/null}"
