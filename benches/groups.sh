#!/usr/bin/env bash
# Throughput as groups are added (docs/benchmarks.md, "Groups added, measured").
#
# G single-node groups in cluster mode (one map file, the 16384 slots split evenly), one
# sale per group on a slot that group owns, and one redis-benchmark per group sending
# RESERVE to that group's node, all G started together for N requests each. The same
# RESERVE as benches/pinned.sh: one minted admission token, unlimited stock, a random
# request id per call.
#
# Two layouts, because this machine has two cores:
#   spread  group i's node AND its load generator on CPU (i mod 2): G=1 uses one core,
#           G=2 both. Aggregate req/s of G=2 over G=1 is what adding a group with a core
#           of its own gives here (the load generator shares each core with its group).
#   shared  every node on SERVER_CPU, every load generator on LOAD_CPU: the server core
#           is fixed, so the aggregate should hold as groups are added, and the CPU per
#           request of the nodes shows whether groups cost each other anything (the
#           leader probes every 250 ms, the shared slot map).
#
# Columns: aggregate req/s = G·N ÷ the wall time from the start of the first load
# generator to the end of the last; the nodes' CPU µs per request (utime+stime of every
# node from /proc, before and after, over G·N requests); "taken" = units the G sales
# lost over G·N (below 100 %: error replies).
#
# Usage: benches/groups.sh            (from anywhere)
# Env:   STOCKGATE_BIN (default target/release/stockgate)  N=200000  GROUP_COUNTS="1 2 3"
#        LAYOUTS="spread shared"  POINTS="50:1 50:16"  SERVER_CPU=1 LOAD_CPU=0
#        OUT=file (also write the table there)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SG_BIN=${STOCKGATE_BIN:-$ROOT/target/release/stockgate}
N=${N:-200000}
GROUP_COUNTS=${GROUP_COUNTS:-"1 2 3"}
LAYOUTS=${LAYOUTS:-"spread shared"}
POINTS=${POINTS:-"50:1 50:16"}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
UNITS=1000000000000
HZ=$(getconf CLK_TCK)

for tool in redis-cli redis-benchmark timeout taskset; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
[[ -x $SG_BIN ]] || { echo "no $SG_BIN: cargo build --release -p stockgate-server --bin stockgate" >&2; exit 2; }

