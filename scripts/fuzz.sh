#!/usr/bin/env bash
# A short cargo-fuzz run of every target over the format layer (needs a nightly toolchain;
# without one, the stable fuzz_format test in `cargo test` runs the same entry points).
#   usage: scripts/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-20}
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: no nightly toolchain here; skipping cargo-fuzz (the stable fuzz_format test covers the same targets)"
    exit 0
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
for target in superblock tree_block items decompression; do
    log=$(mktemp)
    if cargo +nightly fuzz run -O "$target" -- -max_total_time="$secs" -rss_limit_mb=2048 >"$log" 2>&1; then
        echo "fuzz: $target: $(grep -E '^Done|#[0-9]+.*DONE' "$log" | tail -n 1)"
    else
        cat "$log"
        echo "fuzz: $target FAILED (crash input under fuzz/artifacts/$target)"
        exit 1
    fi
    rm -f "$log"
done
