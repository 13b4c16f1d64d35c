#!/usr/bin/env bash
# Installs what the tests need, then runs every test. Tests that need root, loop devices,
# kernel btrfs or FUSE skip with a message when those are missing, and fail under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
# Style and lints first: a red CI for a formatting slip is cheaper than for a bug.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p oleo --features model-check --all-targets -- -D warnings
# The public API documented (docs.rs shows it), and the engine's layers importing only downward.
RUSTDOCFLAGS="-D warnings -D missing_docs" cargo doc --no-deps --workspace --exclude oleo-testkit --exclude oleo-cli
python3 scripts/layers.py
cargo build --workspace --all-targets
cargo build --release -p oleo-cli
bash scripts/fuzz.sh 15

# The benchmark harness, end to end in quick mode (no performance assertions).
bash bench/setup.sh
/usr/bin/python3 -m pytest -q bench/tests

# The Python package as a user installs it: the wheel built in a fresh venv, then its
# tests (crates/python/tests); their count joins the total below.
pylog=$(mktemp)
pystatus=0
bash crates/python/run-tests.sh 2>&1 | tee "$pylog" || pystatus=$?
# pytest -q ends with a line like "3 failed, 40 passed, 1 skipped in 52.10s".
read -r pypassed pyfailed < <(grep -E ' in [0-9.]+s' "$pylog" | tail -n 1 |
    awk '{ for (i = 1; i < NF; i++) { w = $(i + 1); sub(/,$/, "", w)
           if (w == "passed") p += $i; if (w == "failed" || w ~ /^errors?$/) f += $i } }
         END { print p + 0, f + 0 }')
if [ "$pystatus" -ne 0 ] && [ "$pyfailed" -eq 0 ]; then pyfailed=1; fi
rm -f "$pylog"

# The commit and log sync protocols under the model checker (shuttle), then everything else; the closing
# line sums every test binary's results.
log=$(mktemp)
status=$pystatus
echo "python tests: ${pypassed:-0} passed, ${pyfailed:-0} failed" >> "$log"
cargo test -p oleo --features model-check --lib -- commit_pipe log_sync::model nocow::model prealloc_fill::model 2>&1 | tee "$log" || status=$?
cargo test --workspace --all-targets --no-fail-fast -- --test-threads=2 2>&1 | tee -a "$log" || status=$?
# fstests' generic tests against the release binary's FUSE mount: fstests/generic.list on image
# files, then fstests/generic-loop.list (the tests that need a block device) on loop devices;
# skipped without root or FUSE, a failure under CI=true. The last line of each run, "fstests:
# N passed, M failed, K skipped" (K: known.txt's), counts in the total.
for devices in images loop; do
    flog=$(mktemp)
    if [ "$devices" = loop ]; then
        FSTESTS_DEVICES=loop bash scripts/fstests.sh target/release/oleo \
            $(grep -v '^#' fstests/generic-loop.list | awk '{print $1}')
    else
        bash scripts/fstests.sh target/release/oleo
    fi 2>&1 | tee "$flog" || status=$?
    tail -n 1 "$flog" | sed 's/^fstests: /fstests run: /' >> "$log"
    rm -f "$flog"
done
awk '/^test result:/ { p += $4; f += $6 }
     /^python tests: [0-9]+ passed, [0-9]+ failed/ { p += $3; f += $5 }
     /^fstests run: [0-9]+ passed, [0-9]+ failed/ { fp += $3; ff += $5 + 0 }
     END { printf "total: %d passed, %d failed\n", p + fp, f + ff }' "$log"
rm -f "$log"
exit $status
