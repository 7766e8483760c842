#!/usr/bin/env bash
# Does the materializer keep up with the P=16 RESERVE benchmark?
#
#   a durable Postgres 15 (default settings: fsync, synchronous_commit, full_page_writes on)
#   stockgate --fsync everysec (release build), one sale with unlimited stock
#   stockgate-materializer --batch $BATCH running against both from the start
#   redis-benchmark -c $C -P $P -n $N RESERVE ... (the P=16 point of benches/pinned.sh:
#     one admission token, random request ids, so nearly every call is a new reservation)
#
# While the load runs and afterwards, the materializer's committed position
# (feed_position.last_lsn) and the feed's end (XINFO STREAM last-generated-id) are sampled
# every 0.5 s. Reported: the RESERVE rate, the orders materialized while the load ran and
# their rate, the lag (log records) when the load stopped, the time to catch up after it,
# the overall materialized rate (first reservation to last order), and the final lag.
# Every reservation must end as exactly one PENDING order (checked).
#
# Usage: scripts/feed-bench.sh        (as root: Postgres runs as the postgres user)
# Env:   N=1000000 C=50 P=16 BATCH=10000  STOCKGATE_BIN / MATERIALIZER_BIN (target/release)
#        PG_BIN=/usr/lib/postgresql/15/bin  SAMPLES=file (write the samples there)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
SG_BIN=${STOCKGATE_BIN:-$ROOT/target/release/stockgate}
MAT_BIN=${MATERIALIZER_BIN:-$ROOT/target/release/stockgate-materializer}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
N=${N:-1000000}
C=${C:-50}
P=${P:-16}
BATCH=${BATCH:-10000}
SKU=FEEDBENCH

for tool in redis-cli redis-benchmark timeout runuser "$PG_BIN/psql" "$SG_BIN" "$MAT_BIN"; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done

TMP=$(mktemp -d /tmp/sg-feedbench.XXXXXX)
chmod 755 "$TMP"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  [[ -f $TMP/pg/postmaster.pid ]] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$TMP/pg" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2; return 1
}
now() { date +%s.%N; }
HZ=$(getconf CLK_TCK)
cpu_ticks() { # pid... -> utime+stime summed, in clock ticks (comm may hold spaces: cut after ')')
  local p t=0
  for p in "$@"; do
    [[ -r /proc/$p/stat ]] && t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}
# This cluster's postmaster and its children only (other clusters may run on the machine).
pg_pids() { local pm; pm=$(head -n 1 "$TMP/pg/postmaster.pid"); echo "$pm $(pgrep -d ' ' -P "$pm" || true)"; }

# Postgres with its default durability: every materializer transaction is fsynced.
PGPORT=$(free_port)
mkdir -p "$TMP/pg" && chown postgres: "$TMP/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$TMP/pg" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$TMP/pg" -w -l "$TMP/pg/log" \
  -o "-p $PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$TMP/pg" start >/dev/null
DB=postgres://postgres@127.0.0.1:$PGPORT/postgres
# The materializer keeps the ledger in schema stockgate (its default --schema).
sql() { PGOPTIONS='-c search_path=stockgate' "$PG_BIN/psql" -qtAX "$DB" -c "$1"; }
echo "postgres: $(sql 'SHOW fsync'), synchronous_commit=$(sql 'SHOW synchronous_commit')" >&2

mkdir -p "$TMP/sg"
timeout 3600 "$SG_BIN" --bind 127.0.0.1 --port 0 --data-dir "$TMP/sg/data" --fsync everysec \
  >"$TMP/sg/out" 2>"$TMP/sg/err" &
SGPID=$!; PIDS+=("$SGPID")
PORT=$(listening_port "$TMP/sg/out" "$TMP/sg/err" 150)
SGSRV=$(pgrep -P "$SGPID" | head -n 1) # `timeout` forks the server: its CPU is the child's
redis-cli -p "$PORT" SALE.CREATE "$SKU" 1000000000000 >/dev/null
TOKEN=$("$SG_BIN" mint-token --data-dir "$TMP/sg/data" --sku "$SKU" --user bench-user --ttl-ms 86400000)

"$MAT_BIN" --database-url "$DB" --server "127.0.0.1:$PORT" --batch "$BATCH" 2>"$TMP/mat.err" &
MATPID=$!; PIDS+=("$MATPID")
for _ in $(seq 1 100); do
  [[ $(sql "SELECT count(*) FROM feed_position" 2>/dev/null || echo 0) == 1 ]] && break
  sleep 0.1
done

feed_end() { redis-cli -p "$PORT" XINFO STREAM stockgate:events | awk 'f {split($0, a, "-"); print a[1]; exit} /^last-generated-id$/ {f=1}'; }
position() { sql "SELECT last_lsn FROM feed_position WHERE consumer = 'materializer'"; }

