#!/usr/bin/env bash
# Deterministic simulation of a replicated group (docs/simulation.md):
#   scripts/simulate.sh SEED [COUNT] [--verbose]
# prints one line per seed, `seed <n> digest <hex> PASS|FAIL <what>`; the same seed gives
# the same digest on any machine. Exits 1 if any seed failed (its data dirs are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: scripts/simulate.sh SEED [COUNT] [--verbose]" >&2
    exit 2
fi
cargo build --quiet -p stockgate-sim --bin stockgate-sim
exec target/debug/stockgate-sim "$@"
