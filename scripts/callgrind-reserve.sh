#!/usr/bin/env bash
# Instructions per RESERVE, measured by valgrind's callgrind: a figure that does not move
# with the machine's load (CPU time here moves ±20 % between runs), for before/after
# comparisons of the request path.
#
#   scripts/callgrind-reserve.sh [BIN] [N] [P] [WHAT]
#     BIN  stockgate binary (default target/release/stockgate)
#     N    requests (default 100000), P pipeline depth (default 16), 50 clients
#     WHAT reserve (default); room-join: ROOM.JOIN of a new random user per request into
#          the sale's waiting room (opened with RATE 1); room-status: ROOM.STATUS of one
#          waiting buyer's ticket with 1,000 buyers ahead (benches/pinned.sh's room targets)
#   KEEP=1 keeps the callgrind output file for callgrind_annotate.
#
# Prints the instructions per request in total and without SHA-256: valgrind does not
# emulate SHA-NI, so the server falls back to sha2's portable code, whose count says
# nothing about the real (hardware) cost; the rest is comparable between builds.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
BIN=${1:-$ROOT/target/release/stockgate}
N=${2:-100000}
P=${3:-16}
WHAT=${4:-reserve}
for tool in valgrind callgrind_annotate redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
D=$(mktemp -d /tmp/sg-callgrind.XXXXXX)
VP=
# KEEP=1 keeps the callgrind output (for callgrind_annotate) and says where.
cleanup() {
  [[ -n $VP ]] && kill -TERM "$VP" 2>/dev/null
  wait 2>/dev/null || true
  if [[ -n ${KEEP:-} ]]; then echo "callgrind output: $D/cg.out" >&2; else rm -rf "$D"; fi
}
trap cleanup EXIT
valgrind --tool=callgrind --callgrind-out-file="$D/cg.out" "$BIN" --bind 127.0.0.1 --port 0 \
  --data-dir "$D/data" --fsync everysec --threads 1 >"$D/out" 2>"$D/err" &
VP=$!
PORT=$(listening_port "$D/out" "$D/err")
timeout 30 redis-cli -p "$PORT" SALE.CREATE BENCH 1000000000000 >/dev/null
TOKEN=$(timeout 30 "$BIN" mint-token --data-dir "$D/data" --sku BENCH --user bench-user --ttl-ms 86400000)
CMD=(RESERVE BENCH bench-user "$TOKEN" 'req-__rand_int__')
if [[ $WHAT == room-* ]]; then
  [[ $(timeout 30 redis-cli -p "$PORT" ROOM.OPEN BENCH RATE 1 MAX 50000000) == OK ]] || { echo "ROOM.OPEN failed" >&2; exit 1; }
  CMD=(ROOM.JOIN BENCH 'u__rand_int__')
  if [[ $WHAT == room-status ]]; then
    for i in $(seq 1 1000); do echo "ROOM.JOIN BENCH ahead-$i"; done | timeout 300 redis-cli -p "$PORT" >/dev/null
    TICKET=$(timeout 30 redis-cli -p "$PORT" ROOM.JOIN BENCH bench-user | head -n 1)
    CMD=(ROOM.STATUS BENCH bench-user "$TICKET")
  fi
elif [[ $WHAT != reserve ]]; then
  echo "WHAT is reserve, room-join or room-status" >&2; exit 2
fi
timeout 1800 redis-benchmark -p "$PORT" -c 50 -n "$N" -P "$P" -r 1000000000 "${CMD[@]}" >/dev/null 2>&1
# What the run did, from the server (a refused command costs less and would flatter it).
case $WHAT in
  reserve) echo "stock after: $(timeout 30 redis-cli -p "$PORT" STOCK BENCH)" ;;
  *) timeout 30 redis-cli -p "$PORT" ROOM.INFO BENCH | paste - - | grep -E "^(waiting|admitted)" | tr '\n' ' '; echo ;;
esac
kill -TERM "$VP"; wait "$VP" || true; VP=
callgrind_annotate --auto=no --threshold=100 "$D/cg.out" 2>/dev/null | awk -v n="$N" -v what="${CMD[0]}" '
  /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
  (/sha2::sha256/ || /sha2-[0-9.]*\/src\/sha256\//) && !/PROGRAM/ { v = $1; gsub(",", "", v); sha += v }
  END { printf "instructions per %s: %d total, %d outside SHA-256 (N=%d)\n", what, total / n, (total - sha) / n, n }'