TMP=$(mktemp -d /tmp/sg-groups.XXXXXX)
PIDS=()
stop() { # pid
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}
cleanup() {
  for pid in "${PIDS[@]}"; do stop "$pid"; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nobody listens on, outside the ephemeral range the load generators use.
free_port() { # [ports not to return...]
  local p lo hi used
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { lo=32768; hi=60999; }
  used=" $(ss -Htan 2>/dev/null | awk '{ n = split($4, a, ":"); print a[n] }' | sort -u | tr '\n' ' ') $* "
  for _ in $(seq 1 100); do
    if (( lo > 11000 )); then p=$((10000 + RANDOM % (lo - 10000))); else p=$((hi + 1 + RANDOM % (65535 - hi))); fi
    [[ $used == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2; return 1
}

cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

server_cpu_of() { # layout group-index -> the CPU its node runs on
  if [[ $1 == spread ]]; then echo $(($2 % 2)); else echo "$SERVER_CPU"; fi
}
load_cpu_of() { # layout group-index -> the CPU its load generator runs on
  if [[ $1 == spread ]]; then echo $(($2 % 2)); else echo "$LOAD_CPU"; fi
}

# Starts G nodes on one map; sets PORTS, SPIDS (the node processes), SKUS, TOKENS.
PORTS=() SPIDS=() SKUS=() TOKENS=() WPIDS=()
start_groups() { # layout G dir
  local layout=$1 g=$2 d=$3 i lo hi map picked=()
  PORTS=() SPIDS=() SKUS=() TOKENS=() WPIDS=()
  mkdir -p "$d"
  map=$d/cluster.map
  : >"$map"
  for ((i = 0; i < g; i++)); do
    PORTS[i]=$(free_port "${picked[@]}"); picked+=("${PORTS[i]}")
    lo=$((i * 16384 / g)); hi=$(((i + 1) * 16384 / g - 1))
    printf 'group g%d %d-%d\nnode %040x 127.0.0.1:%s\n' "$i" "$lo" "$hi" $((i + 1)) "${PORTS[i]}" >>"$map"
  done
  for ((i = 0; i < g; i++)); do
    taskset -c "$(server_cpu_of "$layout" "$i")" timeout 3600 "$SG_BIN" --bind 127.0.0.1 \
      --port "${PORTS[i]}" --data-dir "$d/n$i" --fsync everysec --threads 1 \
      --cluster-enabled yes --cluster-config "$map" >"$d/n$i.out" 2>"$d/n$i.err" &
    WPIDS[i]=$!; PIDS+=("${WPIDS[i]}")
  done
  for ((i = 0; i < g; i++)); do
    local up=
    for _ in $(seq 1 150); do
      timeout 2 redis-cli -p "${PORTS[i]}" PING 2>/dev/null | grep -q PONG && { up=1; break; }
      sleep 0.1
    done
    [[ -n $up ]] || { cat "$d/n$i.err" >&2; echo "node $i did not start" >&2; exit 1; }
    SPIDS[i]=$(pgrep -P "${WPIDS[i]}" | head -n 1)
    lo=$((i * 16384 / g)); hi=$(((i + 1) * 16384 / g - 1))
    local k slot sku=
    for k in $(seq 0 500); do
      slot=$(timeout 2 redis-cli -p "${PORTS[i]}" CLUSTER KEYSLOT "BENCH-$k")
      if ((slot >= lo && slot <= hi)); then sku=BENCH-$k; break; fi
    done
    [[ -n $sku ]] || { echo "no sku found for group $i" >&2; exit 1; }
    SKUS[i]=$sku
    [[ $(timeout 10 redis-cli -p "${PORTS[i]}" SALE.CREATE "$sku" "$UNITS") == OK ]] ||
      { echo "SALE.CREATE failed on group $i" >&2; exit 1; }
    TOKENS[i]=$(timeout 10 "$SG_BIN" mint-token --data-dir "$d/n$i" --sku "$sku" --user bench-user --ttl-ms 86400000)
    local check
    check=$(timeout 10 redis-cli -p "${PORTS[i]}" RESERVE "$sku" bench-user "${TOKENS[i]}" check-1 | head -n 1)
    [[ $check == RESERVED ]] || { echo "RESERVE check failed on group $i: $check" >&2; exit 1; }
  done
}

stock_sum() { # G -> the stock left over every group's sale
  local i sum=0
  for ((i = 0; i < $1; i++)); do
    sum=$((sum + $(timeout 10 redis-cli -p "${PORTS[i]}" STOCK "${SKUS[i]}" | head -n 1)))
  done
  echo "$sum"
}

cpu_sum() { # G
  local i sum=0
  for ((i = 0; i < $1; i++)); do sum=$((sum + $(cpu_ticks "${SPIDS[i]}"))); done
  echo "$sum"
}

# One point: G load generators at once; prints "aggregate_rps cpu_us_per_req taken".
point() { # layout G clients pipeline
  local layout=$1 g=$2 c=$3 p=$4 i t0 t1 c0 c1 s0 s1 lpids=()
  s0=$(stock_sum "$g"); c0=$(cpu_sum "$g")
  t0=$(date +%s.%N)
  for ((i = 0; i < g; i++)); do
    timeout 600 taskset -c "$(load_cpu_of "$layout" "$i")" redis-benchmark -h 127.0.0.1 -p "${PORTS[i]}" \
      -c "$c" -n "$N" -P "$p" -r 1000000000 \
      RESERVE "${SKUS[i]}" bench-user "${TOKENS[i]}" "req-__rand_int__" >"$TMP/lg$i.out" 2>&1 &
    lpids+=($!)
  done
  for pid in "${lpids[@]}"; do wait "$pid" || echo "warning: a load generator failed" >&2; done
  t1=$(date +%s.%N)
  c1=$(cpu_sum "$g"); s1=$(stock_sum "$g")
  awk -v g="$g" -v n="$N" -v t0="$t0" -v t1="$t1" -v d=$((c1 - c0)) -v hz="$HZ" -v a="$s0" -v b="$s1" \
    'BEGIN { printf "%.0f %.2f %.1f%%\n", g * n / (t1 - t0), d / hz * 1e6 / (g * n), (a - b) / (g * n) * 100 }'
}

declare -A RES
for layout in $LAYOUTS; do
  for g in $GROUP_COUNTS; do
    start_groups "$layout" "$g" "$TMP/$layout-$g"
    for pt in $POINTS; do
      RES[$layout,$g,$pt]=$(point "$layout" "$g" "${pt%%:*}" "${pt##*:}")
      echo "$layout G=$g C/P=$pt: ${RES[$layout,$g,$pt]}" >&2
    done
    for pid in "${WPIDS[@]}"; do stop "$pid"; done
  done
done

{
  echo "benches/groups.sh: $N requests per group per point; spread: group i and its load generator on CPU i mod 2; shared: nodes on CPU $SERVER_CPU, load generators on CPU $LOAD_CPU"
  echo "($(nproc) cores, stockgate $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ))"
  echo
  printf '| %-7s | %6s | %-6s | %14s | %10s | %13s | %6s |\n' layout groups "C/P" "aggregate req/s" "vs 1 group" "CPU µs/req" taken
  printf '|%s|%s|%s|%s|%s|%s|%s|\n' "---------" "-------:" "--------" "----------------:" "-----------:" "-------------:" "-------:"
  for layout in $LAYOUTS; do
    for pt in $POINTS; do
      for g in $GROUP_COUNTS; do
        read -r rps cpu taken <<<"${RES[$layout,$g,$pt]}"
        read -r base _ <<<"${RES[$layout,1,$pt]:-0 0}"
        ratio=$(awk -v a="$rps" -v b="$base" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
        printf '| %-7s | %6s | %-6s | %15.0f | %10s | %13s | %6s |\n' "$layout" "$g" "${pt/:/\/}" "$rps" "$ratio" "$cpu" "$taken"
      done
    done
  done
} | tee "${OUT:-/dev/null}"
