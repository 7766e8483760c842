#!/usr/bin/env bash
# How many orders per second can the ledger itself take on this machine?
#
# The ceiling any materializer meets, whatever it does: a durable Postgres 15 (default
# settings) with the ledger's schema (migrations/*.sql), and nothing else running — no
# stockgate, no materializer, no load generator. Each transaction inserts $BATCH PENDING
# orders with their `order_events` audit rows, with the materializer's own statement
# (`ledger/src/materialize.rs`: INSERT ... ON CONFLICT DO NOTHING RETURNING, then the audit
# rows), the rows generated inside Postgres (generate_series, md5 for the tokens) so no
# client cost is counted. Run with 1 and with $SESSIONS concurrent sessions (disjoint
# tokens): Postgres then has every core to itself.
#
# Reported: orders/s and Postgres CPU (all its processes, /proc) per order.
#
# Usage: scripts/pg-ceiling.sh        (as root: Postgres runs as the postgres user)
# Env:   ORDERS=200000 BATCH=10000 SESSIONS=2 PG_BIN=/usr/lib/postgresql/15/bin
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
ORDERS=${ORDERS:-200000}
BATCH=${BATCH:-10000}
SESSIONS=${SESSIONS:-2}
HZ=$(getconf CLK_TCK)

TMP=$(mktemp -d /tmp/sg-pgceiling.XXXXXX)
chmod 755 "$TMP"
cleanup() {
  [[ -f $TMP/pg/postmaster.pid ]] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$TMP/pg" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PGPORT=$((20000 + RANDOM % 40000))
mkdir -p "$TMP/pg" && chown postgres: "$TMP/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$TMP/pg" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$TMP/pg" -w -l "$TMP/pg/log" \
  -o "-p $PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$TMP/pg" start >/dev/null
DB=postgres://postgres@127.0.0.1:$PGPORT/postgres
for f in "$ROOT"/migrations/*.sql; do "$PG_BIN/psql" -qtAX -v ON_ERROR_STOP=1 "$DB" -f "$f" >/dev/null; done

# utime+stime of the postmaster and its live children, plus cutime+cstime of the
# postmaster (the backends of finished sessions, reaped by it).
pg_ticks() {
  local pm t=0 p
  pm=$(head -n 1 "$TMP/pg/postmaster.pid")
  t=$(sed 's/^.*) //' "/proc/$pm/stat" | awk '{print $12 + $13 + $14 + $15}')
  for p in $(pgrep -P "$pm" || true); do
    [[ -r /proc/$p/stat ]] && t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}

# One session: orders [from, from + n) in transactions of $BATCH.
session() { # tag from n
  local tag=$1 from=$2 n=$3 a b
  for ((a = from; a < from + n; a += BATCH)); do
    b=$((a + BATCH - 1))
    echo "BEGIN;
WITH ins AS (
  INSERT INTO orders (reservation_token, sku, user_id, request_id, qty, status,
                      reservation_expires_at, reservation_created_at)
  SELECT '{FEEDBENCH}$tag' || md5(g::text), 'FEEDBENCH', 'bench-user', 'req-' || g, 1, 'PENDING',
         to_timestamp((extract(epoch FROM now()) * 1000 + 600000) / 1000.0::float8),
         to_timestamp(extract(epoch FROM now()))
  FROM generate_series($a, $b) AS g
  ORDER BY 1
  ON CONFLICT (reservation_token) DO NOTHING
  RETURNING reservation_token
), ev AS (
  INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
  SELECT reservation_token, NULL, 'PENDING', 'materializer', 'feed' FROM ins
) SELECT count(*) FROM ins;
COMMIT;"
  done | "$PG_BIN/psql" -qtAX -v ON_ERROR_STOP=1 "$DB" >/dev/null
}

run() { # sessions offset
  local k=$1 off=$2 per t0 t1 c0 c1 i
  per=$((ORDERS / k))
  c0=$(pg_ticks); t0=$(date +%s.%N)
  for ((i = 0; i < k; i++)); do session "s$off-$i" $((i * per)) "$per" & done
  wait
  t1=$(date +%s.%N)
  sleep 0.5 # the postmaster reaps the finished backends (their CPU moves to its cutime)
  c1=$(pg_ticks)
  awk -v n=$((per * k)) -v a="$t0" -v b="$t1" -v c=$((c1 - c0)) -v hz="$HZ" -v k="$k" \
    'BEGIN { printf "%d session(s): %d orders in %.2f s = %.0f orders/s, Postgres CPU %.1f us/order\n", k, n, b - a, n / (b - a), c / hz * 1e6 / n }'
}

echo "postgres: fsync=$("$PG_BIN/psql" -qtAX "$DB" -c 'SHOW fsync'), $(nproc) cores, $ORDERS orders per run, $BATCH per transaction"
run 1 1
run "$SESSIONS" 2