# Sampler: t position end, every 0.5 s, until told to stop.
SAMPLES_FILE=$TMP/samples
( while [[ ! -f $TMP/stop ]]; do echo "$(now) $(position) $(feed_end)"; sleep 0.5; done ) >"$SAMPLES_FILE" &
SAMPLER=$!; PIDS+=("$SAMPLER")

START_END=$(feed_end)
T0=$(now)
out=$(timeout 600 redis-benchmark -h 127.0.0.1 -p "$PORT" -c "$C" -n "$N" -P "$P" -r 1000000000 \
      RESERVE "$SKU" bench-user "$TOKEN" "req-__rand_int__" 2>/dev/null | tr '\r' '\n')
T1=$(now)
RPS=$(echo "$out" | awk '/throughput summary:/ {print $3}' | tail -n 1)
E1=$(feed_end); P1=$(position)
O1=$(sql "SELECT count(*) FROM orders")
# CPU over the catch-up (the materializer alone on the feed): per order, the figure that
# survives a shared machine's noise.
read -r -a PGP <<<"$(pg_pids)"
C1_MAT=$(cpu_ticks "$MATPID"); C1_SG=$(cpu_ticks "$SGSRV"); C1_PG=$(cpu_ticks "${PGP[@]}")
# Catch up: wait until the position reaches the feed's end.
while [[ $(position) != "$E1" ]]; do
  kill -0 "$MATPID" 2>/dev/null || { cat "$TMP/mat.err" >&2; exit 1; }
  sleep 0.1
done
T2=$(now)
C2_MAT=$(cpu_ticks "$MATPID"); C2_SG=$(cpu_ticks "$SGSRV"); C2_PG=$(cpu_ticks "${PGP[@]}")
touch "$TMP/stop"; wait "$SAMPLER" 2>/dev/null || true
O2=$(sql "SELECT count(*) FROM orders")
RES=$(redis-cli -p "$PORT" SALE.INFO "$SKU" | awk 'f {print; exit} /^reserved$/ {f=1}')
PENDING=$(sql "SELECT count(*) FROM orders WHERE status = 'PENDING' AND sku = '$SKU'")
DUP=$(sql "SELECT count(*) - count(DISTINCT reservation_token) FROM orders")
LAG_FINAL=$(( $(feed_end) - $(position) ))
[[ -n ${SAMPLES:-} ]] && cp "$SAMPLES_FILE" "$SAMPLES"
# The largest lag the sampler saw while the load ran.
LAG_MAX=$(awk -v t0="$T0" -v t1="$T1" '$1 >= t0 && $1 <= t1 && NF == 3 && $3 - $2 > m {m = $3 - $2} END {print m + 0}' "$SAMPLES_FILE")

awk -v n="$N" -v c="$C" -v p="$P" -v b="$BATCH" -v rps="$RPS" -v t0="$T0" -v t1="$T1" -v t2="$T2" \
    -v o1="$O1" -v o2="$O2" -v e1="$E1" -v p1="$P1" -v s0="$START_END" -v res="${RES:-?}" \
    -v pend="$PENDING" -v dup="$DUP" -v lf="$LAG_FINAL" -v lm="$LAG_MAX" -v hz="$HZ" \
    -v cm=$((C2_MAT - C1_MAT)) -v cs=$((C2_SG - C1_SG)) -v cp=$((C2_PG - C1_PG)) 'BEGIN {
  printf "RESERVE C=%d P=%d: %d requests in %.2f s, %s req/s (redis-benchmark), %d reservations\n", c, p, n, t1 - t0, rps, res
  printf "materializer --batch %d, durable Postgres:\n", b
  printf "  while the load ran: %d orders in %.2f s = %.0f orders/s; lag when it stopped: %d records (largest sampled: %d)\n", o1, t1 - t0, o1 / (t1 - t0), e1 - p1, lm
  printf "  catching up after it: %d orders in %.2f s = %.0f orders/s\n", o2 - o1, t2 - t1, (o2 - o1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9)
  k = (o2 - o1 > 0 ? o2 - o1 : 1) / 1e6 * hz
  if (o2 > o1) printf "  CPU per order while catching up: materializer %.1f us, postgres %.1f us, stockgate %.1f us\n", cm / k, cp / k, cs / k
  printf "  overall: %d orders in %.2f s = %.0f orders/s; final lag %d records\n", o2, t2 - t0, o2 / (t2 - t0), lf
  printf "  check: %d PENDING orders for %s reservations, %d duplicate tokens\n", pend, res, dup
}'
[[ $PENDING == "$RES" && $DUP == 0 && $LAG_FINAL == 0 ]] || { echo "CHECK FAILED" >&2; exit 1; }
