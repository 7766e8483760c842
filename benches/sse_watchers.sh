#!/usr/bin/env bash
# Many browsers watching one sale's live counts over Server-Sent Events, on one core:
#
#   server pinned to one core        (taskset -c $SERVER_CPU, default 1)
#   the watchers pinned to the other (taskset -c $LOAD_CPU,   default 0)
#
# W watchers (default 10,000) open GET /sale/BENCH/events on the server's HTTP endpoint;
# then, for the same time, nothing changes (what idle watchers cost), then CHANGES
# reservations are made EVERY_MS apart. Reported (stockgate-bench sse, benches/loadgen/
# src/sse.rs): the delay from sending each RESERVE to each watcher's event showing it
# (p50, p99, max), the server's CPU while idle and while changing, the CPU per change (one
# event to every watcher), and the server's resident memory per watcher.
# Exits 1 if any delivery took over 200 ms.
#
# Usage: benches/sse_watchers.sh [W] [CHANGES]
# Env:   STOCKGATE_BIN (default target/release/stockgate), STOCKGATE_BENCH_BIN (default:
#        stockgate-bench beside it), SERVER_CPU=1 LOAD_CPU=0 EVERY_MS=300
#        (cargo build --release -p stockgate-server --bin stockgate --bin stockgate-bench)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
SG_BIN=${STOCKGATE_BIN:-$ROOT/target/release/stockgate}
LG_BIN=${STOCKGATE_BENCH_BIN:-$(dirname "$SG_BIN")/stockgate-bench}
W=${1:-10000}
CHANGES=${2:-50}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
EVERY_MS=${EVERY_MS:-300}
for b in "$SG_BIN" "$LG_BIN"; do
  [[ -x $b ]] || { echo "no $b: cargo build --release --bin stockgate --bin stockgate-bench" >&2; exit 2; }
done
# Each watcher is a socket on both sides.
ulimit -n "$(ulimit -Hn)"
(( $(ulimit -n) > W + 100 )) || { echo "ulimit -n $(ulimit -n) is too low for $W watchers" >&2; exit 2; }

D=$(mktemp -d /tmp/sg-sse.XXXXXX)
SP=
cleanup() {
  [[ -n $SP ]] && kill -TERM "$SP" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT

HTTP_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c "$SERVER_CPU" "$SG_BIN" --bind 127.0.0.1 --port 0 --data-dir "$D/data" \
  --fsync everysec --threads 1 --metrics-addr "127.0.0.1:$HTTP_PORT" >"$D/out" 2>"$D/err" &
SP=$!
PORT=$(listening_port "$D/out" "$D/err")
timeout 30 redis-cli -p "$PORT" SALE.CREATE BENCH 1000000000 >/dev/null
TOKEN=$(timeout 30 "$SG_BIN" mint-token --data-dir "$D/data" --sku BENCH --user bench-user --ttl-ms 86400000)
echo "benches/sse_watchers.sh: $W watchers, $CHANGES changes ${EVERY_MS} ms apart; server on CPU $SERVER_CPU, watchers on CPU $LOAD_CPU"
echo "($(nproc) cores, stockgate $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ))"
taskset -c "$LOAD_CPU" "$LG_BIN" sse --http "127.0.0.1:$HTTP_PORT" --resp "127.0.0.1:$PORT" \
  --sku BENCH --user bench-user --token "$TOKEN" --watchers "$W" --changes "$CHANGES" \
  --every-ms "$EVERY_MS" --server-pid "$SP"
