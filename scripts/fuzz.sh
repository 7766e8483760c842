#!/usr/bin/env bash
# Runs one cargo-fuzz (libFuzzer) target for a given time and prints libFuzzer's final
# stats: `scripts/fuzz.sh TARGET SECONDS [extra libFuzzer flags...]`.
# `scripts/fuzz.sh all SECONDS` runs every target for SECONDS each, one after the other,
# from one build without a sanitizer (what scripts/test-all.sh runs in CI), and fails if
# any target found something.
#
# Targets (fuzz/README.md): resp_frame, admission_token, wal_record, raft_frame,
# stream_commands. On a shared machine: `nice -n 19 scripts/fuzz.sh resp_frame 600`.
#
# Toolchain. The script needs only the stable toolchain CI uses (some machines also have
# a nightly; it is not used). What works (cargo-fuzz 0.13.2, rustc 1.95): the coverage instrumentation cargo-fuzz asks
# for (`-Cpasses=sancov-module`, `-Cllvm-args=-sanitizer-coverage-...`, `--cfg fuzzing`)
# is stable, so `--sanitizer none` builds on plain stable. `--sanitizer address` makes
# cargo-fuzz pass `-Zsanitizer=address`, which stable rustc accepts only with
# RUSTC_BOOTSTRAP=1; stable's rust-std ships the ASan runtime
# (librustc-stable_rt.asan.a), so ASan then works as on nightly. The script always sets
# RUSTC_BOOTSTRAP=1 (changing it between builds would make cargo rebuild everything).
# Not usable here: `--sanitizer memory` and `--build-std` (need the rust-src component).
#
# Sanitizer: SANITIZER=address|none overrides the per-target default. wal_record,
# admission_token and raft_frame run under ASan (decoders sizing buffers from untrusted
# lengths are what it and -malloc_limit_mb catch at the malloc call). resp_frame runs without: it
# builds three engines per input, and ASan's quarantine and large-chunk mmaps make it
# ~11x slower (736 vs 8334 exec/s measured here) for code that is safe Rust; an
# unbounded allocation there is still caught by -rss_limit_mb (or aborts the process).
# stream_commands neither: it opens a WAL per input (files, a writer thread), so it runs
# at a few hundred inputs a second and its cost is the file system, not the checks.
#
# Builds are `--release --debug-assertions`: the engine's debug_assert!s (shard counters
# never negative, reserved never underflows, ...) and integer overflow checks are on.
#
# Limits: -max_len bounds an input; -rss_limit_mb=2048 and -malloc_limit_mb=2048 make an
# unbounded allocation a finding (libFuzzer writes it to fuzz/artifacts/TARGET/ and exits
# non-zero, as for a panic). The corpus grows in fuzz/corpus/TARGET/ (only seed-* files
# are committed); logs go to fuzz/logs/.
#
# A crash: minimize it with
#   RUSTC_BOOTSTRAP=1 cargo fuzz tmin TARGET fuzz/artifacts/TARGET/crash-... (from fuzz/)
# and keep the result in fuzz/regressions/TARGET/ (replayed by `cargo test`).
set -euo pipefail

targets="resp_frame admission_token wal_record raft_frame stream_commands"
usage() {
    echo "usage: $0 TARGET|all SECONDS [libFuzzer flags...]" >&2
    echo "targets: $targets" >&2
    exit 2
}
[ $# -ge 2 ] || usage
target=$1
secs=$2
shift 2
[[ "$secs" =~ ^[0-9]+$ ]] || usage

# Per target: the longest input and the sanitizer it runs under by default.
settings() {
    case "$1" in
    resp_frame) max_len=4096 default_sanitizer=none ;;
    admission_token) max_len=2048 default_sanitizer=address ;;
    wal_record) max_len=4096 default_sanitizer=address ;;
    raft_frame) max_len=8192 default_sanitizer=address ;;
    stream_commands) max_len=4096 default_sanitizer=none ;;
    *) usage ;;
    esac
}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version 0.13.2 --locked
fi
export RUSTC_BOOTSTRAP=1
mkdir -p logs

# One run of one target, already built with $sanitizer; returns libFuzzer's status.
run() {
    local t=$1 log
    settings "$t"
    mkdir -p "corpus/$t" "artifacts/$t"
    log="logs/$t-$(date +%Y%m%d-%H%M%S).log"
    echo "fuzzing $t for ${secs}s (sanitizer $sanitizer, max_len $max_len); log: fuzz/$log"
    # libFuzzer halts on the first crash, leak, timeout or over-limit allocation.
    # (ASan's leak detector is off: the engine keeps process-wide statics, OnceLock keys.)
    local status=0
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} \
        cargo fuzz run "$t" --release --debug-assertions --sanitizer "$sanitizer" \
        "corpus/$t" -- \
        -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -timeout=10 -print_final_stats=1 -print_pcs=0 "${extra[@]}" >"$log" 2>&1 || status=$?

    echo "--- final libFuzzer lines (fuzz/$log) ---"
    grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|REDUCE|NEW)' "$log" | tail -n 1 || true
    grep -E '^(Done [0-9]+ runs|stat::|INFO: (Loaded|seed corpus))' "$log" || true
    grep -E -A 30 '(panicked at|ERROR: libFuzzer|==ERROR|SUMMARY:|Test unit written)' "$log" | head -n 60 || true
    echo "corpus: $(find "corpus/$t" -type f | wc -l) files in fuzz/corpus/$t"
    echo "exit status: $status"
    return "$status"
}

extra=("$@")
if [ "$target" = all ]; then
    # One build for every target: no sanitizer unless SANITIZER says otherwise.
    sanitizer=${SANITIZER:-none}
    cargo fuzz build --release --debug-assertions --sanitizer "$sanitizer" 2>&1 | tail -n 3
    failed=()
    for t in $targets; do
        run "$t" || failed+=("$t")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "fuzzing found something in: ${failed[*]} (reproducers in fuzz/artifacts/)" >&2
        exit 1
    fi
    exit 0
fi

settings "$target"
sanitizer=${SANITIZER:-$default_sanitizer}
cargo fuzz build "$target" --release --debug-assertions --sanitizer "$sanitizer" 2>&1 | tail -n 3
run "$target"
